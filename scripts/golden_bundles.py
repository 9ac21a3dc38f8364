"""Write the golden bundles of the current format version into artifacts/v{MAJOR}.{MINOR}/, once.

Each golden is a tiny model compiled by today's svodc, with its input and, per code variant, the
outputs today's runtime gives (checked against onnxruntime here). tests/test_golden.py loads them
with every later runtime and wants the same outputs bit for bit. Existing files are never
overwritten: an old golden is the point of the exercise.

    .venv/bin/python scripts/golden_bundles.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.onnx_util import make_model, reference, small_cnn  # noqa: E402


def relu_add():
    w = np.linspace(-1, 1, 8, dtype=np.float32)
    model = make_model([helper.make_node("Add", ["x", "w"], ["s"]), helper.make_node("Relu", ["s"], ["y"]),
                        helper.make_node("Mul", ["x", "x"], ["z"])], {"x": (np.float32, [8])}, ["y", "z"], {"w": w})
    return model, {"x": np.arange(-4, 4, dtype=np.float32) * 0.3}


GOLDENS = {
    "relu_add": (relu_add, "x86_64-linux-gnu:x86-64-v3,x86-64"),
    "small_cnn": (small_cnn, "x86_64-linux-gnu:x86-64"),
}


def main() -> None:
    import svodc
    import svodrt
    from svodrt.format import FORMAT_MAJOR, FORMAT_MINOR

    folder = ROOT / "artifacts" / f"v{FORMAT_MAJOR}.{FORMAT_MINOR}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, (make, target) in GOLDENS.items():
        bundle, expected = folder / f"{name}.svod", folder / f"{name}.expected.npz"
        if bundle.exists() or expected.exists():
            print(f"{bundle.relative_to(ROOT)} exists: kept")
            continue
        model, feeds = make()
        data = svodc.compile(model, target=target, test_vectors=True)
        want = dict(zip([o.name for o in model.graph.output], reference(model, feeds), strict=True))
        arrays = {f"input.{k}": v for k, v in feeds.items()}
        for i in range(len(svodrt.load(data).bundle.variants)):
            with svodrt.load(data, threads=1, variant=i) as m:
                for k, v in m.run(feeds).items():
                    np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-6)
                    arrays[f"variant{i}.{k}"] = v
        bundle.write_bytes(data)
        np.savez(expected, **arrays)
        print(f"wrote {bundle.relative_to(ROOT)} ({len(data)} bytes) and {expected.name}")


if __name__ == "__main__":
    main()
