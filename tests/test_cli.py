"""The command lines: one-line errors, non-zero exits, no partial output files."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from onnx import helper

from tests.onnx_util import make_model

BIN = os.path.dirname(sys.executable)


def run(tool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(BIN, tool), *args], capture_output=True, text=True)


def test_unsupported_model_lists_every_node_and_writes_nothing(tmp_path):
    model = make_model([helper.make_node("NonMaxSuppression", ["x", "x"], ["a"], name="nms"),
                        helper.make_node("Relu", ["x"], ["b"], name="fine"),
                        helper.make_node("ImageDecoder", ["x"], ["c"], name="dec"),
                        helper.make_node("Mystery", ["b"], ["y"], name="mystery", domain="com.example")],
                       {"x": (np.float32, [3, 3])}, ["a", "c", "y"])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    r = run("svodc", "compile", str(path), "-o", str(tmp_path / "m.svod"))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for name, op in (("nms", "NonMaxSuppression"), ("dec", "ImageDecoder"), ("mystery", "Mystery")):
        assert f"{name} (" in lines[0] and op in lines[0]
    assert "opset 17" in lines[0] and "fine" not in lines[0]
    assert list(tmp_path.iterdir()) == [path]


def test_bad_model_file_and_unwritable_output(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf \x00\xff" * 10)
    r = run("svodc", "compile", str(bad))
    assert r.returncode != 0 and "cannot parse" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (np.float32, [2])}, ["y"])
    good = tmp_path / "good.onnx"
    good.write_bytes(model.SerializeToString())
    r = run("svodc", "compile", str(good), "-o", str(tmp_path / "no" / "such" / "dir" / "m.svod"))
    assert r.returncode != 0 and "cannot write" in r.stderr
    r = run("svodc", "--debug", "compile", str(bad))
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_compile_inspect_run_info(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], {"x": (np.float32, [4])}, ["y"])
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    r = run("svodc", "compile", str(src), "--target", "x86_64-linux-gnu:x86-64-v3,x86-64")
    assert r.returncode == 0, r.stderr
    bundle = tmp_path / "m.svod"  # default name next to the input
    assert bundle.exists()
    r = run("svodc", "inspect", str(bundle))
    assert r.returncode == 0 and "x86_64:x86-64-v3" in r.stdout and "relu" in r.stdout and "arena" in r.stdout
    np.save(tmp_path / "x.npy", np.array([-1, 1, -2, 2], np.float32))
    r = run("svodrt", "run", str(bundle), "--input", f"x={tmp_path / 'x.npy'}")
    assert r.returncode == 0 and "y: float32[4] [0, 1, 0, 2]" in r.stdout, r.stdout + r.stderr
    r = run("svodrt", "run", str(bundle), "--input", f"x={tmp_path / 'missing.npy'}")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    r = run("svodrt", "info", str(bundle))
    assert r.returncode == 0 and "inputs:" in r.stdout
    r = run("svodrt", "info", str(src))
    assert r.returncode != 0 and "bad magic" in r.stderr


def test_input_value_fixes_a_shape_input(tmp_path):
    """Resize's scales decide its output shape and are not taken at run time (a Reshape's shape is)."""
    model = make_model([helper.make_node("Resize", ["x", "", "shape"], ["y"])],
                       {"x": (np.float32, [2, 6]), "shape": (np.float32, [2])}, ["y"], opset=13)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    np.save(tmp_path / "shape.npy", np.array([2, 0.5], np.float32))
    r = run("svodc", "compile", str(path), "-o", str(tmp_path / "m.svod"), "-q")
    assert r.returncode != 0 and "--input-value" in r.stderr
    r = run("svodc", "compile", str(path), "-o", str(tmp_path / "m.svod"), "-q",
            "--input-value", f"shape={tmp_path / 'shape.npy'}")
    assert r.returncode == 0, r.stderr
    import svodrt

    with svodrt.load(tmp_path / "m.svod") as m:
        assert [t.name for t in m.inputs] == ["x"] and m.outputs[0].shape == (4, 3)  # [2, 6] scaled by [2, 0.5]
