"""GEMM micro-benchmark: svod's f32 GEMM against numpy's OpenBLAS, both with runtime operands.

numpy runs in a subprocess with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (they may be set on
these machines to work around old OpenBLAS bugs, and slow a current numpy down) and with
OPENBLAS_NUM_THREADS set to the thread count being measured. The subprocess stays up and times a block
of runs when asked, so svod's and numpy's blocks alternate (like bench/run.py's models): both see the
same machine state, which on a shared machine moves within seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

SHAPES = [(1024, 1024, 1024), (256, 2304, 196), (512, 4608, 49), (64, 576, 3136), (128, 768, 3072)]
BLOCK = 5  # timed runs per block, after an untimed one
# A pause before each block, longer than the other engine's threads spin after a call: OpenBLAS's about 100 ms,
# ours 12-16 ms (helper-thread CPU time in the pause after a call, Zen 4 2 vCPU, 2026-12-02). At 50 ms OpenBLAS's
# spinning thread still held one of the two CPUs during svod's block.
BLOCK_GAP_S = 0.15

# Reads a run count per line and answers with that many wall times (seconds, one line).
NUMPY = r"""
import sys, time, numpy as np
m, k, n = map(int, sys.argv[1:4])
r = np.random.default_rng(0)
a = r.standard_normal((m, k)).astype(np.float32); b = r.standard_normal((k, n)).astype(np.float32)
for line in sys.stdin:
    a @ b
    ts = []
    for _ in range(int(line)):
        t = time.perf_counter(); a @ b; ts.append(time.perf_counter() - t)
    print(*ts, flush=True)
"""


class NumpyGemm:
    """numpy's a @ b of one shape in a subprocess with `threads` OpenBLAS threads; block() times runs."""

    def __init__(self, m: int, k: int, n: int, threads: int):
        env = {key: v for key, v in os.environ.items() if key not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
        env["OPENBLAS_NUM_THREADS"] = str(threads)
        self.proc = subprocess.Popen([sys.executable, "-c", NUMPY, str(m), str(k), str(n)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def block(self, runs: int) -> list[float]:
        self.proc.stdin.write(f"{runs}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the numpy GEMM subprocess exited with {self.proc.wait()}")
        return [float(x) for x in line.split()]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def _svod_block(model, feeds: dict, runs: int) -> list[float]:
    model.run(feeds)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        model.run(feeds)
        ts.append(time.perf_counter() - t)
    return ts


def timed(bundle: bytes, feeds: dict, shape: tuple[int, int, int], threads: int, reps: int) -> tuple[float, float]:
    """(svod, numpy) median seconds over about `reps` runs each, in alternating blocks."""
    import svodrt

    ours, blas = [], []
    numpy_gemm = NumpyGemm(*shape, threads)
    try:
        with svodrt.load(bundle, threads=threads) as model:
            for _ in range(-(-reps // BLOCK)):
                time.sleep(BLOCK_GAP_S)
                ours += _svod_block(model, feeds, BLOCK)
                time.sleep(BLOCK_GAP_S)
                blas += numpy_gemm.block(BLOCK)
    finally:
        numpy_gemm.close()
    return float(np.median(ours)), float(np.median(blas))


def run(threads: list[int], reps: int = 15) -> list[dict]:
    from onnx import helper

    import svodc
    from tests.onnx_util import make_model

    rows = []
    for m, k, n in SHAPES:
        model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                           {"a": (np.float32, [m, k]), "b": (np.float32, [k, n])}, ["y"])
        bundle = svodc.compile(model)
        r = np.random.default_rng(0)
        feeds = {"a": r.standard_normal((m, k)).astype(np.float32), "b": r.standard_normal((k, n)).astype(np.float32)}
        row = {"shape": f"{m}x{k}x{n}"}
        flops = 2 * m * n * k
        for t in threads:
            ours, blas = timed(bundle, feeds, (m, k, n), t, reps)
            row[f"t{t}"] = {"svod_gflops": flops / ours / 1e9, "numpy_gflops": flops / blas / 1e9,
                            "ratio": blas / ours}
        cells = [f"{t} thr {row[f't{t}']['svod_gflops']:.0f} vs {row[f't{t}']['numpy_gflops']:.0f} GFLOP/s"
                 for t in threads]
        print(f"gemm {row['shape']}: " + ", ".join(cells), flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    run([int(t) for t in (sys.argv[1] if len(sys.argv) > 1 else "1,2").split(",")])
