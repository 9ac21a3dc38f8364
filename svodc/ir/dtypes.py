"""Element types of the IR.

A DType is an interned, frozen value: compare with `is` or `==`. `index` is the type of symbolic
dimensions and loop indices (64-bit signed in every backend). Pointer types appear only at the loop
level, as kernel parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Kind = Literal["float", "int", "uint", "bool", "index", "ptr"]


@dataclass(frozen=True, slots=True)
class DType:
    name: str
    itemsize: int  # bytes; 0 for `index` and pointer types, whose size is the backend's
    kind: Kind
    # Only for pointers: the element type pointed to.
    base: DType | None = None

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:  # signed or unsigned, including index
        return self.kind in ("int", "uint", "index")

    @property
    def is_unsigned(self) -> bool:
        return self.kind == "uint" or self.kind == "bool"

    @property
    def bits(self) -> int:
        return 64 if self.kind == "index" else self.itemsize * 8

    def ptr(self) -> DType:
        return DType(f"ptr.{self.name}", 0, "ptr", self)

    @property
    def np(self) -> np.dtype:
        """The numpy dtype with the same bytes. bfloat16 has none: it is stored as uint16."""
        try:
            return np.dtype(_NUMPY_NAME[self.name])
        except KeyError:
            raise TypeError(f"{self!r} has no numpy equivalent") from None


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
    index = DType("index", 0, "index")
    void = DType("void", 0, "index")

    @staticmethod
    def all() -> tuple[DType, ...]:
        return ALL_DTYPES

    @staticmethod
    def from_name(name: str) -> DType:
        try:
            return _BY_NAME[name]
        except KeyError:
            raise TypeError(f"unknown dtype {name!r}") from None

    @staticmethod
    def from_numpy(dt: np.dtype | type) -> DType:
        name = np.dtype(dt).name
        if name not in _BY_NAME or name in ("index", "void"):
            raise TypeError(f"numpy dtype {name} has no svod dtype")
        return _BY_NAME[name]


ALL_DTYPES: tuple[DType, ...] = tuple(v for k, v in vars(dtypes).items() if isinstance(v, DType))
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_NUMPY_NAME = {
    "bool": "bool", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float16": "float16", "bfloat16": "uint16", "float32": "float32", "float64": "float64",
    "index": "int64",
}


def min_value(dt: DType) -> int | float:
    if dt.is_float:
        return float("-inf")
    if dt.kind == "bool":
        return 0
    if dt.kind in ("uint",):
        return 0
    return -(1 << (dt.bits - 1))


def max_value(dt: DType) -> int | float:
    if dt.is_float:
        return float("inf")
    if dt.kind == "bool":
        return 1
    if dt.kind == "uint":
        return (1 << dt.bits) - 1
    return (1 << (dt.bits - 1)) - 1
