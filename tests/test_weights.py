"""Weights from outside the .onnx: safetensors files (--weights) and ONNX external data, read through
mmap. The bundle computes with the file's values; wrong names, shapes and dtypes fail naming the
tensor; weights are not copied on the way into a bundle file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import save_file

import svodc
import svodrt
from svodc.errors import WeightsError
from svodc.frontend.importer import import_model
from svodc.ir.ops import Ops


def affine_model(w: np.ndarray, b: np.ndarray, w_as_input: bool = False) -> onnx.ModelProto:
    """y = x @ w + b; w is an initializer, or (w_as_input) a graph input a weights file must supply."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, w.shape[0]])]
    inits = [numpy_helper.from_array(b, "b")]
    if w_as_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape)))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    graph = helper.make_graph(nodes, "affine", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def model_file(tmp_path):
    r = np.random.default_rng(0)
    w, b = r.normal(size=(4, 3)).astype(np.float32), r.normal(size=3).astype(np.float32)
    path = tmp_path / "affine.onnx"
    onnx.save(affine_model(w, b), path)
    return path, w, b


def run(bundle: bytes, x: np.ndarray) -> np.ndarray:
    with svodrt.load(bundle, threads=1) as m:
        return m.run({"x": x})["y"]


def test_safetensors_values_are_the_ones_computed_with(model_file, tmp_path):
    path, w, b = model_file
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(run(svodc.compile(path), x), x @ w + b, rtol=1e-5)
    w2 = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    save_file({"w": w2}, tmp_path / "w.safetensors")
    y2 = run(svodc.compile(path, weights=(str(tmp_path / "w.safetensors"),)), x)
    np.testing.assert_allclose(y2, x @ w2 + b, rtol=1e-5)
    w3 = w2.copy()
    w3[1, 2] += 10.0  # one value changes: only column 2 of the output moves, by 10 * x[:, 1]
    save_file({"w": w3, "b": b * 2}, tmp_path / "w3.safetensors")
    y3 = run(svodc.compile(path, weights=(str(tmp_path / "w3.safetensors"),)), x)
    np.testing.assert_allclose(y3 - (x @ w2 + b), np.stack([np.zeros(2), np.zeros(2), 10 * x[:, 1]], 1) + b,
                               rtol=1e-5, atol=1e-5)


def test_a_weights_file_supplies_a_graph_input(tmp_path):
    r = np.random.default_rng(2)
    w, b = r.normal(size=(4, 3)).astype(np.float32), r.normal(size=3).astype(np.float32)
    path = tmp_path / "m.onnx"
    onnx.save(affine_model(w, b, w_as_input=True), path)
    save_file({"w": w}, tmp_path / "w.safetensors")
    bundle = svodc.compile(path, weights=(str(tmp_path / "w.safetensors"),))
    with svodrt.load(bundle, threads=1) as m:
        assert [t.name for t in m.inputs] == ["x"]
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(run(bundle, x), x @ w + b, rtol=1e-5)


def refused(model, weights, message: str) -> None:
    with pytest.raises(WeightsError, match=message):
        svodc.compile(model, weights=(str(weights),))


@pytest.mark.parametrize("tensors,message", [
    ({"w": np.zeros((4, 3), np.float32), "bias": np.zeros(3, np.float32)},
     r"tensor 'bias' of '.*bad.safetensors' is neither an initializer nor an input of the model"),
    ({"w": np.zeros((3, 4), np.float32)}, r"tensor 'w' of .* has shape \[3, 4\], the model declares 'w' as \[4, 3\]"),
    ({"w": np.zeros((4, 3), np.float16)}, r"tensor 'w' of .* is float16, the model declares 'w' as float32"),
])
def test_wrong_name_shape_or_dtype_is_an_error_naming_the_tensor(model_file, tmp_path, tensors, message):
    path, _, _ = model_file
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, bad)
    refused(path, bad, message)
    out = tmp_path / "m.svod"
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "svodc"), "compile", str(path), "--weights",
                        str(bad), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "tensor '" in r.stderr, r.stderr
    assert not out.exists()


