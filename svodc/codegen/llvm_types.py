"""LLVM spellings of IR dtypes and constants."""

from __future__ import annotations

import math
import struct

import numpy as np

from svodc.ir.alu import cast_array
from svodc.ir.dtypes import DType, dtypes, to_storage

_BITS_INT = {1: dtypes.uint8, 2: dtypes.uint16}

_LLVM_TYPE = {
    "bool": "i1", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "i8", "uint16": "i16", "uint32": "i32", "uint64": "i64", "index": "i64",
    "float32": "float", "float64": "double",
    # Emulated dtypes live in registers as their storage bits (codegen/emulate.py leaves no arithmetic
    # on them), so LLVM never sees `half` or `bfloat` and never needs a conversion libcall.
    "float16": "i16", "bfloat16": "i16", "float8e4m3fn": "i8", "float8e4m3fnuz": "i8", "float8e5m2": "i8",
    "float8e5m2fnuz": "i8", "float8e8m0": "i8", "float4e2m1": "i8", "int4": "i8", "uint4": "i8", "int2": "i8",
    "uint2": "i8",
    "string": "i32",  # an interned string's id
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
        bits = int(ltype(dt)[1:]) if dt.kind != "index" else 64
        v &= (1 << bits) - 1  # two's complement, then signed decimal as LLVM expects
        if v >= 1 << (bits - 1):
            v -= 1 << bits
        return str(v)
    if dt.emulated and dt.is_float:  # the storage bits, as the integer the register holds
        bits = to_storage(cast_array(np.asarray(value, dtype=np.float64), dt), dt).view(f"u{dt.itemsize}").item()
        return const(_BITS_INT[dt.itemsize], bits)
    if dt is dtypes.float32:
        value = float(np.float32(value)) if not math.isnan(value) else value
    # float and double constants are written as the hex of a double that holds the value exactly
    return "0x" + struct.pack(">d", float(value)).hex().upper()
