"""Trigonometric, hyperbolic and inverse functions, Round and Ceil, written in the IR by
codegen/transcendental.py: ulp error against float64 references and IEEE special values."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_codegen import run_unary, sweep, ulp_error

_r = np.random.default_rng(2)
_X = sweep(np.float32)
_UNIT = np.concatenate([np.linspace(-1, 1, 20001), _r.uniform(-1, 1, 5000), 1 - np.exp(_r.uniform(-30, 0, 2000)),
                        -1 + np.exp(_r.uniform(-30, 0, 2000))]).astype(np.float32)

CASES = {  # op: (reference, inputs, max ulp)
    "Cos": (np.cos, _X[np.abs(_X) < 1000], 3),
    "Tan": (np.tan, _X[np.abs(_X) < 1000], 4),
    "Atan": (np.arctan, _X, 3),
    "Asin": (np.arcsin, _UNIT, 3),
    "Acos": (np.arccos, _UNIT, 3),
    "Sinh": (np.sinh, _X[np.abs(_X) < 89], 3),
    "Cosh": (np.cosh, _X[np.abs(_X) < 89], 3),
    "Asinh": (np.arcsinh, _X, 3),
    "Acosh": (np.arccosh, np.abs(_X)[np.abs(_X) >= 1], 3),
    "Atanh": (np.arctanh, _UNIT[np.abs(_UNIT) < 1], 3),
}


@pytest.mark.parametrize("op", list(CASES))
def test_float32_accuracy(op):
    ref, x, max_ulp = CASES[op]
    got = run_unary(op, x)
    assert ulp_error(got, ref(x.astype(np.float64)), np.float32) <= max_ulp


SPECIAL = {
    "Cos": [0.0, -0.0, np.nan, np.inf],
    "Tan": [0.0, -0.0, np.nan, np.inf],
    "Atan": [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30],
    "Asin": [1.0, -1.0, 0.0, -0.0, 1.0000001, -2.0, np.nan],
    "Acos": [1.0, -1.0, 0.0, 1.0000001, -2.0, np.nan],
    "Sinh": [0.0, -0.0, 89.4, -89.4, 90.0, np.inf, -np.inf, np.nan, 1e-30],
    "Cosh": [0.0, 89.4, -89.4, 90.0, np.inf, -np.inf, np.nan],
    "Asinh": [0.0, -0.0, 3e38, -3e38, np.inf, -np.inf, np.nan, 1e-30],
    "Acosh": [1.0, 0.5, 3e38, np.inf, np.nan, -1.0],
    "Atanh": [0.0, -0.0, 1.0, -1.0, 1.5, np.nan, 1e-30],
}


@pytest.mark.parametrize("op", list(SPECIAL))
def test_special_values(op):
    x = np.array(SPECIAL[op], np.float32)
    with np.errstate(all="ignore"):
        want = CASES[op][0](x.astype(np.float64)).astype(np.float32)
    got = run_unary(op, x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=3e-7, atol=0)
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))


@pytest.mark.parametrize("op,ref", [("Round", np.round), ("Ceil", np.ceil), ("Floor", np.floor)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rounding_is_exact(op, ref, dtype):
    halves = np.arange(-20, 20) + 0.5
    x = np.concatenate([halves, np.nextafter(halves, 0), np.nextafter(halves, 100), [0.0, -0.0, -0.3, 0.3, 1e20, -1e20,
                        2.0 ** 52 + 1, np.inf, -np.inf, np.nan], _X.astype(np.float64)]).astype(dtype)
    got = run_unary(op, x)
    want = ref(x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
