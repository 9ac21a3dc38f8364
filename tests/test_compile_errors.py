"""svodc on bad models and bad output paths, through the command line: one line on stderr, a non-zero
exit, and no output file — not even a partial or temporary one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from svodc.api import AtomicWriter
from tests.onnx_util import make_model, small_cnn

BIN = os.path.dirname(sys.executable)


def _good() -> bytes:
    return small_cnn()[0].SerializeToString()


def _edited(edit: Callable[[onnx.ModelProto], None]) -> Callable[[], bytes]:
    def make() -> bytes:
        m = small_cnn()[0]
        edit(m)
        return m.SerializeToString()
    return make


def _graph(nodes, outputs=("y",), n=2) -> Callable[[], bytes]:
    return lambda: make_model(nodes, {"x": (np.float32, [n])}, list(outputs)).SerializeToString()


def _set_raw_data(m: onnx.ModelProto) -> None:
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:100]


def _rename_output(m: onnx.ModelProto) -> None:
    m.graph.output[0].name = "nope"


def _wrong_attribute_type(m: onnx.ModelProto) -> None:
    m.graph.node[0].attribute[0].CopyFrom(helper.make_attribute("pads", 1.5))


BAD_MODELS = [
    ("truncated 10%", lambda: _good()[:len(_good()) // 10], "cannot parse 'm.onnx' as an ONNX model"),
    ("truncated 50%", lambda: _good()[:len(_good()) // 2], "cannot parse 'm.onnx' as an ONNX model"),
    ("truncated by one byte", lambda: _good()[:-1], "cannot parse 'm.onnx' as an ONNX model"),
    ("not a protobuf", lambda: bytes(range(256)) * 3, "cannot parse 'm.onnx' as an ONNX model"),
    ("empty file", lambda: b"", "opset"),
    ("short initializer", _edited(_set_raw_data), "initializer 'w' cannot be read"),
    ("cycle", _graph([helper.make_node("Relu", ["x"], ["a"], name="r1"),
                      helper.make_node("Add", ["a", "c"], ["y"], name="add"),
                      helper.make_node("Relu", ["y"], ["c"], name="r2")]), "cycle through nodes"),
    ("dangling input", _graph([helper.make_node("Add", ["x", "nowhere"], ["y"], name="add")]),
     "node 'add' (Add) reads 'nowhere', which is neither a graph input"),
    ("output produced by nothing", _edited(_rename_output), "graph output 'nope' is not produced"),
    ("value produced twice", _graph([helper.make_node("Relu", ["x"], ["y"], name="a"),
                                     helper.make_node("Neg", ["x"], ["y"], name="b")]), "'y' is produced twice"),
    ("tensor over the format's limit", _graph([helper.make_node("Relu", ["x"], ["y"])], n=10 ** 12),
     "cannot make a valid bundle: manifest field inputs[0]: shape [1000000000000] is over"),
    ("attribute of the wrong type", _edited(_wrong_attribute_type), ""),  # whatever it says: one line
]


def _compile(tmp_path: Path, model: str, output: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(BIN, "svodc"), "compile", model, "-o", output], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def _assert_one_line_error(r: subprocess.CompletedProcess, message: str) -> None:
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("svodc: ") and message in lines[0], r.stderr


@pytest.mark.parametrize("make,message", [c[1:] for c in BAD_MODELS], ids=[c[0] for c in BAD_MODELS])
def test_bad_model_is_a_one_line_error_and_writes_nothing(tmp_path, make, message):
    (tmp_path / "m.onnx").write_bytes(make())
    (tmp_path / "out").mkdir()
    r = _compile(tmp_path, "m.onnx", "out/m.svod")
    _assert_one_line_error(r, message)
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("output,message", [
    ("a-file/m.svod", "cannot write 'a-file/m.svod': Not a directory"),
    ("a-dir", "cannot write 'a-dir': it is a directory"),
    ("missing/dir/m.svod", "cannot write 'missing/dir/m.svod': No such file or directory"),
])
def test_unwritable_output_is_a_one_line_error(tmp_path, output, message):
    (tmp_path / "m.onnx").write_bytes(_good())
    (tmp_path / "a-file").write_bytes(b"keep me")
    (tmp_path / "a-dir").mkdir()
    r = _compile(tmp_path, "m.onnx", output)
    _assert_one_line_error(r, message)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a-dir", "a-file", "m.onnx"]
    assert (tmp_path / "a-file").read_bytes() == b"keep me"


def test_missing_model_file(tmp_path):
    _assert_one_line_error(_compile(tmp_path, "nothing.onnx", "m.svod"), "model file 'nothing.onnx' does not exist")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_write_leaves_no_file(tmp_path):
    target = tmp_path / "m.svod"
    target.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt), AtomicWriter(target) as out:
        out.write(b"new, half written")
        raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["m.svod"] and target.read_bytes() == b"old"
    with AtomicWriter(target) as out:
        out.write(b"new")
    assert [p.name for p in tmp_path.iterdir()] == ["m.svod"] and target.read_bytes() == b"new"
