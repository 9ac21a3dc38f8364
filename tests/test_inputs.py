"""Every class of wrong input is rejected with its message before native code runs; layouts the code
cannot read directly (non-contiguous, misaligned) are copied."""

from __future__ import annotations

import numpy as np
import pytest

import svodrt
from svodrt.bundle import TensorInfo
from svodrt.model import check_input

X = (2, 3, 8, 8)


class EntrySpy:
    """Wraps a real model's native call to count how often it is reached."""

    def __init__(self, model: svodrt.Model):
        self.calls = 0
        self._real = model._enter
        model._enter = self

    def __call__(self, table, sync, *dims) -> None:  # dims: only a bundle with bounded dims passes them
        self.calls += 1
        self._real(table, sync, *dims)


def _x(dtype=np.float32, shape=X) -> np.ndarray:
    return np.zeros(shape, dtype)


WRONG = [
    ("not a mapping", [("x", _x())], r"inputs must be a dict of name -> array, got list"),
    ("missing", {}, r"missing input 'x' \(float32\[2, 3, 8, 8\]\); the model's inputs are \['x'\]"),
    ("unexpected", {"x": _x(), "z": _x()}, r"unexpected input \['z'\]; the model's inputs are \['x'\]"),
    ("not an array", {"x": [[1.0]]}, r"input 'x' must be a numpy.ndarray, got list"),
    ("masked array", {"x": np.ma.masked_array(_x())}, r"must be a numpy.ndarray, got MaskedArray"),
    ("dtype", {"x": _x(np.float64)}, r"input 'x' has dtype float64, expected float32"),
    ("byte order", {"x": _x(np.dtype(">f4"))}, r"dtype >f4, expected float32 in big-endian byte order"),
    ("rank", {"x": _x(shape=(2, 3, 8))}, r"input 'x' has rank 3 \(shape \[2, 3, 8\]\), expected rank 4"),
    ("dim 0", {"x": _x(shape=(1, 3, 8, 8))}, r"input 'x' dim 0: got 1, expected 2"),
    ("dim 1", {"x": _x(shape=(2, 4, 8, 8))}, r"input 'x' dim 1: got 4, expected 3"),
    ("dim 2", {"x": _x(shape=(2, 3, 0, 8))}, r"input 'x' dim 2: got 0, expected 8"),
    ("dim 3", {"x": _x(shape=(2, 3, 8, 9))}, r"input 'x' dim 3: got 9, expected 8"),
    ("scalar", {"x": np.float32(1)}, r"must be a numpy.ndarray, got float32"),
]


@pytest.mark.parametrize("feeds,message", [w[1:] for w in WRONG], ids=[w[0] for w in WRONG])
def test_wrong_input_is_rejected_before_native_code(small_bundle, feeds, message):
    with svodrt.load(small_bundle[0], threads=1) as m:
        spy = EntrySpy(m)
        with pytest.raises(svodrt.InputError, match=message):
            m.run(feeds)
        assert spy.calls == 0
        m.run(small_bundle[1])  # the model is unharmed
        assert spy.calls == 1


def test_input_error_is_a_value_error(small_bundle):
    with svodrt.load(small_bundle[0], threads=1) as m, pytest.raises(ValueError):
        m.run({})


@pytest.mark.parametrize("layout", ["fortran", "strided", "misaligned", "read-only", "negative strides"])
def test_layouts_the_code_cannot_read_are_copied(small_bundle, layout):
    path, feeds = small_bundle
    x = feeds["x"]
    if layout == "fortran":
        view = np.asfortranarray(x)
    elif layout == "strided":
        view = np.repeat(x, 2, axis=3)[..., ::2]
    elif layout == "misaligned":
        raw = np.zeros(x.nbytes + 1, np.uint8)
        view = raw[1:].view(np.float32).reshape(x.shape)
        view[...] = x
        assert view.ctypes.data % 4
    elif layout == "read-only":
        view = x.copy()
        view.flags.writeable = False
    else:
        view = np.ascontiguousarray(x[..., ::-1])[..., ::-1]
    np.testing.assert_array_equal(view, x)
    with svodrt.load(path, threads=1) as m:
        np.testing.assert_array_equal(m.run({"x": view})["y"], m.run({"x": x})["y"])
    np.testing.assert_array_equal(view, x)  # inputs are never written


def test_sizes_are_checked_against_the_declaration():
    # A declaration and an array whose shapes agree always agree in bytes: check_input compares
    # the byte counts too, computed from the manifest with Python integers (no overflow).
    t = TensorInfo("w", "bfloat16", (3,))
    assert check_input(t, np.zeros(3, np.uint16)).nbytes == t.nbytes == 6
    with pytest.raises(svodrt.InputError, match=r"dtype float32, expected bfloat16 \(pass bfloat16 as its raw bits"):
        check_input(t, np.zeros(3, np.float32))
    big = TensorInfo("b", "float64", (1 << 20, 1 << 20))
    assert big.nbytes == 1 << 43  # exact, not wrapped
