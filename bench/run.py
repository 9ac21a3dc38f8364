"""make bench: svod and onnxruntime side by side, in one run, on the same inputs.

Per model and thread count: median and p90 latency of each (runs alternate in blocks of 5, so both see the same
machine state) and their ratio, with how much the ratio moved from block to block (the run's own noise,
next to the machine's load average before and after); OpenVINO's ratio to onnxruntime when it is
installed; load time (svodrt.load, after a first load recorded the weights' check, vs InferenceSession
creation); whole-process cold start (a fresh python that loads and produces the first output) and that
process's peak resident memory; bundle vs .onnx size; compile time. Plus a GEMM micro-benchmark against numpy's
OpenBLAS. Writes docs/benchmarks.md and docs/benchmarks.png. This is a benchmark, not a test: it
asserts nothing about time, but it does check every output against onnxruntime.
"""

from __future__ import annotations

import argparse
import compileall
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import dynamic, flops, gemm, report  # noqa: E402
from bench.models import all_models, load  # noqa: E402

COLD = r"""
import sys, time
t0 = time.perf_counter()
import numpy as np
feeds = dict(np.load(sys.argv[3]))
if sys.argv[1] == "svod":
    import svodrt
    m = svodrt.load(sys.argv[2], threads=1)
    out = m.run(feeds)
else:
    import onnxruntime as ort
    so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.log_severity_level = 3
    s = ort.InferenceSession(sys.argv[2], so, providers=["CPUExecutionProvider"])
    out = s.run(None, feeds)
elapsed = time.perf_counter() - t0
# VmHWM, not ru_maxrss: ru_maxrss survives exec and so counts the parent's pages at fork time.
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(elapsed, hwm)
"""


def _ort_session(path: Path, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


# Runs alternate in blocks, not one by one: onnxruntime's pool threads spin for a while after each
# run, and a run of ours started right after one finds the other core taken (and vice versa). Each
# block starts after a pause with an untimed run, so neither engine is timed against the other's
# leftovers.
BLOCK = 5
# And a pause first, longer than the other engine's threads spin after a run: onnxruntime's 35-45 ms, ours 12-16 ms
# (helper-thread CPU time in the pause after a run, Zen 4 2 vCPU, 2026-12-02); OpenVINO's do not spin.
BLOCK_GAP_S = 0.08


def _timed_block(run, *args) -> list[float]:
    time.sleep(BLOCK_GAP_S)
    run(*args)
    ts = []
    for _ in range(BLOCK):
        t = time.perf_counter()
        run(*args)
        ts.append(time.perf_counter() - t)
    return ts


def _stats(ts: list[float]) -> tuple[float, float]:
    return float(np.median(ts)), float(np.percentile(ts, 90))


def _openvino(path: Path, threads: int):
    """An OpenVINO CPU inference request for the model (reads ONNX), or None when openvino is not
    installed (it is in the bench extra) or cannot compile the model."""
    try:
        import openvino as ov
    except ImportError:
        return None
    try:
        # f32: on a CPU with avx512_bf16 (Zen 4 and 5) OpenVINO otherwise computes in bfloat16, whose outputs
        # differ from onnxruntime's past the check below (and it would not be the same work)
        compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                              "PERFORMANCE_HINT": "LATENCY",
                                                              "INFERENCE_PRECISION_HINT": "f32"})
    except Exception as e:  # a model OpenVINO does not take is a blank cell, not a crash
        print(f"  openvino: {type(e).__name__}: {str(e)[:120]}", flush=True)
        return None
    request = compiled.create_infer_request()
    return lambda feeds: [np.asarray(v) for v in request.infer(feeds).values()]


def _close(got: list[np.ndarray], ref: list[np.ndarray], atol: float = 0.0) -> bool:
    return all(np.allclose(g, w, rtol=1e-3, atol=atol + 1e-4 * max(float(np.abs(w).max()), 1e-30))
               for g, w in zip(got, ref, strict=True))


def noise(block_ratios: list[float]) -> float:
    """How much this run's own measurements moved: half the spread between the 10th and 90th
    percentiles of the per-block ratios, relative to their median (0.05: blocks within about +-5 %)."""
    lo, mid, hi = np.percentile(block_ratios, [10, 50, 90])
    return float((hi - lo) / 2 / mid)


def cold_start(engine: str, model_path: Path, inputs: Path, repeat: int) -> tuple[float, float]:
    """(median wall seconds from process start to first output, median peak RSS in MB)."""
    walls, rss = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", COLD, engine, str(model_path), str(inputs)], capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        wall = time.perf_counter() - t
        if out.returncode != 0:
            raise RuntimeError(f"cold start of {engine} failed: {out.stderr[-500:]}")
        walls.append(wall)
        rss.append(float(out.stdout.split()[1]) / 1024)
    return float(np.median(walls)), float(np.median(rss))


