"""svodrt.InferenceSession: code written for onnxruntime runs unchanged on a bundle (issue 14)."""

from __future__ import annotations

import hashlib
import sys
import tracemalloc

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import svodc
import svodrt
from svodrt.errors import InputError
from tests.onnx_util import make_model, reference


def _model() -> onnx.ModelProto:
    """Two inputs of different types, four outputs of four types, named nodes."""
    return make_model([helper.make_node("Add", ["x", "bias"], ["sum"], name="add"),
                       helper.make_node("Relu", ["sum"], ["relu"], name="relu"),
                       helper.make_node("Cast", ["relu"], ["rounded"], to=TensorProto.INT64, name="cast"),
                       helper.make_node("Greater", ["rounded", "n"], ["big"], name="greater"),
                       helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="total")],
                      {"x": (np.float32, [2, 3]), "n": (np.int64, [2, 3])}, ["relu", "rounded", "big", "total"],
                      {"bias": np.array([0.5, -1.0, 2.0], np.float32)})


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("session")
    onnx_path, bundle = folder / "m.onnx", folder / "m.svod"
    onnx.save(_model(), onnx_path)
    svodc.compile_to_file(onnx_path, bundle)
    return onnx_path, bundle


def onnxruntime_style_script(rt, path) -> dict:
    """What an onnxruntime user writes; rt is the onnxruntime module or svodrt."""
    so = rt.SessionOptions()
    so.intra_op_num_threads = 1
    sess = rt.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feed = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        feed[i.name] = (rng.standard_normal(shape).astype(np.float32) * 3 if i.type == "tensor(float)"
                        else rng.integers(-2, 3, shape).astype(np.int64))
    names = [o.name for o in sess.get_outputs()]
    return {"all": sess.run(None, feed), "one": sess.run([names[2]], feed), "pair": sess.run([names[3], names[0]], feed),
            "shape": sess.get_inputs()[0].shape, "inputs": [(i.name, i.shape, i.type) for i in sess.get_inputs()],
            "outputs": [(o.name, o.shape, o.type) for o in sess.get_outputs()], "providers": sess.get_providers()}


def test_an_onnxruntime_script_runs_unchanged_on_the_bundle(paths):
    onnx_path, bundle = paths
    want = onnxruntime_style_script(onnxruntime, onnx_path)
    got = onnxruntime_style_script(svodrt, bundle)
    for key in ("shape", "inputs", "outputs", "providers"):
        assert got[key] == want[key], key
    for key in ("all", "one", "pair"):
        assert len(got[key]) == len(want[key]), key
        for g, w in zip(got[key], want[key], strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_dim_names_come_from_the_bundle_where_it_has_them(paths):
    """A bundle with bounded dims (format 1.5) names them as onnxruntime does, and runs at any size in
    range; a static bundle has ints."""
    from tests.test_dynamic import _cnn, _feeds

    model = _cnn()
    with svodrt.InferenceSession(svodc.compile(model, dims={"N": (1, 9)})) as sess:
        assert [a.shape for a in sess.get_inputs()] == [["N", 3, 16, 16], ["N", 10]]
        assert [a.shape for a in sess.get_outputs()] == [["N", 10], ["N", 16, 16, 16]]
        for n in (2, 7):
            feeds = _feeds(n)
            for g, w in zip(sess.run(None, feeds), reference(model, feeds), strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        with pytest.raises(svodrt.InputError, match="bounded dims"):
            sess.run(None, _feeds(2), out=[np.empty((9, 10), np.float32), np.empty((9, 16, 16, 16), np.float32)])
    with svodrt.InferenceSession(paths[1]) as sess:
        assert all(isinstance(d, int) for a in sess.get_inputs() for d in a.shape)


def test_metadata_names_the_compiler_options_and_the_onnx_digest(paths):
    onnx_path, bundle = paths
    with svodrt.InferenceSession(bundle) as sess:
        meta = sess.get_modelmeta()
    assert meta.custom_metadata_map["model_sha256"] == hashlib.sha256(onnx_path.read_bytes()).hexdigest()
    assert meta.custom_metadata_map["compiler"] == f"svodc {svodc.__version__}"
    assert "'target': 'host'" in meta.custom_metadata_map["options"]
    assert meta.producer_name == onnx.load(onnx_path).producer_name


def test_preallocated_outputs_are_filled_in_place_without_allocating(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (np.float32, [256, 1024])}, ["y"])
    sess = svodrt.InferenceSession(svodc.compile(model), sess_options=_one_thread())
    x = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)
    out = [np.empty((256, 1024), np.float32)]
    sess.run(None, {"x": x}, out=out)  # warm up: the arena pool
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    for _ in range(20):
        (y,) = sess.run(None, {"x": x}, out=out)
    peak = tracemalloc.get_traced_memory()[1] - start
    tracemalloc.stop()
    assert y is out[0] and np.array_equal(y, np.maximum(x, 0))
    assert peak < x.nbytes // 4, peak  # 1 MiB outputs; a per-call allocation would show here
    (by_name,) = sess.run(["y"], {"x": -x}, out={"y": out[0]})
    assert by_name is out[0] and np.array_equal(by_name, np.maximum(-x, 0))
    with pytest.raises(InputError, match=r"out\['y'\] must be a writeable C-contiguous float32\[256, 1024\]"):
        sess.run(None, {"x": x}, out=[np.empty((256, 1023), np.float32)])
    with pytest.raises(InputError, match=r"unknown outputs \['z'\]; the model's outputs are \['y'\]"):
        sess.run(["z"], {"x": x})


def _one_thread() -> svodrt.SessionOptions:
    so = svodrt.SessionOptions()
    so.intra_op_num_threads = 1
    return so


def _bf16_bundle() -> bytes:
    model = make_model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.BFLOAT16)],
                       {"x": (np.float32, [5])}, ["y"])
    return svodc.compile(model)


def test_bfloat16_outputs_are_ml_dtypes_arrays_or_their_bits(monkeypatch):
    import ml_dtypes

    bundle = _bf16_bundle()
    x = np.array([1.0, -2.5, 3.140625, 0.0, 1e30], np.float32)
    (y,) = svodrt.InferenceSession(bundle).run(None, {"x": x})
    assert y.dtype == ml_dtypes.bfloat16 and np.array_equal(y.astype(np.float32), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # as if not installed: the storage bits
    (bits,) = svodrt.InferenceSession(bundle).run(None, {"x": x})
    assert bits.dtype == np.uint16 and np.array_equal(bits, y.view(np.uint16))


def test_unknown_providers_fall_back_to_cpu_aloud(paths):
    with pytest.warns(UserWarning, match="using CPUExecutionProvider"):
        sess = svodrt.InferenceSession(paths[1], providers=["CUDAExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]


def test_session_decodes_string_and_zipmap_outputs_as_load_does():
    """String labels and ZipMap (format 1.6) come back decoded from InferenceSession.run too."""
    from tests.test_golden import ARTIFACTS

    path = ARTIFACTS / "v1.6" / "labels_and_maps.svod"
    feeds = {k.removeprefix("input."): v for k, v in np.load(path.with_suffix(".expected.npz")).items()
             if k.startswith("input.")}
    with svodrt.load(path, threads=1) as m:
        want = m.run(feeds)
    s = svodrt.InferenceSession(str(path))
    got = s.run(None, feeds)
    names = [o.name for o in s.get_outputs()]
    assert any(isinstance(want[n], list) for n in names)  # a ZipMap output: a list of dicts
    for name, g in zip(names, got, strict=True):
        if isinstance(want[name], list):
            assert g == want[name]
        else:
            np.testing.assert_array_equal(g, want[name])
