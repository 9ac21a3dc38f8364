"""`python -m tests.fuzzing [--count N] [--seed S] [--only I]` (make fuzz): compile two small bundles
(one variant with test vectors; three x86-64 levels), fuzz them, print outcome counts; exit 1 on any
crash, hang, wrong output or unexpected exception."""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import numpy as np


def make_targets(folder: Path) -> tuple[list[Path], Path]:
    import svodc
    from tests.onnx_util import small_cnn

    model, feeds = small_cnn()
    paths = [folder / "small.svod", folder / "fat.svod"]
    paths[0].write_bytes(svodc.compile(model, target="x86_64-linux-gnu:x86-64"))
    paths[1].write_bytes(svodc.compile(model, target="x86_64-linux-gnu:x86-64-v4,x86-64-v3,x86-64"))
    np.savez(folder / "inputs.npz", **feeds)
    return paths, folder / "inputs.npz"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.fuzzing")
    p.add_argument("--count", type=int, default=10000)
    p.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    p.add_argument("--batch", type=int, default=500, help="attempts per worker process")
    p.add_argument("--only", type=int, default=None, help="replay one attempt in this process and show it")
    p.add_argument("--load-s", type=float, default=1.0, help="the most seconds one load may take (0: no limit)")
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    with tempfile.TemporaryDirectory(prefix="svod-fuzz-targets-") as tmp:
        bundles, inputs = make_targets(Path(tmp))
        if args.only is not None:
            from tests.fuzzing.worker import main as worker_main

            worker_main([str(seed), str(args.only), "1", tmp, str(inputs), str(args.load_s), *map(str, bundles)])
            return
        from tests.fuzzing.driver import run_fuzz

        print(f"fuzzing with seed {seed}", flush=True)
        result = run_fuzz(bundles, inputs, args.count, seed, batch=args.batch, load_s=args.load_s)
    print(result.summary())
    sys.exit(1 if result.failures else 0)


if __name__ == "__main__":
    main()
