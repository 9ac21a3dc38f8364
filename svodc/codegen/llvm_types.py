"""LLVM spellings of IR dtypes and constants."""

from __future__ import annotations

import math
import struct

import numpy as np

from svodc.ir.dtypes import DType, dtypes

_LLVM_TYPE = {
    "bool": "i1", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "i8", "uint16": "i16", "uint32": "i32", "uint64": "i64", "index": "i64",
    "float16": "half", "bfloat16": "bfloat", "float32": "float", "float64": "double",
}


def ltype(dt: DType) -> str:
    if dt.kind == "ptr":
        return "ptr"
    return _LLVM_TYPE[dt.name]


def mem_type(dt: DType) -> str:
    """How a value of dt is stored in memory (bool is a byte)."""
    return "i8" if dt is dtypes.bool else ltype(dt)


def const(dt: DType, value: int | float | bool) -> str:
    if dt is dtypes.bool:
        return "true" if value else "false"
    if dt.is_int:
        v = int(value)
        bits = dt.bits
        v &= (1 << bits) - 1  # two's complement, then signed decimal as LLVM expects
        if v >= 1 << (bits - 1):
            v -= 1 << bits
        return str(v)
    if dt is dtypes.float16:
        return "0xH" + np.asarray(value, dtype=np.float16).view(np.uint16).item().to_bytes(2, "big").hex().upper()
    if dt is dtypes.bfloat16:
        bits32 = np.asarray(value, dtype=np.float32).view(np.uint32).item()
        return "0xR" + f"{bits32 >> 16:04X}"
    if dt is dtypes.float32:
        value = float(np.float32(value)) if not math.isnan(value) else value
    # float and double constants are written as the hex of a double that holds the value exactly
    return "0x" + struct.pack(">d", float(value)).hex().upper()
