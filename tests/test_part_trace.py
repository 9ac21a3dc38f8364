"""The entry's part trace (svodrt/abi.py SYNC_TRACE) and `svodrt profile --threads N` (svodrt_tools/parts.py)."""

from __future__ import annotations

import platform

import numpy as np
import pytest
from onnx import helper

import svodc
import svodrt
from svodc.codegen.module import entry_module
from svodc.target import parse_target
from svodrt_tools.cli import main as svodrt_main
from svodrt_tools.parts import _traced_calls, part_trace
from tests.onnx_util import make_model

x86 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the part trace is x86_64 code")


def _model():
    """A GEMM large enough to be cut into parts, a small elementwise kernel after it (one part), a reduction."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Relu", ["p"], ["r"]),
             helper.make_node("ReduceSum", ["r"], ["y"], keepdims=0)]
    return make_model(nodes, {"x": (np.float32, [512, 256])}, ["y"], {"w": w}), {
        "x": rng.standard_normal((512, 256)).astype(np.float32)}


@x86
@pytest.mark.parametrize("threads", [1, 2])
def test_every_part_of_every_kernel_is_traced_once_per_call(threads):
    model, feeds = _model()
    with svodrt.load(svodc.compile(model), threads=threads) as m:
        want = m.run(feeds)["y"]
        records, bounds, hz = _traced_calls(m, feeds, 3, 4096)
        assert np.array_equal(m.run(feeds)["y"], want)  # a traced call changes nothing the model computes
        kernels = len(m.bundle.kernels)
    assert hz > 0 and len(bounds) == 3
    for a, b in bounds:
        r = records[a:b]
        assert sorted(set(r["kernel"].tolist())) == list(range(kernels))
        for k in range(kernels):
            mine = r[r["kernel"] == k]
            n = int(mine["parts"][0])
            assert sorted(mine["part"].tolist()) == list(range(n)) and (mine["parts"] == n).all()
            assert ((mine["thread"] >= 0) & (mine["thread"] < threads)).all() and (mine["t1"] >= mine["t0"]).all()
        if threads == 1:
            assert (r["parts"] == 1).all() and (r["thread"] == 0).all()
    if threads == 2:  # the GEMM is shared: more than one part
        assert records["parts"].max() > 1


@x86
def test_profile_threads_shows_each_kernel_on_one_thread_and_on_n(tmp_path, capsys):
    model, feeds = _model()
    path = tmp_path / "m.svod"
    svodc.compile_to_file(model, path)
    np.save(tmp_path / "x.npy", feeds["x"])
    with svodrt.load(path, threads=2) as m:
        trace = part_trace(m, feeds, calls=3)
        names = [k.name for k in m.bundle.kernels]
    assert [r.kernel for r in trace.rows] == names and trace.threads == 2 and len(trace.busy) == 2
    assert all(r.wall > 0 and r.busy > 0 and r.parts >= 1 for r in trace.rows)
    assert trace.call >= max(r.wall for r in trace.rows)
    code = svodrt_main(["profile", str(path), "-i", f"x={tmp_path / 'x.npy'}", "--threads", "2", "--repeat", "3"])
    out = capsys.readouterr().out
    assert code in (0, None) and "on 1 thread" in out and "on 2" in out and all(n in out for n in names)


def test_only_x86_entries_read_a_trace():
    kernels = [("k0", 4, 2), ("k1", 1, 2)]
    assert "readcyclecounter" in entry_module(kernels, parse_target("x86_64:x86-64-v3")[0])
    for arch in ("aarch64", "riscv64", "ppc64le", "s390x"):
        ir = entry_module(kernels, parse_target(arch)[0])
        assert "readcyclecounter" not in ir and "svod_record" not in ir
