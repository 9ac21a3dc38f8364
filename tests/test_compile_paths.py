"""The compiler against hostile or careless paths and models (issue 18, point 5): each attack reproduced,
each with its clean outcome."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import svodc
from svodc.api import check_output_path
from svodc.errors import InvalidModelError, OutputWriteError, TestVectorError, UnsupportedModelError, WeightsError
from tests.onnx_util import make_model

ROOT = Path(__file__).resolve().parent.parent


def _relu() -> onnx.ModelProto:
    return make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (np.float32, [4])}, ["y"])


def test_external_data_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="weights.bin")
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": (np.float32, [4])}, ["y"])
    model.graph.initializer.append(w)
    os.mkfifo(tmp_path / "weights.bin")  # nobody writes it: a blocking open would never return
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    with pytest.raises(WeightsError, match=r"weights\.bin' is not a regular file \(a FIFO, device or socket\)"):
        svodc.compile(src)


def test_outputs_never_replace_a_device_a_fifo_or_the_model(tmp_path):
    with pytest.raises(OutputWriteError, match="is not a regular file"):
        check_output_path(Path(os.devnull), None)  # a character device
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(OutputWriteError, match="is not a regular file"):
        svodc.compile_to_file(_relu(), tmp_path / "pipe")
    src = tmp_path / "m.onnx"
    onnx.save(_relu(), src)
    before = src.read_bytes()
    with pytest.raises(OutputWriteError, match="it is the model being compiled"):
        svodc.compile_to_file(src, tmp_path / "." / "m.onnx")
    assert src.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "pipe"]


def test_sigterm_during_compile_removes_the_temp_file(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_relu(), src)
    script = ("import os, signal, sys, svodc\n"
              "def progress(line):\n"
              "    if line.startswith('import'): os.kill(os.getpid(), signal.SIGTERM)\n"
              "svodc.compile_to_file(sys.argv[1], sys.argv[2], progress=progress)\n")
    r = subprocess.run([sys.executable, "-c", script, str(src), str(tmp_path / "m.svod")], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]  # no .m.svod.*.tmp left


def test_opsets_newer_than_onnx_knows_and_models_without_outputs_are_refused():
    newest = onnx.defs.onnx_opset_version()
    with pytest.raises(InvalidModelError, match=f"imports ai.onnx opset {newest + 1}, newer than the {newest}"):
        svodc.compile(make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (np.float32, [4])}, ["y"],
                                 opset=newest + 1))
    empty = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])], []),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidModelError, match="declares no graph outputs"):
        svodc.compile(empty)


def test_unsupported_nodes_of_unknown_custom_domains_are_all_listed_with_their_domain():
    model = make_model([helper.make_node("Foo", ["x"], ["a"], name="foo", domain="com.acme"),
                        helper.make_node("Qux", ["a"], ["b"], name="qux", domain="com.acme"),
                        helper.make_node("Bar", ["b"], ["c"], name="bar", domain="org.other"),
                        helper.make_node("ImageDecoder", ["x"], ["d"], name="dec"),
                        helper.make_node("Relu", ["x"], ["e"], name="fine")],
                       {"x": (np.float32, [3, 3])}, ["c", "d", "e"])
    model.opset_import.append(helper.make_opsetid("com.acme", 1))
    with pytest.raises(UnsupportedModelError) as e:
        svodc.compile(model)
    assert [(n.name, n.domain) for n in e.value.nodes] == [("foo", "com.acme"), ("qux", "com.acme"),
                                                           ("bar", "org.other"), ("dec", "")]
    assert "com.acme::Qux" in str(e.value) and "org.other::Bar" in str(e.value) and "domain 'org.other'" in str(e.value)


def _bomb() -> onnx.ModelProto:
    """A model of 139 bytes that asks the reference interpreter for a [1e6, 1e6] float tensor (4 TB)."""
    shape = numpy_helper.from_array(np.array([1_000_000, 1_000_000], np.int64), "s")
    one = numpy_helper.from_array(np.array([1.0], np.float32))
    g = helper.make_graph([helper.make_node("ConstantOfShape", ["s"], ["c"], value=one),
                           helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)], "g", [],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_test_vectors_past_the_interpreters_budget_are_skipped_with_a_warning():
    lines = []
    bundle = svodc.compile(_bomb(), progress=lines.append)  # compiled, never run: it would sum 1e12 ones
    assert bundle[:4] == b"SVOD"
    assert any(line.startswith("warning: test vectors: skipped") and "float32[1000000, 1000000]" in line
               for line in lines), lines
    with pytest.raises(TestVectorError, match="would materialize a float32"):
        svodc.compile(_bomb(), test_vectors=True)
