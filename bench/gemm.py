"""GEMM micro-benchmark: svod's f32 GEMM against numpy's OpenBLAS, both with runtime operands.

numpy runs in a subprocess with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (they may be set on
these machines to work around old OpenBLAS bugs, and slow a current numpy down) and with
OPENBLAS_NUM_THREADS set to the thread count being measured.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

SHAPES = [(1024, 1024, 1024), (256, 2304, 196), (512, 4608, 49), (64, 576, 3136), (128, 768, 3072)]

NUMPY = r"""
import sys, time, numpy as np
m, k, n, reps = map(int, sys.argv[1:5])
r = np.random.default_rng(0)
a = r.standard_normal((m, k)).astype(np.float32); b = r.standard_normal((k, n)).astype(np.float32)
a @ b
ts = []
for _ in range(reps):
    t = time.perf_counter(); a @ b; ts.append(time.perf_counter() - t)
print(np.median(ts))
"""


def numpy_seconds(m: int, k: int, n: int, threads: int, reps: int) -> float:
    env = {key: v for key, v in os.environ.items() if key not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    out = subprocess.run([sys.executable, "-c", NUMPY, str(m), str(k), str(n), str(reps)], capture_output=True,
                         text=True, env=env, check=True)
    return float(out.stdout)


def svod_seconds(bundle: bytes, feeds: dict, threads: int, reps: int) -> float:
    import svodrt

    with svodrt.load(bundle, threads=threads) as model:
        model.run(feeds)
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            model.run(feeds)
            ts.append(time.perf_counter() - t)
    return float(np.median(ts))


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
            ours = svod_seconds(bundle, feeds, t, reps)
            blas = numpy_seconds(m, k, n, t, reps)
            row[f"t{t}"] = {"svod_gflops": flops / ours / 1e9, "numpy_gflops": flops / blas / 1e9,
                            "ratio": blas / ours}
        cells = [f"{t} thr {row[f't{t}']['svod_gflops']:.0f} vs {row[f't{t}']['numpy_gflops']:.0f} GFLOP/s"
                 for t in threads]
        print(f"gemm {row['shape']}: " + ", ".join(cells), flush=True)
        rows.append(row)
    return rows
