"""String ops and string outputs: StringNormalizer of a graph input computed by svodrt at the edge (the
onnx package's `simple` strnorm models), the four string ops folded at compile time, string outputs
decoded from ids (including input strings the vocabulary lacks), and the refusals."""

from __future__ import annotations

import glob
import os
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import svodc
import svodrt
from svodc.errors import UnsupportedModelError
from svodc.passes.dynamic import DynamicShapeError
from tests.ml_util import ML, assert_same, ml_model, ort_run, svod_run

S, I64, BOOL = TensorProto.STRING, TensorProto.INT64, TensorProto.BOOL
SIMPLE = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "simple")


def _pb(path: str) -> np.ndarray:
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


@pytest.mark.parametrize("case", sorted(os.path.basename(p) for p in glob.glob(os.path.join(SIMPLE, "test_strnorm_*"))))
def test_onnx_simple_string_normalizer_models(case):
    """Run-time string input -> StringNormalizer -> graph output (its shape depends on the strings)."""
    folder = os.path.join(SIMPLE, case)
    model = onnx.load(os.path.join(folder, "model.onnx"))
    x, want = _pb(os.path.join(folder, "test_data_set_0", "input_0.pb")), _pb(
        os.path.join(folder, "test_data_set_0", "output_0.pb"))
    with svodrt.load(svodc.compile(model), threads=1) as m:
        got = m.run({model.graph.input[0].name: x})
        assert m.bundle.edge_outputs and not m.bundle.outputs  # nothing for native code to do
    assert_same(got[model.graph.output[0].name], want, case)


def test_simple_normalizer_models_are_there():
    assert len(glob.glob(os.path.join(SIMPLE, "test_strnorm_*"))) == 6


def _folded(nodes, inputs, outputs, values, opset=20):
    model = ml_model(nodes, inputs, outputs, opset=opset)
    got = svod_run(model, {}, input_values=values)
    for o, w in zip(model.graph.output, ort_run(model, values), strict=True):  # ("" splits into no parts there)
        assert_same(got[o.name], w, o.name)
    return got


def test_string_ops_on_constants_fold_at_compile_time():
    words = np.array([["a,b", "東京,,x"], ["", "no comma"]], dtype=object)
    nodes = [helper.make_node("StringConcat", ["w", "tail"], ["cat"]),
             helper.make_node("RegexFullMatch", ["cat"], ["match"], pattern=r"[a-z, ]*!"),
             helper.make_node("StringSplit", ["w"], ["parts", "counts"], delimiter=","),
             helper.make_node("StringSplit", ["w"], ["words", "nwords"])]
    got = _folded(nodes, {"w": (S, [2, 2]), "tail": (S, [2])},
                  {"cat": (S, [2, 2]), "match": (BOOL, [2, 2]), "parts": (S, [2, 2, 3]), "counts": (I64, [2, 2]),
                   "words": (S, [2, 2, 2]), "nwords": (I64, [2, 2])},
                  {"w": words, "tail": np.array(["!", "?"], dtype=object)})
    assert got["match"].tolist() == [[True, False], [True, False]]


def test_string_normalizer_on_a_constant_folds():
    node = helper.make_node("StringNormalizer", ["w"], ["n"], case_change_action="LOWER", stopwords=["B"])
    model = ml_model([node], {"w": (S, [1, 3])}, {"n": (S, [1, None])})
    got = svod_run(model, {}, input_values={"w": np.array([["A", "b", "Ç"]])})
    assert got["n"].tolist() == [["a", "ç"]]


def test_string_outputs_return_input_strings_the_vocabulary_lacks():
    nodes = [helper.make_node("Identity", ["x"], ["same"]),
             helper.make_node("Where", ["pick", "x", "k"], ["mixed"]),
             helper.make_node("Constant", [], ["k"], value_strings=["known"])]
    model = ml_model(nodes, {"x": (S, [3]), "pick": (BOOL, [3])}, {"same": (S, [3]), "mixed": (S, [3])})
    feeds = {"x": np.array(["new", "東京", ""]), "pick": np.array([True, False, True])}
    got = svod_run(model, feeds)
    assert got["same"].tolist() == ["new", "東京", ""] and got["same"].dtype == object
    assert got["mixed"].tolist() == ["new", "known", ""]


