"""One loaded model, many threads; close() while running; memory over many runs."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from onnx import helper as onnx_helper

import svodrt


def _hammer(model: svodrt.Model, feeds: dict, want: np.ndarray, threads: int, runs: int) -> list[str]:
    problems: list[str] = []
    start = threading.Barrier(threads)

    def worker(i: int) -> None:
        x = {"x": feeds["x"] + np.float32(i)}  # each thread its own input, so a mix-up would show
        expect = want[i]
        start.wait()
        for r in range(runs):
            got = model.run(x)["y"]
            if not np.array_equal(got, expect):
                problems.append(f"thread {i} run {r}")

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return problems


def test_eight_threads_a_thousand_runs_each_match_single_threaded(small_bundle):
    path, feeds = small_bundle
    with svodrt.load(path, threads=1) as single:
        want = [single.run({"x": feeds["x"] + np.float32(i)})["y"] for i in range(8)]
    with svodrt.load(path, threads=2) as m:  # a model this small runs on one thread: many calls at once
        assert _hammer(m, feeds, want, threads=8, runs=1000) == []


def test_close_while_running_waits_and_later_runs_are_refused(small_bundle):
    path, feeds = small_bundle
    m = svodrt.load(path, threads=2)
    want = m.run(feeds)["y"]
    outcomes: list[str] = []

    def worker() -> None:
        try:
            while True:
                if not np.array_equal(m.run(feeds)["y"], want):
                    outcomes.append("wrong")
        except svodrt.ModelClosedError:
            outcomes.append("refused")

    ts = [threading.Thread(target=worker) for _ in range(4)]
    for t in ts:
        t.start()
    time.sleep(0.2)
    m.close()  # returns once running calls have finished; the code is unmapped only then
    for t in ts:
        t.join(timeout=30)
    assert outcomes == ["refused"] * 4
    m.close()  # closing twice is harmless
    with pytest.raises(svodrt.ModelClosedError, match="closed"):
        m.run(feeds)


RSS = r"""
import sys, numpy as np, svodrt
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
feeds = dict(np.load(sys.argv[2]))
for threads, runs in ((1, 10000), (2, 2000)):  # with helper threads each run costs ~1 ms here: fewer runs
    m = svodrt.load(sys.argv[1], threads=threads)
    for i in range(1, runs + 1):
        m.run(feeds)
        if i == 100:
            at100 = rss()
    print(at100, rss())
"""


def test_resident_memory_is_flat_over_ten_thousand_runs(small_bundle, tmp_path):
    path, feeds = small_bundle
    np.savez(tmp_path / "in.npz", **feeds)
    out = subprocess.run([sys.executable, "-c", RSS, str(path), str(tmp_path / "in.npz")], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        at100, at_end = map(int, line.split())
        assert abs(at_end - at100) < 5 << 20, (at100, at_end)


def test_parts_shared_by_more_threads_than_cores_match_one_thread():
    """The entry's work queue (svodc/codegen/module.py): kernels cut into many parts, claimed by 2, 3
    and 7 threads on this 2-core machine (so some are descheduled mid-run and the others take their
    parts); every result must equal the single-threaded one bit for bit."""
    import svodc
    from svodc.codegen.module import parallel_parts
    from svodc.frontend.importer import import_model
    from svodc.gpu_target import parse_targets
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program
    from svodc.policy import gemm_blocking
    from tests.onnx_util import make_model

    r = np.random.default_rng(3)
    nodes = [onnx_helper.make_node("MatMul", ["x", "w"], ["m"]), onnx_helper.make_node("Relu", ["m"], ["r"]),
             onnx_helper.make_node("Mul", ["r", "r"], ["q"]), onnx_helper.make_node("Softmax", ["q"], ["y"])]
    # big enough (~1 ms on one thread) that the runtime uses the threads (AUTO_PARALLEL_MIN_S)
    model = make_model(nodes, {"x": (np.float32, [512, 512])}, ["y"],
                       {"w": (r.standard_normal((512, 512)) * 0.05).astype(np.float32)})
    program = build_program(import_model(model, CompileOptions()), CompileOptions())
    host = parse_targets("host")[0]
    blocking = gemm_blocking(host)
    assert max(parallel_parts(k, host, blocking) for k in program.kernels) >= 8  # the queue really has parts to share
    bundle = svodc.compile(model)
    feeds = {"x": r.standard_normal((512, 512)).astype(np.float32)}
    with svodrt.load(bundle, threads=1) as m:
        want = m.run(feeds)["y"]
    for threads in (2, 3, 7):
        with svodrt.load(bundle, threads=threads) as m:
            for _ in range(20):
                np.testing.assert_array_equal(m.run(feeds)["y"], want)
            assert m._parallel, "the model ran single-threaded: the test would not exercise the work queue"
    # concurrent calls on one model: one at a time gets the helper threads, the others run alone
    with svodrt.load(bundle, threads=1) as m:
        wants = [m.run({"x": feeds["x"] + np.float32(i)})["y"] for i in range(4)]
    with svodrt.load(bundle, threads=2) as m:
        assert _hammer(m, feeds, wants, threads=4, runs=10) == []


def test_kernels_of_one_part_are_the_calling_threads(small_bundle):
    """In the work queue (svodc/codegen/module.py) a kernel too small to split runs on thread 0 only: a
    helper entering alone skips every such kernel (small_model's are all one part) and returns without
    waiting, writing nothing; thread 0 then runs the whole call with the same sync block."""
    path, feeds = small_bundle
    with svodrt.load(path, threads=1) as m:
        want = m.run(feeds)["y"]
        out = np.full(m.outputs[0].shape, np.nan, np.float32)
        seen = []

        def helper_then_caller(table, sync) -> None:
            m._entry(table, None, 1, 2, sync)  # a helper alone: would hang or run kernels if it took tickets
            seen.append(out.copy())
            m._entry(table, None, 0, 2, sync)

        m._call(m.check_inputs(feeds), helper_then_caller, outs=[out])
    assert np.isnan(seen[0]).all(), "the helper ran a one-part kernel"
    np.testing.assert_array_equal(out, want)
