"""Fuzz worker: `python -m tests.fuzzing.worker SEED START COUNT TMPDIR INPUTS.npz BUNDLE...`.

Runs attempts START .. START+COUNT-1. For each it prints `start I` before touching the mutated
bundle and `done I OUTCOME MUTATOR DESCRIPTION DETAIL` after, flushing both, so the parent can name
the attempt in flight if this process crashes or hangs. Imports only the runtime (no compiler).

Outcomes: format_error (BundleFormatError, the expected refusal), refused_host (UnsupportedHostError),
identical (it loaded and ran, and every output equals the original's for the same code image),
damaged_weights (it ran with other outputs because the damage is in the weights, which a load does
not checksum, and a load with verify_weights=True refuses it: docs/architecture.md "Runtime"); and
failures: different, error (any other exception), verify_error (svodrt verify raised instead of
reporting).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import svodrt
from svodrt_tools.verify import verify
from tests.fuzzing.mutations import Target, mutate

OK_OUTCOMES = ("format_error", "refused_host", "identical", "damaged_weights")


def expected_outputs(data: bytes, feeds: dict) -> dict[bytes, dict[str, np.ndarray]]:
    """Outputs of the original bundle per code image (by its sha256), for every variant this host runs."""
    out = {}
    bundle = svodrt.load(data, threads=1).bundle
    for v in bundle.variants:
        try:
            with svodrt.load(data, threads=1, variant=v.index) as m:
                out[v.section.sha256] = m.run(feeds)
        except svodrt.UnsupportedHostError:
            continue
    return out


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> bool:
    return list(got) == list(want) and all(
        g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes() for g, w in
        zip(got.values(), want.values(), strict=True))


def attempt(data: bytes | Path, feeds: dict, expected: dict, threads: int) -> tuple[str, str]:
    try:
        model = svodrt.load(data, threads=threads)
    except svodrt.BundleFormatError as e:
        return "format_error", str(e)
    except svodrt.UnsupportedHostError as e:
        return "refused_host", str(e)
    except Exception as e:  # a failure of the runtime's checks: reported, not raised
        return "error", f"load: {type(e).__name__}: {e}"
    with model:
        try:
            got = model.run(feeds)
        except Exception as e:
            return "error", f"run: {type(e).__name__}: {e}"
        want = expected.get(model.variant.section.sha256)
        if want is None or not _same(got, want):
            return _different(data, model), f"variant {model.variant.describe()}"
    return "identical", ""


def _different(data: bytes | Path, model: svodrt.Model) -> str:
    """damaged_weights when the weights checksum explains other outputs, else different."""
    try:
        svodrt.load(data, threads=1, verify_weights=True, variant=model.variant.index).close()
    except svodrt.BundleFormatError as e:
        if "section 'weights'" in str(e):
            return "damaged_weights"
    return "different"


def main(argv: list[str]) -> None:
    seed, start, count = int(argv[0]), int(argv[1]), int(argv[2])
    tmp, feeds = Path(argv[3]), dict(np.load(argv[4]))
    targets = [Target(Path(p).read_bytes()) for p in argv[5:]]
    expected = [expected_outputs(t.data, feeds) for t in targets]
    for i in range(start, start + count):
        k = i % len(targets)
        name, what, data = mutate(targets[k], seed, i)
        print(f"start {i}", flush=True)
        source: bytes | Path = data
        if i % 8 == 7:  # through a file too: the mmap path
            source = tmp / f"attempt{i % 64}.svod"
            source.write_bytes(data)
        outcome, detail = attempt(source, feeds, expected[k], threads=2 if i % 16 == 15 else 1)
        if i % 4 == 0 and outcome in OK_OUTCOMES:
            try:
                report = verify(data)
                first = report.failures[0] if report.failures else ""
                if outcome == "identical" and not report.ok and "section 'weights'" in first:
                    outcome = "damaged_weights"  # damage a load does not look for, changing no output
                elif outcome == "identical" and not report.ok and not first.startswith("test vector"):
                    outcome, detail = "verify_error", f"loads and runs but verify fails: {first}"
            except Exception as e:
                outcome, detail = "verify_error", f"{type(e).__name__}: {e}"
        detail = " ".join(detail.split())[:300]
        print(f"done {i} {outcome} {name} {what!r} {detail}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
