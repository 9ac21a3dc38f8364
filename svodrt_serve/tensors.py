"""Open Inference Protocol tensors <-> the numpy arrays svodrt runs on.

A request input arrives as JSON data (a flat or nested list) or as raw bytes (the REST binary-tensor
extension, gRPC raw_input_contents); raw bytes become an array with np.frombuffer, no copy. Every
check happens here, before the runtime sees the array, and a failure is a BadTensor naming the input,
what was sent (datatype, shape) and what the model wants. A bundle dtype numpy lacks travels the way
svodrt takes it (svodrt/format.py DTYPES): bfloat16 as BF16 bits, float8/float4 as UINT8 bits, int4/int2
as INT8/UINT8 values; metadata says so in the tensor's parameters."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from mlserver.errors import InferenceError

from svodrt.bundle import TensorInfo
from svodrt.format import DTYPES, STRING

# v2 datatype of each numpy transport dtype (svodrt/format.py DTYPES gives the transport dtype).
V2_OF_NUMPY = {"bool": "BOOL", "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
               "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
               "float16": "FP16", "float32": "FP32", "float64": "FP64"}
MAX_ELEMENTS = 1 << 31  # no request tensor may claim more elements than this, whatever its shape says


class BadTensor(InferenceError):
    """A request tensor the model cannot take: status 400 with the protocol's error body."""


def v2_datatype(t: TensorInfo) -> str:
    if t.dtype == STRING:
        return "BYTES"
    if t.dtype == "bfloat16":
        return "BF16"
    return V2_OF_NUMPY[DTYPES[t.dtype][0]]


def v2_shape(t: TensorInfo) -> list[int]:
    """The metadata shape: -1 for a dim the bundle leaves variable (a bounded dim, format 1.5)."""
    bounded = {axis for axis, _, _ in t.dims}
    return [-1 if i in bounded else d for i, d in enumerate(t.shape)]


def describe(t: TensorInfo) -> str:
    return f"{v2_datatype(t)} {v2_shape(t)}"


def transport_note(t: TensorInfo) -> dict[str, str] | None:
    """Metadata parameters for a dtype that travels as another (None when it is itself)."""
    return {"svod_dtype": t.dtype} if t.dtype not in ("bool", STRING) and DTYPES[t.dtype][0] != t.dtype else None


def _shape(name: str, shape: object, want: TensorInfo) -> tuple[int, ...]:
    if not isinstance(shape, Sequence) or isinstance(shape, (str, bytes)) or \
            not all(type(d) is int and d >= 0 for d in shape):
        raise BadTensor(f"input {name!r}: shape {shape!r} is not a list of non-negative integers; the model wants "
                        f"{describe(want)}")
    dims = tuple(shape)
    model_dims = v2_shape(want)
    if len(dims) != len(model_dims) or any(m not in (-1, d) for d, m in zip(dims, model_dims, strict=True)):
        raise BadTensor(f"input {name!r} has shape {list(dims)}; the model wants {describe(want)}")
    if math.prod(dims) > MAX_ELEMENTS:
        raise BadTensor(f"input {name!r} shape {list(dims)} has over {MAX_ELEMENTS} elements")
    return dims


def _from_raw(name: str, datatype: str, dims: tuple[int, ...], raw: bytes | memoryview, want: TensorInfo) -> np.ndarray:
    if want.dtype == STRING:
        return _strings_from_raw(name, dims, bytes(raw), want)
    dtype = np.dtype(DTYPES[want.dtype][0]).newbyteorder("<")  # the protocol's raw tensors are little-endian
    expected = math.prod(dims) * dtype.itemsize
    if len(raw) != expected:
        raise BadTensor(f"input {name!r} ({datatype} {list(dims)}) has {len(raw)} bytes of binary data, expected "
                        f"{expected}; the model wants {describe(want)}")
    arr = np.frombuffer(raw, dtype=dtype).reshape(dims)
    return arr if dtype.isnative else arr.astype(dtype.newbyteorder("="))


def _strings_from_raw(name: str, dims: tuple[int, ...], raw: bytes, want: TensorInfo) -> np.ndarray:
    """BYTES in binary form: each element a 4-byte little-endian length, then that many bytes."""
    items, offset, n = [], 0, math.prod(dims)
    while offset < len(raw) and len(items) < n:
        size = int.from_bytes(raw[offset: offset + 4], "little")
        if offset + 4 + size > len(raw):
            break
        items.append(raw[offset + 4: offset + 4 + size])
        offset += 4 + size
    if len(items) != n or offset != len(raw):
        raise BadTensor(f"input {name!r} (BYTES {list(dims)}): binary data is not {n} length-prefixed strings "
                        f"({len(raw)} bytes); the model wants {describe(want)}")
    try:
        return np.array([b.decode() for b in items], dtype=object).reshape(dims)
    except UnicodeDecodeError as e:
        raise BadTensor(f"input {name!r}: element is not UTF-8 ({e.reason} at byte {e.start})") from None


def _from_json(name: str, datatype: str, dims: tuple[int, ...], data: object, want: TensorInfo) -> np.ndarray:
    dtype = np.dtype(DTYPES[want.dtype][0])
    try:
        got = np.array(data, dtype=object if want.dtype == STRING else None)
    except (ValueError, TypeError, OverflowError) as e:
        raise BadTensor(f"input {name!r} ({datatype} {list(dims)}): data is not a list of numbers ({e})") from None
    if got.size != math.prod(dims):
        raise BadTensor(f"input {name!r} ({datatype} {list(dims)}) has {got.size} elements of data, expected "
                        f"{math.prod(dims)}; the model wants {describe(want)}")
    if want.dtype == STRING:
        if not all(isinstance(v, str) for v in got.reshape(-1)):
            raise BadTensor(f"input {name!r} (BYTES {list(dims)}): data must be strings")
        return got.reshape(dims)
    # JSON numbers must fit the datatype: no silent truncation of 1.5 to an integer or of 300 to uint8.
    allowed = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}[dtype.kind]
    if got.size and got.dtype.kind not in allowed:
        raise BadTensor(f"input {name!r} ({datatype} {list(dims)}): data holds {got.dtype.kind!r}-kind values "
                        f"({got.dtype}), not {datatype} values")
    try:
        arr = got.astype(dtype, casting="unsafe") if got.size else np.empty(dims, dtype)
    except (ValueError, TypeError, OverflowError) as e:
        raise BadTensor(f"input {name!r} ({datatype} {list(dims)}): {e}") from None
    if dtype.kind in "iu" and got.size and not np.array_equal(arr, got):
        raise BadTensor(f"input {name!r}: a value is out of the {datatype} range")
    return arr.reshape(dims)


def decode_input(name: str, datatype: object, shape: object, data: object, want: TensorInfo) -> np.ndarray:
    """One request input as the array svodrt.run takes; data is raw bytes or the JSON data."""
    if datatype != v2_datatype(want):
        raise BadTensor(f"input {name!r} has datatype {datatype}, shape {shape}; the model wants {describe(want)}")
    dims = _shape(name, shape, want)
    if isinstance(data, (bytes, bytearray, memoryview)):
        return _from_raw(name, datatype, dims, data, want)
    return _from_json(name, datatype, dims, data, want)


def input_table(inputs: Sequence[TensorInfo]) -> str:
    return ", ".join(f"{t.name}: {describe(t)}" for t in inputs)