def _refusal(model) -> str:
    with pytest.raises(UnsupportedModelError) as e:
        svodc.compile(model)
    return str(e.value)


STRING_CASES = ("test_string_concat", "test_regex_full_match", "test_string_split", "test_strnormalizer")


@pytest.fixture(scope="module")
def onnx_string_cases():
    """The onnx package's node test cases of the four ops. Importing a case module runs its exporters
    (collect_testcases would build every op's cases: 30 s here); they land in the package's list."""
    import importlib

    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module in ("regex_full_match", "string_concat", "string_split", "stringnormalizer"):
            importlib.import_module(f"onnx.backend.test.case.node.{module}")
    return {c.name: c for c in node_cases._NodeTestCases if c.name.startswith(STRING_CASES)}


def test_onnx_node_cases_of_the_string_ops_run_on_run_time_strings(onnx_string_cases):
    """Every onnx node test case of the four ops, their inputs given at run time: svodrt's string program
    gives the expected outputs (which onnxruntime gives too: it is checked where its locale lets it run)."""
    assert len(onnx_string_cases) >= 20
    for name, case in sorted(onnx_string_cases.items()):
        (inputs, expected), = case.data_sets
        feeds = {vi.name: x for vi, x in zip(case.model.graph.input, inputs, strict=True)}
        with svodrt.load(svodc.compile(case.model, input_shapes={k: v.shape for k, v in feeds.items()}),
                         threads=1) as m:
            got = m.run(feeds)
        for vi, want in zip(case.model.graph.output, expected, strict=True):
            assert_same(got[vi.name], want, f"{name}: {vi.name}")
        if not name.startswith("test_strnormalizer"):  # onnxruntime's needs an installed en_US.UTF-8 locale
            for vi, want in zip(case.model.graph.output, ort_run(case.model, feeds), strict=True):
                assert_same(got[vi.name], want, f"{name}: {vi.name} (onnxruntime)")


def _pipeline(nodes, inputs, outputs, feeds, **kw):
    model = ml_model(nodes, inputs, outputs, opset=20, ml_opset=4)
    with svodrt.load(svodc.compile(model, **kw), threads=1) as m:
        got = m.run(feeds)
        bundle = m.bundle
    for o, w in zip(model.graph.output, ort_run(model, feeds), strict=True):
        assert_same(got[o.name], w, o.name)
    return got, bundle