def write_raw_safetensors(path, entries: dict[str, tuple[str, list[int], bytes]], pad: int = 0) -> None:
    """A safetensors file written by hand (for dtypes the numpy writer lacks, and for broken files)."""
    header, blobs, at = {}, [], 0
    for name, (dt, shape, data) in entries.items():
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    text = json.dumps(header).encode() + b" " * pad
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def test_float16_bfloat16_and_int8_tensors_are_read_as_stored(tmp_path):
    import ml_dtypes

    vals = np.array([1.5, -2.25, 3e-3, 65504.0], np.float32)
    f = tmp_path / "t.safetensors"
    write_raw_safetensors(f, {"h": ("F16", [4], vals.astype(np.float16).tobytes()),
                              "b": ("BF16", [2, 2], vals.astype(ml_dtypes.bfloat16).tobytes()),
                              "i": ("I8", [4], np.array([-128, -1, 0, 127], np.int8).tobytes())}, pad=3)
    from svodc.frontend.weights import SafetensorsFile

    st = SafetensorsFile(f)
    np.testing.assert_array_equal(st.array("h"), vals.astype(np.float16))
    np.testing.assert_array_equal(st.array("b").astype(np.float32), vals.astype(ml_dtypes.bfloat16).astype(np.float32).reshape(2, 2))
    np.testing.assert_array_equal(st.array("i"), [-128, -1, 0, 127])
    assert not st.array("h").flags.writeable and not st.array("h").flags.owndata  # a view of the mapping


@pytest.mark.parametrize("entries,message", [
    ({"w": ("F32", [4, 3], b"\0" * 40)}, r"tensor 'w': 40 bytes hold a float32\[4, 3\] of 48 bytes"),
    ({"w": ("C64", [2], b"\0" * 16)}, r"tensor 'w' has dtype 'C64'"),
])
def test_a_broken_safetensors_file_is_refused_by_name(model_file, tmp_path, entries, message):
    path, _, _ = model_file
    bad = tmp_path / "bad.safetensors"
    write_raw_safetensors(bad, entries)
    refused(path, bad, message)
    bad.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    refused(path, bad, "header claims")


def test_onnx_external_data_is_mapped_not_loaded(tmp_path):
    r = np.random.default_rng(3)
    w, b = r.normal(size=(4, 3)).astype(np.float32), r.normal(size=3).astype(np.float32)
    path = tmp_path / "ext.onnx"
    onnx.save(affine_model(w, b), path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=0)
    graph = import_model(path)
    weights = [n for n in graph.outputs[0][1].toposort() if n.op is Ops.WEIGHT]
    assert weights and all(not n.arg.array.flags.owndata for n in weights)
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(run(svodc.compile(path), x), x @ w + b, rtol=1e-5)
    (tmp_path / "ext.data").unlink()
    with pytest.raises(WeightsError, match=r"initializer '[wb]': external data: cannot read '.*ext.data'"):
        svodc.compile(path)


def test_large_weights_are_streamed_into_the_bundle_file(tmp_path):
    """A 64 MiB weight from a safetensors file reaches the bundle file without a copy in memory:
    Python's allocations while compiling stay far below its size."""
    n = 16 << 20
    w = np.linspace(-1, 1, n, dtype=np.float32)
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n]),
                                               helper.make_tensor_value_info("w", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])])
    path = tmp_path / "scale.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    save_file({"w": w}, tmp_path / "w.safetensors")
    out = tmp_path / "scale.svod"
    tracemalloc.start()
    svodc.compile_to_file(path, out, weights=(str(tmp_path / "w.safetensors"),), test_vectors=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < w.nbytes // 4, f"peak Python allocation {peak >> 20} MiB while compiling a {w.nbytes >> 20} MiB weight"
    x = np.full(n, 2.0, np.float32)
    with svodrt.load(out, threads=1) as m:
        np.testing.assert_array_equal(m.run({"x": x})["y"], 2 * w)
