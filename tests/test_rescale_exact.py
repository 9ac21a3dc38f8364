"""The compile-time proof that a float32 requantization gives the reference's float64 integers
(svodc/frontend/ops/rescale_exact.py), checked against brute force; and that the quantized ops use
float32 only where it holds."""

from __future__ import annotations

import numpy as np
import pytest

from svodc.frontend.ops.rescale_exact import float32_rescale, float32_rescale_is_exact, float64_rescale

R = np.random.default_rng(3)
RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


def differs_somewhere(f: np.float32, z: int, lo: int, hi: int) -> bool:
    """Brute force, independent of the proof's window: every accumulator twice as far out as the
    unsaturated range, and random ones over all of int32."""
    span = int((hi - lo) / f) + 10
    near = np.arange(int((lo - z) / f) - span, int((hi - z) / f) + span, dtype=np.int64)
    far = R.integers(np.iinfo(np.int32).min, np.iinfo(np.int32).max, 100_000, dtype=np.int64, endpoint=True)
    acc = np.concatenate([near, far, [np.iinfo(np.int32).min, np.iinfo(np.int32).max]]).astype(np.int32)
    return bool((float32_rescale(acc, f, z, lo, hi) != float64_rescale(acc, f, z, lo, hi)).any())


@pytest.mark.parametrize("kind", list(RANGES))
def test_proof_agrees_with_brute_force(kind):
    lo, hi = RANGES[kind]
    verdicts = []
    for f in R.uniform(0.002, 0.05, 30).astype(np.float32):
        z = int(R.integers(lo, hi + 1))
        exact = float32_rescale_is_exact(f, np.int64(z), lo, hi)
        assert exact == (not differs_somewhere(f, z, lo, hi)), (f, z)
        verdicts.append(exact)
    assert any(verdicts) and not all(verdicts)  # both outcomes occur for factors like real models'


def test_every_pair_of_per_channel_factors_is_checked():
    lo, hi = RANGES["uint8"]
    factors = R.uniform(0.002, 0.05, 60).astype(np.float32)
    alone = [float32_rescale_is_exact(f, np.int64(7), lo, hi) for f in factors]
    assert float32_rescale_is_exact(factors.reshape(1, -1, 1, 1), np.int64(7), lo, hi) == all(alone)
    good = factors[np.asarray(alone)]
    assert float32_rescale_is_exact(good.reshape(1, -1, 1, 1), np.int64(7), lo, hi)


@pytest.mark.parametrize("factor", [0.0, -0.01, np.inf, np.nan, 1e-9])
def test_no_proof_keeps_float64(factor):
    """Non-positive or non-finite factors, and a window too long to enumerate (a tiny factor)."""
    assert not float32_rescale_is_exact(np.float32(factor), np.int64(0), 0, 255)
