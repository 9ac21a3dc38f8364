"""Models people ship, made with scikit-learn and exported with sklearn-onnx, against onnxruntime:
forests, gradient boosting, an RBF SVC with probabilities, a pipeline with a scaler and a one-hot
encoder; integer and string labels, with and without ZipMap. Small (at most 30 trees, depth <= 6)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tests.ml_util import check

pytest.importorskip("skl2onnx", reason="sklearn-onnx (the dev extra) exports the models")
from skl2onnx import to_onnx
from skl2onnx.common.data_types import StringTensorType
from sklearn.compose import ColumnTransformer
from sklearn.datasets import make_classification, make_regression
from sklearn.ensemble import (
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from sklearn.svm import SVC

OPSETS = {"": 17, "ai.onnx.ml": 3}


def _data(classes: int = 3, n: int = 120, string_labels: bool = False):
    x, y = make_classification(n, 6, n_informative=4, n_classes=classes, random_state=0)
    x = x.astype(np.float32)
    x[3, 2] = np.nan  # a missing value: the trees' missing-value tracks
    return x, (np.array(["ant", "bee", "cat", "dog"])[y] if string_labels else y)


def _export(model, x, zipmap: bool = True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_onnx(model, x[:1], target_opset=OPSETS, options=None if zipmap else {"zipmap": False})


@pytest.mark.parametrize("string_labels,zipmap", [(False, True), (True, True),
                                                  pytest.param(True, False, marks=pytest.mark.ml_slow)])
def test_random_forest_classifier(string_labels, zipmap):
    x, y = _data(string_labels=string_labels)
    x = np.nan_to_num(x)  # sklearn's forests take NaN only in recent versions; keep the test portable
    model = RandomForestClassifier(20, max_depth=6, random_state=0).fit(x, y)
    check(_export(model, x, zipmap), {"X": x})


def test_random_forest_regressor():
    x, y = make_regression(100, 5, random_state=0)
    x = x.astype(np.float32)
    check(_export(RandomForestRegressor(20, max_depth=6, random_state=0).fit(x, y), x), {"X": x}, rtol=1e-5,
          atol=1e-3)


@pytest.mark.parametrize("classes,string_labels", [(2, False), (3, True)])
def test_gradient_boosting_classifier(classes, string_labels):
    """Two classes is onnxruntime's binary case (one score, LOGISTIC); three, one tree per class."""
    x, y = _data(classes, string_labels=string_labels)
    x = np.nan_to_num(x)
    model = GradientBoostingClassifier(n_estimators=30, max_depth=3, random_state=0).fit(x, y)
    check(_export(model, x), {"X": x})


@pytest.mark.ml_slow
def test_gradient_boosting_regressor():
    x, y = make_regression(100, 5, random_state=0)
    x = x.astype(np.float32)
    model = GradientBoostingRegressor(n_estimators=30, max_depth=3, random_state=0).fit(x, y)
    check(_export(model, x), {"X": x}, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("classes,string_labels", [(2, False), pytest.param(3, True, marks=pytest.mark.ml_slow)])
def test_svc_rbf_with_probabilities(classes, string_labels):
    """Probabilities by libsvm's pairwise coupling (an iterative solver), labels by one-vs-one votes."""
    x, y = _data(classes, n=80, string_labels=string_labels)
    x = np.nan_to_num(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn 1.9 deprecates probability=True
        model = SVC(kernel="rbf", probability=True, random_state=0).fit(x, y)
    check(_export(model, x, zipmap=False), {"X": x}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("zipmap", [True, False])
def test_pipeline_scaler_one_hot_logistic_regression(zipmap):
    """ColumnTransformer: StandardScaler on three columns, OneHotEncoder on a category column, then
    LogisticRegression with string labels."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=(60, 3)), rng.integers(0, 3, size=(60, 1))], 1).astype(np.float32)
    y = np.where(x[:, 0] + (x[:, 3] == 1) > 0.3, "yes", "no")
    pre = ColumnTransformer([("num", StandardScaler(), [0, 1, 2]),
                             ("cat", OneHotEncoder(handle_unknown="ignore"), [3])])
    model = Pipeline([("pre", pre), ("lr", LogisticRegression())]).fit(x, y)
    check(_export(model, x, zipmap), {"X": x})


def test_pipeline_on_string_categories_with_unknown_strings():
    rng = np.random.default_rng(1)
    cats = rng.choice(["red", "green", "blue", "東京"], size=(50, 2))
    y = (cats[:, 0] == "red").astype(np.int64) + (cats[:, 1] == "blue")
    model = Pipeline([("oh", OneHotEncoder(handle_unknown="ignore")), ("lr", LogisticRegression())]).fit(cats, y)
    cats[0, 0], cats[1, 1] = "mauve", ""  # never seen in training
    onx = to_onnx(model, initial_types=[("X", StringTensorType([None, 2]))], target_opset=OPSETS)
    check(onx, {"X": cats})
