"""Bounded dims at run time (format 1.5): the code is laid out at the upper bounds and reads the dims' values
(checked here before native code runs) from the entry's `dims` array. Inputs laid out as at the bound pass as
they are, others are copied into a bound-shaped buffer; outputs are cut from bound-shaped ones."""

from __future__ import annotations

import ctypes
import math

import numpy as np

from svodrt.errors import InputError
from svodrt.schema import TensorInfo


def dim_values(inputs: list[TensorInfo], arrays: list[np.ndarray], order: tuple) -> ctypes.Array:
    """Each dim's value (inputs sharing it must agree; each input's ranges were checked already)."""
    seen: dict[str, tuple[int, str, int]] = {}
    for t, a in zip(inputs, arrays, strict=True):
        for axis, d, _ in t.dims:
            first = seen.setdefault(d.name, (a.shape[axis], t.name, axis))
            if first[0] != a.shape[axis]:
                raise InputError(f"dim {d.name!r} ({d.lo}..{d.hi}): input {first[1]!r} dim {first[2]} is {first[0]} "
                                 f"but input {t.name!r} dim {axis} is {a.shape[axis]}; inputs sharing a dim must agree")
    return (ctypes.c_int64 * max(len(order), 1))(*(seen[d.name][0] for d in order))


def _same_layout(real: tuple[int, ...], bound: tuple[int, ...]) -> bool:
    return all(n <= 1 or math.prod(real[i + 1:]) == math.prod(bound[i + 1:]) for i, n in enumerate(real))


def at_bound(t: TensorInfo, a: np.ndarray) -> np.ndarray:
    if _same_layout(a.shape, t.shape):
        return a
    full = np.empty(t.shape, a.dtype)
    full[tuple(slice(0, n) for n in a.shape)] = a
    return full


def real_output(t: TensorInfo, out: np.ndarray, values: ctypes.Array, slots: dict[str, int]) -> np.ndarray:
    sizes = {axis: values[slots[d.name]] * k for axis, d, k in t.dims}
    shape = [sizes.get(i, n) for i, n in enumerate(t.shape)]
    view = out[tuple(slice(0, n) for n in shape)]
    return view if _same_layout(tuple(shape), t.shape) else np.ascontiguousarray(view)
