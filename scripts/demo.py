"""make demo: compile a model that ships with a pinned dependency, run it with the runtime, and say
what happened.

The model is SqueezeNet 1.0 from the onnx package's "light" test models. Its weights there are
constant fills (so every class would score 0.001); the demo gives it seeded random weights first, so
the output is not uniform, and checks the result against onnxruntime.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.light_models import dummy_inputs, random_weight_variant  # noqa: E402


def main() -> None:
    import svodc

    model = random_weight_variant("squeezenet", seed=0)
    feeds = dummy_inputs(model)
    work = Path(tempfile.mkdtemp(prefix="svod-demo-"))
    onnx_path = work / "squeezenet.onnx"
    onnx_path.write_bytes(model.SerializeToString())
    bundle = work / "squeezenet.svod"
    print(f"model: SqueezeNet 1.0 (onnx package, random weights), {onnx_path.stat().st_size / 1e6:.1f} MB")

    t = time.perf_counter()
    svodc.compile_to_file(onnx_path, bundle, target="host")
    print(f"svodc compile --target host   {time.perf_counter() - t:6.2f} s  -> {bundle.name}, "
          f"{bundle.stat().st_size / 1e6:.1f} MB")

    # Run in a fresh process that has only the runtime, as a deployment would.
    np.savez(work / "input.npz", **feeds)
    code = (
        "import sys, time, numpy as np; t0 = time.perf_counter(); import svodrt; "
        "m = svodrt.load(sys.argv[1]); t1 = time.perf_counter(); x = dict(np.load(sys.argv[2])); "
        "t2 = time.perf_counter(); y = m.run(x); t3 = time.perf_counter(); "
        "[m.run(x) for _ in range(3)]; ts = []\n"
        "for _ in range(20):\n    t = time.perf_counter(); m.run(x); ts.append(time.perf_counter() - t)\n"
        "np.savez(sys.argv[3], **y); "
        "print(f'{1e3*(t1-t0):.2f} {1e3*(t3-t2):.2f} {1e3*float(np.median(ts)):.2f} {m.threads} {m.variant.cpu}')")
    out = subprocess.run([sys.executable, "-c", code, str(bundle), str(work / "input.npz"), str(work / "out.npz")],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    load_ms, first_ms, run_ms, threads, cpu = out.stdout.split()
    print(f"svodrt load (import + verify + map)  {float(load_ms):7.2f} ms  (variant {cpu})")
    print(f"svodrt first run                     {float(first_ms):7.2f} ms")
    print(f"svodrt run, median of 20             {float(run_ms):7.2f} ms  (up to {threads} threads)")

    outs = np.load(work / "out.npz")
    probs = outs["softmaxout_1"].reshape(-1)
    logits = outs[model.graph.output[1].name].reshape(-1)
    top = np.argsort(logits)[::-1][:5]
    print("top-5 classes (logit, probability):",
          ", ".join(f"{i} ({logits[i]:.1f}, {probs[i]:.3f})" for i in top))

    try:
        import onnxruntime as ort
    except ImportError:
        return
    so = ort.SessionOptions()
    so.log_severity_level = 3
    t = time.perf_counter()
    sess = ort.InferenceSession(str(onnx_path), so)
    t_sess = time.perf_counter() - t
    ref = sess.run(None, feeds)[1].reshape(-1)
    for _ in range(3):
        sess.run(None, feeds)
    ts = []
    for _ in range(20):
        t = time.perf_counter()
        sess.run(None, feeds)
        ts.append(time.perf_counter() - t)
    t_ort = float(np.median(ts))
    print(f"onnxruntime: session {1e3 * t_sess:.1f} ms, run {1e3 * t_ort:.2f} ms (median of 20); "
          f"max |svod - onnxruntime| over the logits = {np.abs(logits - ref).max():.2e} "
          f"(largest logit {np.abs(ref).max():.1f})")


if __name__ == "__main__":
    main()
