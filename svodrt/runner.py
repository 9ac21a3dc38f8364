"""Runner: what every executor (model.py, svodrt_gpu) shares: the description and the input checks, done before
native code sees anything; and bounded dims at run time (format 1.5, docs/architecture.md "Bounded dims")."""

from __future__ import annotations

import contextlib
import ctypes
import math
from collections.abc import Mapping as MappingT

import numpy as np

from svodrt.abi import DIMS_STATUS_WORDS
from svodrt.bundle import Bundle, TensorInfo, Variant
from svodrt.errors import InputError
from svodrt.format import BITS_OF, DTYPES, STRING

NARROW_INTS = frozenset({"int4", "uint4", "int2", "uint2"})


class Runner:
    """What every loaded model shares, whatever runs it: its description and input checking.
    Subclasses set `bundle` and `variant`, call _set_io(), and implement run() and close()."""

    bundle: Bundle
    variant: Variant

    def _set_io(self) -> None:
        self._input_specs = [(t.name, np.dtype(DTYPES[t.dtype][0]), tuple(t.shape)) for t in self.bundle.inputs]
        self._output_specs = [(tuple(t.shape), np.dtype(DTYPES[t.dtype][0])) for t in self.bundle.outputs]
        self._output_names = [t.name for t in self.bundle.outputs]
        self._dim_slots = {d.name: i for i, d in enumerate(self.bundle.dims)}
        b, self._edge = self.bundle, None  # formats 1.4-1.8: strings at the edge (svodrt_strings), only where present
        if any(t.dtype == STRING for t in (*b.inputs, *b.outputs)) or b.zipmaps or b.edge_outputs:
            from svodrt_strings.edge import Edge

            self._edge = Edge(b)
        self._computed = self._edge.computed if self._edge else {}  # names run() computes

    @property
    def inputs(self) -> list[TensorInfo]:  # the caller's: not those the string program fills (format 1.8)
        return [t for t in self.bundle.inputs if t.name not in self._computed]

    @property
    def outputs(self) -> list[TensorInfo]:
        return list(self.bundle.outputs)

    def __repr__(self) -> str:
        ins, outs = ", ".join(map(str, self.inputs)), ", ".join(map(str, self.outputs))
        return f"<svodrt.Model ({ins}) -> ({outs}) on {self.variant.describe()}>"

    def _fast_inputs(self, feeds: object) -> list[np.ndarray] | None:
        """The common case in a few comparisons: a dict of exactly the inputs, each an ndarray of the
        declared dtype and shape, C-contiguous and aligned. None means: take the full check."""
        specs = self._input_specs
        if type(feeds) is not dict or len(feeds) != len(specs) or (self._edge and self._edge.checks_inputs):
            return None
        arrays = []
        for name, dtype, shape in specs:
            a = feeds.get(name)
            if (type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous
                    or not a.flags.aligned):
                return None
            arrays.append(a)
        return arrays

    def _results(self, outs: list[np.ndarray], feeds: MappingT[str, object]) -> dict:
        result: dict = dict(zip(self._output_names, outs, strict=True))
        if self._edge is not None:
            self._edge.decode(result, feeds)
        return result

    def _prepare(self, feeds: MappingT[str, object]) -> tuple[list[np.ndarray], object]:
        """The checked inputs as the code reads them and the `dims` array (None: static)."""
        arrays, ins = self.check_inputs(feeds), self.bundle.inputs
        if not self.bundle.dims:
            return arrays, None
        return [at_bound(t, a) for t, a in zip(ins, arrays, strict=True)], dim_values(ins, arrays, self.bundle.dims)

    def edge_feeds(self, feeds: MappingT[str, object]) -> MappingT[str, object]:
        """feeds with the string program's results added (the code inputs it fills, the outputs run() returns)."""
        return feeds if self._edge is None else self._edge.complete(feeds)

    def check_inputs(self, feeds: MappingT[str, object]) -> list[np.ndarray]:
        """Validate a feed dict against the model's inputs; returns the arrays the code will read, in
        input order (C-contiguous and aligned: copied if they were not)."""
        if (fast := self._fast_inputs(feeds)) is not None:
            return fast
        feeds = self.edge_feeds(feeds)
        if not isinstance(feeds, MappingT):
            raise InputError(f"inputs must be a dict of name -> array, got {type(feeds).__name__}")
        expected = [t.name for t in self.bundle.inputs]
        if unexpected := [k for k in feeds if k not in expected and self._computed.get(k) not in ("output", "both")]:
            raise InputError(f"unexpected input{'s' if len(unexpected) > 1 else ''} {unexpected}; the model's "
                             f"inputs are {expected}")
        if missing := [t for t in self.bundle.inputs if t.name not in feeds]:
            t = missing[0]
            raise InputError(f"missing input {t.name!r} ({t.dtype}{list(t.shape)}); the model's inputs are {expected}")
        feeds = feeds if self._edge is None else self._edge.intern(feeds)
        return [check_input(t, feeds[t.name]) for t in self.bundle.inputs]

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _as_transport(t: TensorInfo, value: np.ndarray, want: np.dtype) -> np.ndarray:
    """An array of a type numpy lacks (ml_dtypes bfloat16, float8, int4...) in the form it travels in:
    the bits of a float format, the values of a narrow integer. Anything else is an InputError."""
    name = value.dtype.name
    if BITS_OF.get(name) == t.dtype and value.dtype.itemsize == want.itemsize:
        return value.view(want)
    if name == t.dtype and t.dtype in NARROW_INTS:
        return value.astype(want)
    got, hint = str(value.dtype), ""
    if want.name != t.dtype:
        what = "values" if t.dtype in NARROW_INTS else "raw bits"
        hint = f" (pass {t.dtype} as its {what} in a {want} array, or as an ml_dtypes {t.dtype} array)"
    if value.dtype.kind != "V" and value.dtype.newbyteorder("=") == want:
        order = "big" if value.dtype.byteorder == ">" else "little"  # s390x hosts are big-endian
        got, hint = value.dtype.str, f" in {order}-endian byte order: convert with .astype('{want.str}')"
    raise InputError(f"input {t.name!r} has dtype {got}, expected {t.dtype}{hint}")