def bench_model(name: str, work: Path, repeat: int, threads: list[int]) -> dict:
    import svodc
    import svodrt
    from svodrt.bundle import RECORD_AGE_NS

    bm = load(name)
    onnx_path = work / f"{name}.onnx"
    onnx_path.write_bytes(bm.model.SerializeToString())
    inputs, svod_inputs = work / f"{name}.npz", work / f"{name}.svod.npz"
    np.savez(inputs, **bm.feeds)
    np.savez(svod_inputs, **bm.svod_feeds)
    row: dict = {"model": name, "note": bm.note, "onnx_mb": onnx_path.stat().st_size / 1e6,
                 "gflop": flops.counted_gflop(bm.model, bm.feeds)}
    t = time.perf_counter()
    try:
        bundle = svodc.compile_to_file(onnx_path, work / f"{name}.svod", dims=bm.dims, input_shapes=bm.input_shapes,
                                        input_values=bm.fixed)
    except Exception as e:  # an unsupported model is a row in the report, not a crash of the benchmark
        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        return row
    row["compile_s"] = time.perf_counter() - t
    row["bundle_mb"] = bundle.stat().st_size / 1e6

    # Timed as a deployed bundle loads: after its first load recorded the weights' check (svodrt/bundle.py
    # WeightsRecord), which needs a file unchanged for RECORD_AGE_NS.
    time.sleep(max(0.0, RECORD_AGE_NS / 1e9 - (time.time() - bundle.stat().st_ctime)))
    svodrt.load(bundle, threads=1).close()
    loads = []
    for _ in range(max(5, repeat // 2)):
        t = time.perf_counter()
        m = svodrt.load(bundle, threads=1)
        loads.append(time.perf_counter() - t)
        m.close()
    sessions = []
    for _ in range(3):
        t = time.perf_counter()
        _ort_session(onnx_path, 1)
        sessions.append(time.perf_counter() - t)
    row["load_ms"] = 1e3 * float(np.median(loads))
    row["session_ms"] = 1e3 * float(np.median(sessions))

    for n in threads:
        model = svodrt.load(bundle, threads=n)
        sess = _ort_session(onnx_path, n)
        ours = model.run(bm.svod_feeds)
        ref = sess.run(None, bm.feeds)
        errs = []
        for got, want in zip(ours.values(), ref, strict=True):
            scale = max(float(np.abs(want).max()), 1e-30)
            err = float(np.abs(got.astype(np.float64) - want).max()) / scale
            errs.append(err)
        row["max_rel_err"] = max(errs)
        row["correct"] = _close(list(ours.values()), ref, bm.atol)
        ov_run = _openvino(onnx_path, n)
        if ov_run is not None and not _close(ov_run(bm.feeds), ref, bm.atol):
            print("  openvino: outputs differ from onnxruntime's; not timed", flush=True)
            ov_run = None
        ts_s, ts_o, ts_v, block_ratios = [], [], [], []
        for _ in range(-(-repeat // BLOCK)):
            block_s = _timed_block(model.run, bm.svod_feeds)
            block_o = _timed_block(sess.run, None, bm.feeds)
            if ov_run is not None:
                ts_v += _timed_block(ov_run, bm.feeds)
            ts_s += block_s
            ts_o += block_o
            block_ratios.append(float(np.median(block_s) / np.median(block_o)))
        (ms, ps), (mo, po) = _stats(ts_s), _stats(ts_o)
        row[f"t{n}"] = {"svod_ms": 1e3 * ms, "svod_p90": 1e3 * ps, "ort_ms": 1e3 * mo, "ort_p90": 1e3 * po,
                        "ratio": ms / mo, "noise": noise(block_ratios)}
        if ts_v:
            row[f"t{n}"]["ov_ratio"] = float(np.median(ts_v)) / mo
        model.close()
        del sess
    row["cold_svod_s"], row["rss_svod_mb"] = cold_start("svod", bundle, svod_inputs, 3)
    row["cold_ort_s"], row["rss_ort_mb"] = cold_start("ort", onnx_path, inputs, 3)
    return row


def machine() -> dict:
    import llvmlite
    import onnxruntime

    cpu = platform.processor()
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                    if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        if "model name" in info:
            cpu = info["model name"] + (f" (family {info['cpu family']} model {info['model']})"
                                        if "cpu family" in info and "model" in info else "")
    except OSError:
        pass
    try:
        import openvino

        ov_version = openvino.__version__
    except ImportError:
        ov_version = None
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "onnxruntime": onnxruntime.__version__, "llvmlite": llvmlite.__version__, "openvino": ov_version,
            "date": datetime.date.today().isoformat()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help="subset of models (default: all)")
    p.add_argument("--repeat", type=int, default=30, help="timed runs per engine and thread count")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--no-gemm", action="store_true")
    p.add_argument("--no-dynamic", action="store_true", help="skip the bounded-dims comparison (bench/dynamic.py)")
    p.add_argument("--out", default=str(ROOT / "docs"))
    args = p.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    rows = []
    # An installed svodrt has its bytecode compiled (pip does it); a checkout may not, and recompiling its
    # sources in every cold-start process (PYTHONDONTWRITEBYTECODE, stale caches) is not a cost users pay.
    compileall.compile_dir(str(ROOT / "svodrt"), quiet=1)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="svod-bench-") as tmp:
        for name in all_models(args.models or None):
            print(f"== {name}", flush=True)
            row = bench_model(name, Path(tmp), args.repeat, threads)
            print(report.row_summary(row, threads), flush=True)
            rows.append(row)
    gemm_rows = [] if args.no_gemm else gemm.run(threads)
    # the 1-minute load average: other work on the machine during the run (ours adds about 1 per thread)
    dynamic_rows = [] if args.no_dynamic else dynamic.run(args.repeat)
    load = {"before": load_before, "after": os.getloadavg()[0]}
    report.write(Path(args.out), {**machine(), "load": load}, rows, gemm_rows, threads, dynamic.report(dynamic_rows))


if __name__ == "__main__":
    main()
