"""Fuzz worker: `python -m tests.fuzzing.worker SEED START COUNT TMPDIR INPUTS.npz LOAD_S BUNDLE...`.

Runs attempts START .. START+COUNT-1. For each it prints `start I` before touching the mutated
bundle and `done I OUTCOME MUTATOR DESCRIPTION DETAIL` after, flushing both, so the parent can name
the attempt in flight if this process crashes or hangs. Imports only the runtime (no compiler).

Outcomes: format_error (BundleFormatError, the expected refusal), refused_host (UnsupportedHostError),
identical (it loaded and ran, and every output equals the original's for the same code image),
damaged_weights (it ran with other outputs because the damage is in weights larger than a load
checksums, WEIGHTS_CHECK_LIMIT, and a load with verify_weights=True refuses it: docs/architecture.md
"Runtime"); and
failures: different, error (any other exception), verify_error (svodrt verify raised instead of
reporting), over_budget (a load that raised this process's peak memory by more than LOAD_MB above
the bundle's declared weights and I/O, or took longer than LOAD_S seconds; LOAD_S 0: no time limit,
as in make test, whose tests never judge by wall time).
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

import numpy as np

import svodrt
from svodrt.format import WEIGHTS_CHECK_LIMIT
from svodrt_tools.verify import verify
from tests.fuzzing.mutations import Target, mutate

OK_OUTCOMES = ("format_error", "refused_host", "identical", "damaged_weights")
LOAD_MB = 100


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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


def attempt(data: bytes | Path, feeds: dict, expected: dict, threads: int, load_s: float) -> tuple[str, str]:
    peak, t0 = _peak_mb(), time.perf_counter()
    try:
        model = svodrt.load(data, threads=threads)
    except svodrt.BundleFormatError as e:
        return _budget(peak, t0, 0, load_s) or ("format_error", str(e))
    except (svodrt.UnsupportedHostError, svodrt.RuntimeFailure) as e:  # RuntimeFailure: more memory than the host
        return _budget(peak, t0, 0, load_s) or ("refused_host", str(e))
    except Exception as e:  # a failure of the runtime's checks: reported, not raised
        return "error", f"load: {type(e).__name__}: {e}"
    b = model.bundle
    over = _budget(peak, t0, b.weights.length + sum(x.nbytes for x in (*b.inputs, *b.outputs)), load_s)
    if over:
        model.close()
        return over
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
        if "section 'weights'" in str(e) and model.bundle.weights.length > WEIGHTS_CHECK_LIMIT:
            return "damaged_weights"
    return "different"


def _budget(peak_mb: float, t0: float, declared: int, load_s: float) -> tuple[str, str] | None:
    seconds, grown = time.perf_counter() - t0, _peak_mb() - peak_mb
    if grown > LOAD_MB + declared / (1 << 20) or (load_s and seconds > load_s):
        return "over_budget", f"load took {seconds:.2f} s and raised the peak memory by {grown:.0f} MB"
    return None


def main(argv: list[str]) -> None:
    seed, start, count = int(argv[0]), int(argv[1]), int(argv[2])
    tmp, feeds, load_s = Path(argv[3]), dict(np.load(argv[4])), float(argv[5])
    targets = [Target(Path(p).read_bytes()) for p in argv[6:]]
    expected = [expected_outputs(t.data, feeds) for t in targets]
    for i in range(start, start + count):
        k = i % len(targets)
        name, what, data = mutate(targets[k], seed, i)
        print(f"start {i}", flush=True)
        source: bytes | Path = data
        if i % 8 == 7:  # through a file too: the pread path
            source = tmp / f"attempt{i % 64}.svod"
            source.write_bytes(data)
        outcome, detail = attempt(source, feeds, expected[k], 2 if i % 16 == 15 else 1, load_s)
        if i % 4 == 0 and outcome in OK_OUTCOMES:
            try:
                report = verify(data)
                first = report.failures[0] if report.failures else ""
                if outcome == "identical" and not report.ok and "section 'weights'" in first:
                    outcome = "damaged_weights"  # damage a load does not look for, changing no output
                elif outcome == "identical" and not report.ok and not first.startswith("test vector") \
                        and "section 'test_vectors'" not in first:  # 1.9: only verify reads that section
                    outcome, detail = "verify_error", f"loads and runs but verify fails: {first}"
            except Exception as e:
                outcome, detail = "verify_error", f"{type(e).__name__}: {e}"
        detail = " ".join(detail.split())[:300]
        print(f"done {i} {outcome} {name} {what!r} {detail}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
