"""Issue 12, acceptance 4: one bundle with bounded dims vs a static bundle compiled for the size it runs,
gpt2 (seq 1..256, run at 16/128/256) and mobilenetv2 (batch 1..16, run at 1/8), one thread, runs
alternating in blocks as in run.py. Also the arenas: the dynamic one against the static bundle's at the
upper bound. Outputs of both are compared with each other (both are checked against onnxruntime by the
tests)."""

from __future__ import annotations

import numpy as np

from bench.models import SHARED

CASES = [  # model, bounded dims, fixed dims per size, input maker
    ("gpt2_small_random", {"batch": 1, "seq": (1, 256)}, [{"batch": 1, "seq": s} for s in (16, 128, 256)],
     lambda d, rng: {"input_ids": rng.integers(0, 8192, (d["batch"], d["seq"])).astype(np.int64)}),
    ("mobilenetv2_random", {"batch": (1, 16)}, [{"batch": b} for b in (1, 8)],
     lambda d, rng: {"input": rng.standard_normal((d["batch"], 3, 224, 224)).astype(np.float32)}),
]


def run(repeat: int) -> list[dict]:
    import svodc
    import svodrt
    from bench.run import _stats, _timed_block

    rows = []
    rng = np.random.default_rng(0)
    for name, bounded, sizes, make in CASES:
        path = SHARED / name / "model.onnx"
        if not path.exists():
            continue
        dyn = svodrt.load(svodc.compile(str(path), dims=bounded), threads=1)
        top = {k: v[1] if isinstance(v, tuple) else v for k, v in bounded.items()}
        with svodrt.load(svodc.compile(str(path), dims=top), threads=1) as at_bound:
            bound_arena = at_bound.bundle.arena_size
        for fixed in sizes:
            with svodrt.load(svodc.compile(str(path), dims=fixed), threads=1) as static:
                feeds = make(fixed, rng)
                for a, b in zip(dyn.run(feeds).values(), static.run(feeds).values(), strict=True):
                    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.abs(b).max()))
                td, ts = [], []
                for _ in range(-(-repeat // 5)):
                    td += _timed_block(dyn.run, feeds)
                    ts += _timed_block(static.run, feeds)
                (md, _), (ms, _) = _stats(td), _stats(ts)
                rows.append({"model": name, "size": ", ".join(f"{k}={v}" for k, v in fixed.items()),
                             "dynamic_ms": 1e3 * md, "static_ms": 1e3 * ms, "ratio": md / ms,
                             "arena_mb": dyn.bundle.arena_size / 1e6, "bound_arena_mb": bound_arena / 1e6})
                print(f"  {name} {rows[-1]['size']}: dynamic/static {md / ms:.3f}", flush=True)
        dyn.close()
    return rows


def report(rows: list[dict]) -> list[str]:
    from bench.report import geomean

    if not rows:
        return []
    lines = ["", "## Bounded dims: one bundle for a range vs a bundle per size (1 thread)", "",
             "| model | size | dynamic median ms | static median ms | ratio | arena MB | static arena at bound MB |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['size']} | {r['dynamic_ms']:.2f} | {r['static_ms']:.2f} | "
                     f"{r['ratio']:.2f} | {r['arena_mb']:.1f} | {r['bound_arena_mb']:.1f} |")
    lines += ["", f"Geometric mean of ratios: **{geomean([r['ratio'] for r in rows]):.2f}**; worst: "
                  f"{max(r['ratio'] for r in rows):.2f}."]
    return lines
