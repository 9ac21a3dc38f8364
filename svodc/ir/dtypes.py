"""Element types of the IR.

A DType is an interned, frozen value: compare with `is` or `==`. `index` is the type of symbolic
dimensions and loop indices (64-bit signed in every backend). Pointer types appear only at the loop
level, as kernel parameters.

Three numpy views of a dtype:
- `np`: the array type the compiler computes with (constant folding, the reference interpreter).
  numpy has no bfloat16, float8, float4 or 4/2-bit integers; for those it is the `ml_dtypes` type,
  whose arithmetic computes in float32 (int32) and rounds back, as the generated code does.
- `storage_np`: how an element lies in a buffer and travels through svodrt (svodrt/format.py DTYPES):
  bfloat16 as its uint16 bits, float8/float4 as their uint8 bits, int4/int2 one element per byte,
  sign-extended (int8) or zero-extended (uint8). Packed 4-bit ONNX tensors are unpacked on import.
- `bits`: the width of the value; less than 8 * itemsize only for the narrow integers.

`string` is a tensor of interned strings: each element an int32 id (an index into the model's
vocabulary, svodc/frontend/strings.py, or a number past it that the runtime gives strings the
vocabulary lacks). In the IR it is an `int` kind of its own name, so no op mixes it with int32 by
accident; the frontend lets only ops that depend on nothing but id equality see it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import ml_dtypes
import numpy as np

from svodrt.format import DTYPES

Kind = Literal["float", "int", "uint", "bool", "index", "ptr"]


@dataclass(frozen=True, slots=True)
class DType:
    name: str
    itemsize: int  # bytes; 0 for `index` and pointer types, whose size is the backend's
    kind: Kind
    # Only for pointers: the element type pointed to.
    base: DType | None = None
    # Value width in bits when narrower than the storage (int4 lives in a byte); 0: 8 * itemsize.
    width: int = 0

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:  # signed or unsigned, including index
        return self.kind in ("int", "uint", "index")

    @property
    def bits(self) -> int:
        return 64 if self.kind == "index" else self.width or self.itemsize * 8

    def ptr(self) -> DType:
        return DType(f"ptr.{self.name}", 0, "ptr", self)

    @property
    def np(self) -> np.dtype:
        """The numpy (or ml_dtypes) array type that computes with this dtype's semantics."""
        try:
            name = _NUMPY_NAME[self.name]
        except KeyError:
            raise TypeError(f"{self!r} has no numpy equivalent") from None
        return np.dtype(getattr(ml_dtypes, name) if name in _ML_DTYPES else name)

    @property
    def storage_np(self) -> np.dtype:
        """The numpy dtype of this dtype's elements in a buffer (what svodrt hands in and out)."""
        try:
            return np.dtype(DTYPES[self.name][0])
        except KeyError:
            raise TypeError(f"{self!r} is not a buffer element type") from None

    @property
    def emulated(self) -> bool:
        """Stored in a format the CPU cannot compute with: codegen computes in float32 / int32."""
        return self.name in _EMULATED