def check_shape(t: TensorInfo, value: object) -> None:
    """InputError for an array of another rank or dimension than t's (other values: check_input's job)."""
    if not isinstance(value, np.ndarray) or value.shape == t.shape:
        return
    if value.ndim != len(t.shape):
        raise InputError(f"input {t.name!r} has rank {value.ndim} (shape {list(value.shape)}), expected rank "
                         f"{len(t.shape)} (shape {list(t.shape)})")
    bounded = {axis: d for axis, d, _ in t.dims}  # format 1.5: a size in the dim's range
    for i, (got, exp) in enumerate(zip(value.shape, t.shape, strict=True)):
        if (d := bounded.get(i)) is not None and not d.lo <= got <= d.hi:
            raise InputError(f"input {t.name!r} dim {i} ({d.name!r}): got {got}, expected {d.lo}..{d.hi}")
        if d is None and got != exp:
            raise InputError(f"input {t.name!r} dim {i}: got {got}, expected {exp}")


def check_input(t: TensorInfo, value: object) -> np.ndarray:
    """One input checked: a C-contiguous, aligned array (else a copy); a wrong type, dtype (byte order included),
    rank or dimension is an InputError, never a silent conversion (docs/architecture.md "Runtime", Inputs)."""
    if not isinstance(value, np.ndarray) or isinstance(value, np.ma.MaskedArray):
        raise InputError(f"input {t.name!r} must be a numpy.ndarray, got {type(value).__name__}")
    want = np.dtype(DTYPES[t.dtype][0])
    if value.dtype != want:
        value = _as_transport(t, value, want)
    check_shape(t, value)
    if not value.flags.c_contiguous or value.ctypes.data % want.itemsize:
        value = np.array(value, order="C", copy=True)  # numpy allocations are aligned
    if value.nbytes != t.nbytes and not t.dims:  # shapes matched; this guards the size arithmetic itself
        raise InputError(f"input {t.name!r} is {value.nbytes} bytes, expected {t.nbytes}")
    return value


# ------------------------------------------------------------------ bounded dims (format 1.5)
def dim_values(inputs: list[TensorInfo], arrays: list[np.ndarray], order: tuple) -> ctypes.Array:
    """Each input dim's value (inputs sharing it must agree; each input's ranges were checked already); computed
    dims (format 1.7) and the status words start at 0: the code writes them (svodrt/abi.py)."""
    seen: dict[str, tuple[int, str, int]] = {}
    for t, a in zip(inputs, arrays, strict=True):
        for axis, d, _ in t.dims:
            first = seen.setdefault(d.name, (a.shape[axis], t.name, axis))
            if first[0] != a.shape[axis]:
                raise InputError(f"dim {d.name!r} ({d.lo}..{d.hi}): input {first[1]!r} dim {first[2]} is {first[0]} "
                                 f"but input {t.name!r} dim {axis} is {a.shape[axis]}; inputs sharing a dim must agree")
    return (ctypes.c_int64 * (len(order) + DIMS_STATUS_WORDS))(*(0 if d.computed else seen[d.name][0] for d in order))


def check_dims_status(values: ctypes.Array, order: tuple) -> None:
    """After the call: a dim the code found wrong (format 1.7, svodrt/abi.py; it ran clamped) is an InputError."""
    if s := values[len(order)]:
        d, got, want, given = order[s - 1], values[len(order) + 1], values[len(order) + 2], ", ".join(
            f"{i.name}={values[j]}" for j, i in enumerate(order) if not i.computed)
        what = f"sizes an axis of {got} that meets one of {want}" if want else f"came out {got}"
        raise InputError(f"dim {d.name!r} ({d.lo}..{d.hi}) {what} for the inputs' dims ({given}); give inputs whose "
                         f"dims keep {'them equal' if want else 'it in range'}")


def _same_layout(real: tuple[int, ...], bound: tuple[int, ...]) -> bool:
    return all(n <= 1 or math.prod(real[i + 1:]) == math.prod(bound[i + 1:]) for i, n in enumerate(real))


def at_bound(t: TensorInfo, a: np.ndarray) -> np.ndarray:  # the bound's layout (zero-filled past the real shape)
    return a if _same_layout(a.shape, t.shape) else np.pad(a, [(0, t.shape[i] - n) for i, n in enumerate(a.shape)])


def real_output(t: TensorInfo, out: np.ndarray, values: ctypes.Array, slots: dict[str, int]) -> np.ndarray:
    sizes = {axis: values[slots[d.name]] * k for axis, d, k in t.dims}
    shape = [sizes.get(i, n) for i, n in enumerate(t.shape)]
    view = out[tuple(slice(0, n) for n in shape)]
    return view if _same_layout(tuple(shape), t.shape) else np.ascontiguousarray(view)
