"""On-hardware check of the CUDA path (NOT run yet: no session so far had a GPU). One go on a machine
with an NVIDIA GPU (written for an H200, sm_90):

  1. compile the onnx package's 9 light models (random-weight variants, tests/light_models.py) and,
     when present, gpt2_small_random (shared/models: it needs ops another engineer is adding; a
     model svodc cannot compile yet is reported as skipped with the reason) for sm_90;
  2. run each through svodrt's CUDA path (libcuda.so.1 via ctypes) with the launch list captured as
     a CUDA graph and without, and compare with the references (onnxruntime on the CPU for the light
     models, the shipped outputs.npz for shared/models);
  3. report per model: load time, first run, median latency of --repeat runs (graph and direct), max
     error against the tolerance; write everything to OUT/gpu_check.json. Exit 1 on any failure.

Usage on the device machine (svodc needs llvmlite 0.50 and svodrt zstandard; carry them as wheels,
see /work/.library/device/README.md; the repository must be the working directory):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \\
    PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py --out $OUT

gpt2_small_random (43 MB) and the wheels do not fit one 64 MiB transfer together: compile it here with
`python scripts/gpu_check.py --prepare DIR --models ../shared/models` (bundle + inputs + outputs in DIR,
no GPU needed), carry DIR, and run `scripts/gpu_check.py --bundles DIR --out $OUT` there (svodrt only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TARGET = "sm_90"
RTOL = 1e-3


def _light_case(name: str, folder: Path) -> dict:
    """Compile a light model's random-weight variant; save bundle, inputs and onnxruntime's outputs."""
    import svodc
    from tests.light_models import dummy_inputs, random_weight_variant

    model = random_weight_variant(name)
    feeds = dummy_inputs(model)
    try:
        from tests.onnx_util import reference
    except ImportError as e:
        return {"model": name, "status": "skipped", "reason": f"no reference: {e} (onnxruntime is needed)"}
    want = dict(zip([o.name for o in model.graph.output], reference(model, feeds), strict=True))
    return _compile(svodc, model, name, feeds, want, folder)


def _shared_case(folder_in: Path, folder: Path) -> dict:
    import svodc

    with np.load(folder_in / "inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    with np.load(folder_in / "outputs.npz") as z:
        want = {k: z[k] for k in z.files}
    shapes = {k: tuple(v.shape) for k, v in feeds.items()}
    return _compile(svodc, str(folder_in / "model.onnx"), folder_in.name, feeds, want, folder, input_shapes=shapes)


def _compile(svodc, model, name: str, feeds: dict, want: dict, folder: Path, **options) -> dict:
    case = {"model": name}
    t0 = time.perf_counter()
    try:
        bundle = svodc.compile(model, target=TARGET, test_vectors=False, **options)
    except svodc.errors.SvodcError as e:
        return {**case, "status": "skipped", "reason": f"svodc cannot compile it yet: {e}"[:500]}
    case["compile_s"] = round(time.perf_counter() - t0, 2)
    (folder / f"{name}.svod").write_bytes(bundle)
    np.savez(folder / f"{name}.inputs.npz", **feeds)
    np.savez(folder / f"{name}.outputs.npz", **want)
    return {**case, "status": "compiled", "bundle_mb": round(len(bundle) / 1e6, 1)}


def prepare(folder: Path, models_dir: Path | None, light: bool, workers: int) -> list[dict]:
    folder.mkdir(parents=True, exist_ok=True)
    cases = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = []
        if light:
            from tests.light_models import LIGHT_MODELS

            futures += [pool.submit(_light_case, n, folder) for n in LIGHT_MODELS]
        gpt2 = models_dir / "gpt2_small_random" if models_dir else None
        if gpt2 is not None and (gpt2 / "model.onnx").exists():
            futures.append(pool.submit(_shared_case, gpt2, folder))
        else:
            cases.append({"model": "gpt2_small_random", "status": "skipped",
                          "reason": f"not found under {models_dir} (pass --models DIR)"})
        for f in futures:
            case = f.result()
            print(f"  compiled {case['model']}: {case.get('status')} {case.get('compile_s', '')}", flush=True)
            cases.append(case)
    return cases


def _median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(1e3 * float(np.median(times)), 3)


def run_case(folder: Path, case: dict, device: str, repeat: int) -> dict:
    import svodrt

    name = case["model"]
    with np.load(folder / f"{name}.inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    with np.load(folder / f"{name}.outputs.npz") as z:
        want = {k: z[k] for k in z.files}
    path = folder / f"{name}.svod"
    for graph in (True, False):
        key = "graph" if graph else "direct"
        try:
            t0 = time.perf_counter()
            m = svodrt.load(path, device=device, graph=graph)
            case[f"load_ms_{key}"] = round(1e3 * (time.perf_counter() - t0), 2)
            t0 = time.perf_counter()
            got = m.run(feeds)
            case[f"first_run_ms_{key}"] = round(1e3 * (time.perf_counter() - t0), 3)
            case[f"median_ms_{key}"] = _median_ms(lambda m=m: m.run(feeds), repeat)
            case["code"] = f"{m.variant.describe()} ({m.code_kind}) on {m.device.name}"
            m.close()
        except svodrt.SvodError as e:
            case.update(status="FAIL", reason=f"{key}: {e}"[:800])
            return case
        errors = {}
        for out, w in want.items():
            g = got[out]
            tol = RTOL * float(np.abs(w).max()) + 1e-5
            err = float(np.abs(g.astype(np.float64) - w).max()) if w.size else 0.0
            errors[out] = {"max_error": err, "tolerance": tol, "ok": bool(err <= tol and np.isfinite(err))}
        case[f"errors_{key}"] = errors
    ok = all(e["ok"] for key in ("graph", "direct") for e in case[f"errors_{key}"].values())
    case["status"] = "ok" if ok else "FAIL"
    return case


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("gpu_check_out"), help="where gpu_check.json goes")
    p.add_argument("--models", type=Path, default=ROOT.parent / "shared" / "models",
                   help="the shared models folder (gpt2_small_random)")
    p.add_argument("--prepare", type=Path, help="only compile into this folder (no GPU needed)")
    p.add_argument("--bundles", type=Path, help="only run the bundles a --prepare made (svodrt only)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--no-light", action="store_true", help="skip the light models")
    args = p.parse_args()
    workers = max(1, min(9, (os.cpu_count() or 2) // 2))
    if args.bundles:
        folder = args.bundles
        cases = json.loads((folder / "cases.json").read_text())
    else:
        folder = args.prepare or Path("/tmp/svod_gpu_check")
        cases = prepare(folder, args.models, not args.no_light, workers)
        (folder / "cases.json").write_text(json.dumps(cases, indent=1))
        if args.prepare:
            print(f"prepared {folder}")
            return
    results = [run_case(folder, c, args.device, args.repeat) if c["status"] == "compiled" else c for c in cases]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(results, indent=1))
    print(f"{'model':22s} {'status':8s} {'load ms':>8s} {'graph ms':>9s} {'direct ms':>9s}  code")
    for r in results:
        print(f"{r['model']:22s} {r['status']:8s} {r.get('load_ms_graph', ''):>8} {r.get('median_ms_graph', ''):>9} "
              f"{r.get('median_ms_direct', ''):>9}  {r.get('code', r.get('reason', ''))}")
    sys.exit(1 if any(r["status"] == "FAIL" for r in results) else 0)


if __name__ == "__main__":
    main()