class dtypes:
    bool = DType("bool", 1, "bool")
    int8 = DType("int8", 1, "int")
    int16 = DType("int16", 2, "int")
    int32 = DType("int32", 4, "int")
    int64 = DType("int64", 8, "int")
    uint8 = DType("uint8", 1, "uint")
    uint16 = DType("uint16", 2, "uint")
    uint32 = DType("uint32", 4, "uint")
    uint64 = DType("uint64", 8, "uint")
    float16 = DType("float16", 2, "float")
    bfloat16 = DType("bfloat16", 2, "float")
    float32 = DType("float32", 4, "float")
    float64 = DType("float64", 8, "float")
    float8e4m3fn = DType("float8e4m3fn", 1, "float")
    float8e4m3fnuz = DType("float8e4m3fnuz", 1, "float")
    float8e5m2 = DType("float8e5m2", 1, "float")
    float8e5m2fnuz = DType("float8e5m2fnuz", 1, "float")
    float8e8m0 = DType("float8e8m0", 1, "float")
    float4e2m1 = DType("float4e2m1", 1, "float")
    int4 = DType("int4", 1, "int", width=4)
    uint4 = DType("uint4", 1, "uint", width=4)
    int2 = DType("int2", 1, "int", width=2)
    uint2 = DType("uint2", 1, "uint", width=2)
    string = DType("string", 4, "int")  # an interned string's int32 id (see the module doc)
    index = DType("index", 0, "index")
    void = DType("void", 0, "index")

    @staticmethod
    def all() -> tuple[DType, ...]:
        return ALL_DTYPES

    @staticmethod
    def from_numpy(dt: np.dtype | type) -> DType:
        name = np.dtype(dt).name
        name = _FROM_ML.get(name, name)
        if name not in _BY_NAME or name in ("index", "void"):
            raise TypeError(f"numpy dtype {name} has no svod dtype")
        return _BY_NAME[name]


ALL_DTYPES: tuple[DType, ...] = tuple(v for k, v in vars(dtypes).items() if isinstance(v, DType))
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_NUMPY_NAME = {
    "bool": "bool", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "float64": "float64",
    "index": "int64", "float8e4m3fn": "float8_e4m3fn", "float8e4m3fnuz": "float8_e4m3fnuz",
    "float8e5m2": "float8_e5m2", "float8e5m2fnuz": "float8_e5m2fnuz", "float8e8m0": "float8_e8m0fnu",
    "float4e2m1": "float4_e2m1fn", "int4": "int4", "uint4": "uint4", "int2": "int2", "uint2": "uint2",
    "string": "int32",
}
_ML_DTYPES = frozenset({"bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                        "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int2", "uint2"})
_FROM_ML = {ml: ours for ours, ml in _NUMPY_NAME.items() if ml in _ML_DTYPES}
# float16 is emulated too: no x86 level has float16 arithmetic (F16C only converts).
_EMULATED = frozenset({"float16", "bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz",
                       "float8e8m0", "float4e2m1", "int4", "uint4", "int2", "uint2"})


def finite_max(dt: DType) -> float:
    """The largest finite value of a float dtype."""
    return float(ml_dtypes.finfo(dt.np).max)


def to_storage(array: np.ndarray, dt: DType) -> np.ndarray:
    """An array of dt's compute type (`dt.np`) as the bytes a buffer holds (`dt.storage_np`)."""
    want = dt.storage_np
    if array.dtype == want:
        return array
    if dt.is_int:  # narrow integers: one value per byte, sign- or zero-extended
        return array.astype(want)
    return array.view(want)


def from_storage(array: np.ndarray, dt: DType) -> np.ndarray:
    """The inverse of to_storage."""
    have = dt.np
    if array.dtype == have:
        return array
    return array.astype(have) if dt.is_int else array.view(have)


# Float formats without infinities: the extreme finite values stand in for +-inf (reduction identities,
# padding values). float8e8m0 has no sign: its "-max" is only ever used in float32 arithmetic.
_NO_INF = frozenset({"float8e4m3fn", "float8e4m3fnuz", "float8e5m2fnuz", "float8e8m0", "float4e2m1"})


def min_value(dt: DType) -> int | float:
    if dt.is_float:
        return -max_value(dt) if dt.name in _NO_INF else float("-inf")
    if dt.kind == "bool":
        return 0
    if dt.kind in ("uint",):
        return 0
    return -(1 << (dt.bits - 1))


def max_value(dt: DType) -> int | float:
    if dt.is_float:
        return finite_max(dt) if dt.name in _NO_INF else float("inf")
    if dt.kind == "bool":
        return 1
    if dt.kind == "uint":
        return (1 << dt.bits) - 1
    return (1 << (dt.bits - 1)) - 1
