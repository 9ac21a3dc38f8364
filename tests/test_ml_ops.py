"""ai.onnx.ml ops node by node against onnxruntime: every tree-ensemble version (aggregates,
post transforms, base values, missing-value tracks, BRANCH_* modes and v5's member sets, int and string
labels, onnxruntime's binary case), linear and SVM predictors, the feature transformers, ZipMap."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.ml_util import ML, check, ml_model, ort_run

F, I64, S = TensorProto.FLOAT, TensorProto.INT64, TensorProto.STRING
X = np.array([[0.2, -3.0, 1.0], [0.9, 0.0, -1.0], [np.nan, -2.0, 0.5], [0.5, 1.0, np.nan], [-1.0, 2.0, 3.0]],
             np.float32)

# Two trees over 3 features: tree 0 splits feature 0 then feature 2, tree 1 splits feature 1.
NODES = dict(nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2],
             nodes_featureids=[0, 2, 0, 0, 0, 1, 0, 0], nodes_values=[0.5, 0.7, 0, 0, 0, -1.0, 0, 0],
             nodes_truenodeids=[1, 3, 0, 0, 0, 1, 0, 0], nodes_falsenodeids=[2, 4, 0, 0, 0, 2, 0, 0],
             nodes_missing_value_tracks_true=[1, 0, 0, 0, 0, 0, 0, 0])
LEAVES = [(0, 2), (0, 3), (0, 4), (1, 1), (1, 2)]  # (tree, node)


def _modes(split0: str = "BRANCH_LEQ", split1: str = "BRANCH_LT") -> list[str]:
    return [split0, "BRANCH_GTE", "LEAF", "LEAF", "LEAF", split1, "LEAF", "LEAF"]


@pytest.mark.parametrize("aggregate,transform,base", [
    ("SUM", "NONE", None), ("SUM", "LOGISTIC", [0.5, -1.0]), ("AVERAGE", "SOFTMAX", [1.0, 2.0]),
    ("MIN", "NONE", [0.5, -1.0]), ("MAX", "SOFTMAX_ZERO", None), ("AVERAGE", "NONE", [0.5, -1.0])])
def test_tree_ensemble_regressor(aggregate, transform, base):
    weights = dict(target_treeids=[t for t, _ in LEAVES] + [0], target_nodeids=[n for _, n in LEAVES] + [3],
                   target_ids=[0, 1, 0, 1, 0, 0], target_weights=[1.5, -2.0, 0.25, 3.0, -0.5, 0.75])
    extra = {"base_values": base} if base else {}
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain=ML, nodes_modes=_modes(), **NODES,
                            **weights, n_targets=2, aggregate_function=aggregate, post_transform=transform, **extra)
    check(ml_model([node], {"x": (F, [5, 3])}, {"y": (F, [5, 2])}, ml_opset=1), {"x": X})


@pytest.mark.parametrize("modes", [("BRANCH_LT", "BRANCH_GT"), ("BRANCH_GTE", "BRANCH_LEQ"),
                                   ("BRANCH_EQ", "BRANCH_NEQ")])
def test_tree_ensemble_branch_modes_on_doubles(modes):
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain=ML, nodes_modes=_modes(*modes),
                            **NODES, target_treeids=[t for t, _ in LEAVES], target_nodeids=[n for _, n in LEAVES],
                            target_ids=[0] * 5, target_weights=[1.0, 2.0, 4.0, 8.0, 16.0], n_targets=1)
    x = np.array([[0.5, -1.0, 0.7], [0.4, -1.5, 0.8], [0.6, 0.0, 0.6]], np.float64)
    check(ml_model([node], {"x": (TensorProto.DOUBLE, [3, 3])}, {"y": (F, [3, 1])}), {"x": x})


@pytest.mark.parametrize("transform,labels", [("NONE", "ints"), ("SOFTMAX_ZERO", "strings"), ("LOGISTIC", "ints"),
                                              ("PROBIT", "strings")])
def test_tree_ensemble_classifier_three_classes(transform, labels):
    weights = dict(class_treeids=[t for t, _ in LEAVES], class_nodeids=[n for _, n in LEAVES],
                   class_ids=[0, 1, 2, 2, 0], class_weights=[0.5, 0.2, 0.3, 0.4, 0.1])
    names = {"classlabels_int64s": [4, 7, 9]} if labels == "ints" else {"classlabels_strings": ["a", "b", "東京"]}
    node = helper.make_node("TreeEnsembleClassifier", ["x"], ["label", "scores"], domain=ML, nodes_modes=_modes(),
                            **NODES, **weights, **names, post_transform=transform, base_values=[0.0, 0.1, 0.0])
    model = ml_model([node], {"x": (F, [5, 3])}, {"label": (I64 if labels == "ints" else S, [5]),
                                                  "scores": (F, [5, 3])})
    check(model, {"x": X}, rtol=1e-5 if transform != "PROBIT" else 1e-4)


@pytest.mark.parametrize("weights,transform", [([0.5, -1.0, 2.0, -0.25, 0.75], "LOGISTIC"),
                                               ([0.5, -1.0, 2.0, -0.25, 0.75], "NONE"),
                                               ([0.5, 0.1, 0.2, 0.25, 0.75], "NONE"),
                                               ([0.5, 0.1, 0.2, 0.25, 0.75], "LOGISTIC"),
                                               ([0.5, -1.0, 2.0, -0.25, 0.75], "SOFTMAX")])
def test_tree_ensemble_classifier_binary_case(weights, transform):
    """Weights for one of two classes: onnxruntime's "binary case" (gradient boosting's export)."""
    node = helper.make_node("TreeEnsembleClassifier", ["x"], ["label", "scores"], domain=ML, nodes_modes=_modes(),
                            **NODES, class_treeids=[t for t, _ in LEAVES], class_nodeids=[n for _, n in LEAVES],
                            class_ids=[0] * 5, class_weights=weights, classlabels_int64s=[0, 1],
                            post_transform=transform, base_values=[-0.2])
    check(ml_model([node], {"x": (F, [5, 3])}, {"label": (I64, [5]), "scores": (F, [5, 2])}), {"x": X})


@pytest.mark.parametrize("weights,transform,base", [([0.5, -1.0, 2.0, -0.25, 0.75], "NONE", None),
                                                    ([0.5, -1.0, 2.0, -0.25, 0.75], "LOGISTIC", [-0.2]),
                                                    ([0.5, 0.1, 0.2, 0.25, 0.75], "NONE", [-0.2]),
                                                    ([0.5, 0.1, 0.2, 0.25, 0.75], "SOFTMAX", None),
                                                    ([0.5, -1.0, 2.0, -0.25, 0.75], "SOFTMAX_ZERO", None)])
def test_tree_ensemble_classifier_binary_case_weights_on_class_1(weights, transform, base):
    """Only class 1 has weights: class 0 scores 0, base_values are ignored, the threshold is 0.5 for
    non-negative weights (rows 0 and 2 score 0.35 and 0.45 there: label 0) and 0 otherwise."""
    extra = {"base_values": base} if base else {}
    node = helper.make_node("TreeEnsembleClassifier", ["x"], ["label", "scores"], domain=ML, nodes_modes=_modes(),
                            **NODES, class_treeids=[t for t, _ in LEAVES], class_nodeids=[n for _, n in LEAVES],
                            class_ids=[1] * 5, class_weights=weights, classlabels_int64s=[3, 8],
                            post_transform=transform, **extra)
    check(ml_model([node], {"x": (F, [5, 3])}, {"label": (I64, [5]), "scores": (F, [5, 2])}), {"x": X})


@pytest.mark.parametrize("aggregate,transform", [(1, 0), (0, 2), (2, 1), (3, 0)])
def test_tree_ensemble_v5_with_member_sets(aggregate, transform):
    """TreeEnsemble (ai.onnx.ml 5): node 0 tests membership of feature 1 in {-3, 0, 2}."""
    splits = helper.make_tensor("s", F, [3], [0.0, 0.5, 0.7])
    node = helper.make_node(
        "TreeEnsemble", ["x"], ["y"], domain=ML, n_targets=2, aggregate_function=aggregate,
        post_transform=transform, tree_roots=[0, 2],
        nodes_modes=helper.make_tensor("m", TensorProto.UINT8, [3], [6, 0, 3]), nodes_featureids=[1, 0, 2],
        nodes_splits=splits, nodes_truenodeids=[1, 0, 2], nodes_trueleafs=[0, 1, 1], nodes_falsenodeids=[1, 1, 3],
        nodes_falseleafs=[1, 1, 1], nodes_missing_value_tracks_true=[0, 1, 0],
        membership_values=helper.make_tensor("v", F, [4], [-3.0, 0.0, 2.0, np.nan]),
        leaf_targetids=[0, 1, 0, 1], leaf_weights=helper.make_tensor("w", F, [4], [1.0, -2.0, 0.5, 3.0]))
    check(ml_model([node], {"x": (F, [5, 3])}, {"y": (F, [5, 2])}, ml_opset=5, opset=21), {"x": X})


def _xy(rows: int = 4, cols: int = 3) -> np.ndarray:
    return np.random.default_rng(3).normal(size=(rows, cols)).astype(np.float32)


@pytest.mark.parametrize("rows,labels,transform", [(3, [1, 2, 3], "SOFTMAX"), (1, [0, 1], "LOGISTIC"),
                                                   (3, [5, 6, 7], "NONE")])
def test_linear_classifier(rows, labels, transform):
    coefficients = np.linspace(-1, 1, rows * 3).tolist()
    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain=ML, coefficients=coefficients,
                            intercepts=np.linspace(0.1, 0.3, rows).tolist(), classlabels_ints=labels,
                            post_transform=transform)
    check(ml_model([node], {"x": (F, [4, 3])}, {"label": (I64, [4]), "scores": (F, [4, len(labels)])}),
          {"x": _xy()})


def test_linear_regressor_two_targets():
    node = helper.make_node("LinearRegressor", ["x"], ["y"], domain=ML, coefficients=[0.5, -1, 2, 1, 1, -0.5],
                            intercepts=[0.25, -1.0], targets=2)
    check(ml_model([node], {"x": (F, [4, 3])}, {"y": (F, [4, 2])}), {"x": _xy()})


SV = np.array([[0.1, -0.2, 0.3], [1.0, 0.5, -0.5], [-1.0, 0.2, 0.8], [0.4, 0.4, 0.4]], np.float32)


@pytest.mark.parametrize("kernel", ["LINEAR", "POLY", "RBF", "SIGMOID"])
def test_svm_regressor_kernels(kernel):
    node = helper.make_node("SVMRegressor", ["x"], ["y"], domain=ML, kernel_type=kernel,
                            kernel_params=[0.3, 0.5, 3.0], support_vectors=SV.reshape(-1).tolist(), n_supports=4,
                            coefficients=[0.5, -1.0, 0.25, 2.0], rho=[0.1])
    check(ml_model([node], {"x": (F, [4, 3])}, {"y": (F, [4, 1])}), {"x": _xy()}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", ["RBF", "POLY"])
def test_svm_classifier_votes_three_classes(kernel):
    """One-vs-one decision values and votes, no probabilities: the scores are the decision values."""
    node = helper.make_node("SVMClassifier", ["x"], ["label", "scores"], domain=ML, kernel_type=kernel,
                            kernel_params=[0.5, 0.1, 2.0], support_vectors=SV.reshape(-1).tolist(),
                            vectors_per_class=[1, 2, 1], coefficients=[0.5, -1.0, 0.25, 2.0, -0.5, 1.0, 0.3, -0.2],
                            rho=[0.1, -0.2, 0.05], classlabels_strings=["x", "y", "z"])
    check(ml_model([node], {"x": (F, [4, 3])}, {"label": (S, [4]), "scores": (F, [4, 3])}), {"x": _xy()},
          rtol=1e-5, atol=1e-5)


def test_svm_classifier_linear_mode():
    node = helper.make_node("SVMClassifier", ["x"], ["label", "scores"], domain=ML, kernel_type="LINEAR",
                            kernel_params=[0.0, 0.0, 0.0], coefficients=np.linspace(-1, 1, 9).tolist(), rho=[0.2],
                            classlabels_ints=[0, 1, 2])
    check(ml_model([node], {"x": (F, [4, 3])}, {"label": (I64, [4]), "scores": (F, [4, 3])}), {"x": _xy()})


def test_feature_transformers_in_a_chain():
    """Imputer (NaN) -> Scaler -> Normalizer (L2); Binarizer; FeatureVectorizer of two inputs, one cut
    and one as is; ArrayFeatureExtractor."""
    x = X.copy()
    nodes = [helper.make_node("Imputer", ["x"], ["i"], domain=ML, imputed_value_floats=[9.0, 8.0, 7.0],
                              replaced_value_float=float("nan")),
             helper.make_node("Scaler", ["i"], ["s"], domain=ML, offset=[0.5, -1.0, 0.0], scale=[2.0, 0.5, 1.0]),
             helper.make_node("Normalizer", ["s"], ["n2"], domain=ML, norm="L2"),
             helper.make_node("Normalizer", ["s"], ["n1"], domain=ML, norm="L1"),
             helper.make_node("Normalizer", ["s"], ["nm"], domain=ML, norm="MAX"),
             helper.make_node("Binarizer", ["s"], ["b"], domain=ML, threshold=0.5),
             helper.make_node("FeatureVectorizer", ["s", "b"], ["fv"], domain=ML, inputdimensions=[2, 3]),
             helper.make_node("ArrayFeatureExtractor", ["s", "cols"], ["afe"], domain=ML)]
    model = ml_model(nodes, {"x": (F, [5, 3]), "cols": (I64, [2])},
                     {"n2": (F, [5, 3]), "n1": (F, [5, 3]), "nm": (F, [5, 3]), "b": (F, [5, 3]), "fv": (F, [5, 5]),
                      "afe": (F, [5, 2])})
    check(model, {"x": x, "cols": np.array([2, 0], np.int64)})


def test_one_hot_encoder_category_mapper_label_encoder_and_zipmap():
    """Strings and ints both ways; an unknown string gets the default; ZipMap with int keys."""
    nodes = [helper.make_node("OneHotEncoder", ["s"], ["oh"], domain=ML, cats_strings=["red", "東京", ""]),
             helper.make_node("OneHotEncoder", ["i"], ["ohi"], domain=ML, cats_int64s=[3, 1, 4]),
             helper.make_node("CategoryMapper", ["s"], ["codes"], domain=ML, cats_strings=["red", "東京"],
                              cats_int64s=[10, 20], default_int64=-7),
             helper.make_node("CategoryMapper", ["i"], ["names"], domain=ML, cats_strings=["three", "one"],
                              cats_int64s=[3, 1], default_string="none"),
             helper.make_node("LabelEncoder", ["i"], ["le"], domain=ML, keys_int64s=[1, 4],
                              values_strings=["uno", "quattro"], default_string="?"),
             helper.make_node("ZipMap", ["p"], ["zm"], domain=ML, classlabels_int64s=[10, 20])]
    model = ml_model(nodes, {"s": (S, [2, 3]), "i": (I64, [2, 3]), "p": (F, [3, 2])},
                     {"oh": (F, [2, 3, 3]), "ohi": (F, [2, 3, 3]), "codes": (I64, [2, 3]), "names": (S, [2, 3]),
                      "le": (S, [2, 3])}, ml_opset=2)
    model.graph.output.append(helper.make_value_info("zm", helper.make_sequence_type_proto(
        helper.make_map_type_proto(I64, helper.make_tensor_type_proto(F, [])))))
    feeds = {"s": np.array([["red", "mauve", ""], ["東京", "red", "x"]]),
             "i": np.array([[3, 1, 0], [4, 4, 3]], np.int64), "p": np.array([[0.25, 0.75], [1, 0], [0.5, 0.5]],
                                                                           np.float32)}
    check(model, feeds)


@pytest.mark.parametrize("kind", ["strings", "ints"])
def test_one_hot_encoder_zeros_0_refuses_an_unknown_category_of_an_input_as_onnxruntime_does(kind):
    """zeros=0: onnxruntime fails the run on a value that is no category; svodrt refuses the call at the
    edge (a check step of the string program) when the encoder reads an input directly."""
    import svodc
    import svodrt

    cats = {"cats_strings": ["red", "東京"]} if kind == "strings" else {"cats_int64s": [3, 1]}
    node = helper.make_node("OneHotEncoder", ["x"], ["oh"], domain=ML, zeros=0, **cats)
    model = ml_model([node], {"x": (S if kind == "strings" else I64, [3])}, {"oh": (F, [3, 2])})
    good, bad = ((np.array(["red", "東京", "red"]), np.array(["red", "mauve", "東京"])) if kind == "strings"
                 else (np.array([3, 1, 1], np.int64), np.array([3, 2, 1], np.int64)))
    check(model, {"x": good})
    with pytest.raises(Exception, match="Unknown Category and zeros = 0"):
        ort_run(model, {"x": bad})
    with svodrt.load(svodc.compile(model), threads=1) as m, pytest.raises(svodrt.InputError, match="none of its 2"):
        m.run({"x": bad})


def test_one_hot_encoder_check_applies_on_every_run_path():
    """The check runs before native code whatever path the call takes (InferenceSession with out=
    arrays skips nothing: the fast input path is off for bundles with a string program)."""
    import svodc
    import svodrt

    node = helper.make_node("OneHotEncoder", ["x"], ["oh"], domain=ML, zeros=0, cats_int64s=[3, 1])
    model = ml_model([node], {"x": (I64, [3])}, {"oh": (F, [3, 2])})
    bad = np.array([3, 2, 1], np.int64)
    with svodrt.InferenceSession(svodc.compile(model)) as s, pytest.raises(svodrt.InputError, match="none of its 2"):
        s.run(None, {"x": bad}, out=[np.empty((3, 2), np.float32)])
