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


# (A_scale, B_scale, C_scale, A_zero, B_zero, C_zero): float32 proven exact, and not (a pair of 8-bit
# inputs where float32 rounds the other way exists)
ADD_PARAMS = {"float32": (0.06732655316591263, 0.03428080305457115, 0.013687617145478725, 19, 4, 44),
              "float64": (0.09346815198659897, 0.09711335599422455, 0.011323567479848862, 30, 221, 21)}


@pytest.mark.parametrize("kind", list(ADD_PARAMS))
def test_qlinear_add_equals_the_reference_on_every_pair(kind):
    """QLinearAdd over all 65,536 (a, b) uint8 pairs: the reference's integers whichever precision the
    compile-time check (contrib_quant._float32_add_is_exact) chose, and it chose `kind`."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    import svodc
    import svodrt
    from svodc.frontend.importer import import_model
    from svodc.ir.dtypes import dtypes
    from svodc.ir.uop import toposort
    from tests.contrib_reference import CONTRIB_OPS

    sa, sb, sc, za, zb, zc = ADD_PARAMS[kind]
    inits = [numpy_helper.from_array(np.float32(v), n) for n, v in (("sa", sa), ("sb", sb), ("sc", sc))]
    inits += [numpy_helper.from_array(np.uint8(v), n) for n, v in (("za", za), ("zb", zb), ("zc", zc))]
    node = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"], domain="com.microsoft")
    u8 = TensorProto.UINT8
    g = helper.make_graph([node], "add", [helper.make_tensor_value_info(n, u8, [256, 256]) for n in "ab"],
                          [helper.make_tensor_value_info("c", u8, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    grid = np.arange(256, dtype=np.uint8)
    feeds = {"a": np.repeat(grid[:, None], 256, 1), "b": np.repeat(grid[None, :], 256, 0)}
    want = ReferenceEvaluator(model, new_ops=CONTRIB_OPS).run(None, feeds)[0]
    with svodrt.load(svodc.compile(model)) as m:
        np.testing.assert_array_equal(m.run(feeds)["c"], want)
    nodes = toposort([u for _, u in import_model(model).outputs])
    assert any(n.dtype is dtypes.float64 for n in nodes) == (kind == "float64")