def test_normalizer_then_label_encoder_then_a_numeric_model():
    """Text preprocessing at the edge, numbers in native code: StringNormalizer (svodrt, before the
    code) -> LabelEncoder -> Cast -> MatMul; the normalized strings are a code input svodrt fills."""
    nodes = [helper.make_node("StringNormalizer", ["x"], ["n"], case_change_action="LOWER", locale="C.UTF-8"),
             helper.make_node("LabelEncoder", ["n"], ["code"], domain=ML, keys_strings=["cat", "dog", "東京"],
                              values_int64s=[1, 2, 3], default_int64=0),
             helper.make_node("Cast", ["code"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Reshape", ["f", "shape"], ["row"]),
             helper.make_node("Constant", [], ["shape"], value_ints=[1, 4]),
             helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(np.eye(4, 2, dtype=np.float32))),
             helper.make_node("MatMul", ["row", "w"], ["y"])]
    x = np.array(["Cat", "DOG", "東京", "bird"])
    got, bundle = _pipeline(nodes, {"x": (S, [4])}, {"y": (TensorProto.FLOAT, [1, 2]), "code": (I64, [4])},
                            {"x": x})
    assert [t.name for t in bundle.inputs] == ["x", "n"] and bundle.edge_outputs[0][4] == "input"
    assert got["code"].tolist() == [1, 2, 3, 0]


def test_split_lengths_feed_code_and_substrings_come_back_from_the_edge():
    """StringSplit: its counts are a code input (their shape is X's); its substrings, whose width the
    strings decide, are an output svodrt returns."""
    nodes = [helper.make_node("StringSplit", ["x"], ["parts", "count"], delimiter=",", maxsplit=2),
             helper.make_node("Cast", ["count"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["f", "f"], ["y"])]
    x = np.array([["a,b", "東京,,x,y"], ["", "no comma"]])
    got, bundle = _pipeline(nodes, {"x": (S, [2, 2])}, {"parts": (S, [2, 2, None]), "y": (TensorProto.FLOAT, [2, 2])},
                            {"x": x})
    assert got["parts"].shape == (2, 2, 3) and [t.name for t in bundle.outputs] == ["y"]


def test_normalize_split_lookup_sum_with_a_maxsplit_bounded_width():
    """normalize -> split -> LabelEncoder -> ReduceSum: with maxsplit the substrings reach code, their
    width a bounded dim (1..maxsplit + 1) that svodrt sets from the strings of each call."""
    nodes = [helper.make_node("StringNormalizer", ["x"], ["n"], case_change_action="LOWER", locale="C.UTF-8"),
             helper.make_node("StringSplit", ["n"], ["words", "count"], delimiter=" ", maxsplit=3),
             helper.make_node("LabelEncoder", ["words"], ["w"], domain=ML, keys_strings=["good", "bad", "東京"],
                              values_floats=[1.0, -1.0, 0.5], default_float=0.0),
             helper.make_node("ReduceSum", ["w", "axis"], ["score"], keepdims=0),
             helper.make_node("Constant", [], ["axis"], value_ints=[1])]
    model = ml_model(nodes, {"x": (S, [3])}, {"score": (TensorProto.FLOAT, [3]), "words": (S, [3, None])},
                     opset=20, ml_opset=4)
    with svodrt.load(svodc.compile(model), threads=1) as m:
        assert [str(t) for t in m.bundle.inputs][-1] == "words: string[3, words:1=1..4]"
        for x in (np.array(["Good 東京", "bad BAD movie really bad", "ok"]), np.array(["a", "b", "GOOD"])):
            got = m.run({"x": x})
            for o, w in zip(model.graph.output, ort_run(model, {"x": x}), strict=True):
                assert_same(got[o.name], w, o.name)
        assert got["words"].shape == (3, 1)
        with pytest.raises(svodrt.InputError, match="'words' dim 1 .*got 0, expected 1..4"):
            m.run({"x": np.array(["", "", ""])})  # no substrings at all: a width of 0, below the bounded dim


@pytest.mark.parametrize("shape", [[5], [1, 5]])
def test_normalizer_with_stopwords_feeds_code_through_a_bounded_dim(shape):
    """Stopwords dropped: 1..C elements remain (none left gives [""]), a bounded dim svodrt sets per call."""
    nodes = [helper.make_node("StringNormalizer", ["x"], ["n"], case_change_action="UPPER", stopwords=["the", "a"],
                              locale="C.UTF-8"),
             helper.make_node("LabelEncoder", ["n"], ["w"], domain=ML, keys_strings=["CAT", "DOG", ""],
                              values_floats=[1.0, 2.0, 7.0], default_float=0.5),
             helper.make_node("ReduceSum", ["w"], ["score"], keepdims=0)]
    model = ml_model(nodes, {"x": (S, shape)}, {"score": (TensorProto.FLOAT, []), "n": (S, [None] * len(shape))},
                     opset=20, ml_opset=4)
    with svodrt.load(svodc.compile(model), threads=1) as m:
        for words in (["The", "cat", "a", "dog", "東京"], ["the", "A", "a", "THE", "the"], ["cat"] * 5):
            x = np.array(words).reshape(shape)
            got = m.run({"x": x})
            for o, w in zip(model.graph.output, ort_run(model, {"x": x}), strict=True):
                assert_same(got[o.name], w, o.name)


def test_normalizer_then_tfidf_vectorizer_with_a_string_pool():
    """TfIdfVectorizer's string pool compares token ids; the tokens here are StringNormalizer's, filled by svodrt."""
    nodes = [helper.make_node("StringNormalizer", ["x"], ["n"], case_change_action="LOWER", locale="C.UTF-8"),
             helper.make_node("TfIdfVectorizer", ["n"], ["tf"], mode="TFIDF", min_gram_length=1, max_gram_length=2,
                              max_skip_count=1, ngram_counts=[0, 3], ngram_indexes=[0, 1, 2, 3],
                              pool_strings=["good", "bad", "movie", "good", "movie"], weights=[1.0, 2.0, 0.5, 3.0])]
    for x in (["Good", "movie", "good", "x", "movie", "BAD"], ["a", "good", "b", "movie", "", "good"]):
        _pipeline(nodes, {"x": (S, [6])}, {"tf": (TensorProto.FLOAT, [4])}, {"x": np.array(x)})


def test_split_then_tfidf_unigrams_count_over_the_bounded_width():
    """Unigram counts over StringSplit's substrings of a bounded width count the "" padding up to the
    call's longest row, as onnxruntime does; n-grams (views sliced along the bounded dim) are refused."""
    def nodes(max_gram):
        return [helper.make_node("StringSplit", ["x"], ["words", "count"], maxsplit=3),
                helper.make_node("TfIdfVectorizer", ["words"], ["tf"], mode="TF", min_gram_length=1,
                                 max_gram_length=max_gram, max_skip_count=0, ngram_counts=[0, 2],
                                 ngram_indexes=[0, 1, 2], pool_strings=["good", "", "good", "good"])]
    for x in (["good good good good", "good"], ["good", "a good"], ["x", "y"]):
        _pipeline(nodes(1), {"x": (S, [2])}, {"tf": (TensorProto.FLOAT, [2, 3])}, {"x": np.array(x)})
    with pytest.raises(DynamicShapeError, match="slices a bounded dim"):
        svodc.compile(ml_model(nodes(2), {"x": (S, [2])}, {"tf": (TensorProto.FLOAT, [2, 3])}, opset=20, ml_opset=4))


def test_concat_then_regex_full_match_then_where():
    """StringConcat of two run-time inputs (broadcast) and of a constant suffix -> RegexFullMatch -> Where
    on numbers; the concatenation is also a graph output (a code input svodrt returns as well)."""
    nodes = [helper.make_node("StringConcat", ["user", "at"], ["u"]),
             helper.make_node("StringConcat", ["u", "domain"], ["email"]),
             helper.make_node("RegexFullMatch", ["email"], ["ok"], pattern=r"[a-z0-9._]+@[a-z]+\.(com|org)$"),
             helper.make_node("Constant", [], ["at"], value_strings=["@"]),
             helper.make_node("Where", ["ok", "one", "zero"], ["score"]),
             helper.make_node("Constant", [], ["one"], value_floats=[1.0]),
             helper.make_node("Constant", [], ["zero"], value_floats=[0.0])]
    feeds = {"user": np.array(["ann", "b.o_b", "Cid", "東京"]), "domain": np.array(["ex.com"])}
    got, _ = _pipeline(nodes, {"user": (S, [4]), "domain": (S, [1])},
                       {"score": (TensorProto.FLOAT, [4]), "email": (S, [4]), "ok": (BOOL, [4])}, feeds)
    assert got["ok"].tolist() == [True, True, False, False]


def test_a_format_1_6_runtime_refuses_a_string_program_bundle_at_load(tmp_path):
    """The string program's steps are 1.8's five-item `edge_outputs` entries, which a 1.6 runtime refuses
    when it loads the bundle, before any code runs."""
    from svodrt_tools.describe import describe_bundle
    from tests.bundle_tools import old_runtime_load

    nodes = [helper.make_node("StringNormalizer", ["x"], ["n"], case_change_action="UPPER"),
             helper.make_node("Equal", ["n", "k"], ["y"]),
             helper.make_node("Constant", [], ["k"], value_strings=["A"])]
    bundle = svodc.compile(ml_model(nodes, {"x": (S, [2])}, {"y": (BOOL, [2])}))
    with svodrt.load(bundle, threads=1) as m:
        assert m.run({"x": np.array(["a", "b"])})["y"].tolist() == [True, False]
        assert [t.name for t in m.inputs] == ["x"]
        assert "n: string[2]  (filled by run(): StringNormalizer of x)" in describe_bundle(m.bundle)
        with pytest.raises(svodrt.InputError, match="'n' is computed by the model"):
            m.run({"x": np.array(["a", "b"]), "n": np.array(["A", "A"])})
    out = old_runtime_load(FORMAT_1_6_COMMIT, 6, bundle, tmp_path)
    assert "manifest field edge_outputs[0]: must be [new output name, 'StringNormalizer'" in out


FORMAT_1_6_COMMIT = "78ef871"  # main just before format 1.8 (1.7 is another helper's): a format 1.6 runtime


def test_string_work_that_svod_cannot_do_is_refused_with_the_reason():
    nodes = [helper.make_node("StringSplit", ["x"], ["parts", "n"]),
             helper.make_node("LabelEncoder", ["parts"], ["y"], domain=ML, keys_strings=["a"], values_int64s=[1],
                              name="codes")]
    msg = _refusal(ml_model(nodes, {"x": (S, [2])}, {"y": (I64, [2, None])}, opset=20))
    assert "codes (ai.onnx.ml::LabelEncoder" in msg and "whose shape depends on the strings" in msg
    nodes = [helper.make_node("Gather", ["x", "i"], ["g"]), helper.make_node("Constant", [], ["i"], value_ints=[1, 0]),
             helper.make_node("StringConcat", ["g", "x"], ["y"], name="join")]
    msg = _refusal(ml_model(nodes, {"x": (S, [2])}, {"y": (S, [2])}, opset=20))
    assert "join (ai.onnx::StringConcat" in msg and "computed from run-time strings by a GATHER" in msg


@pytest.mark.parametrize("pattern,why", [(r"(a)\1", "backreference"), (r"(?i)abc", "inline flags"),
                                         (r"a(?=b)", "lookarounds"), (r"a*+", "possessive"), (r"a{,3}", "{,n}"),
                                         (r"[[:alpha:]]+", "POSIX class"), (r"\pL+", "\\p classes"),
                                         (r"[\S]", "inside a character class"), (r"ab\Z", "RE2 has \\z")])
def test_regex_patterns_python_would_read_otherwise_are_refused(pattern, why):
    node = helper.make_node("RegexFullMatch", ["x"], ["y"], pattern=pattern, name="re")
    msg = _refusal(ml_model([node], {"x": (S, [2])}, {"y": (BOOL, [2])}, opset=20))
    assert "re (ai.onnx::RegexFullMatch" in msg and why in msg, msg


def test_regex_dialect_is_re2s_on_the_shared_subset():
    """\\d \\w \\b are ASCII, \\s excludes \\v, $ is the end of the text: as onnxruntime (RE2) matches."""
    node = helper.make_node("RegexFullMatch", ["x"], ["y"], pattern=r"\w+\s\d+$|x\sy")
    model = ml_model([node], {"x": (S, [5])}, {"y": (BOOL, [5])}, opset=20)
    x = np.array(["ab 12", "é 1", "ab 3\n", "x\vy", "a_1\t٣"])
    got = svod_run(model, {"x": x})
    assert got["y"].tolist() == ort_run(model, {"x": x})[0].tolist() == [True, False, False, False, False]
