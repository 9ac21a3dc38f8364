"""ONNX element types <-> svod dtypes."""

from __future__ import annotations

from onnx import TensorProto

from svodc.ir.dtypes import DType, dtypes

_ONNX_TO_DTYPE: dict[int, DType] = {
    TensorProto.FLOAT: dtypes.float32,
    TensorProto.DOUBLE: dtypes.float64,
    TensorProto.FLOAT16: dtypes.float16,
    TensorProto.BFLOAT16: dtypes.bfloat16,
    TensorProto.INT8: dtypes.int8,
    TensorProto.INT16: dtypes.int16,
    TensorProto.INT32: dtypes.int32,
    TensorProto.INT64: dtypes.int64,
    TensorProto.UINT8: dtypes.uint8,
    TensorProto.UINT16: dtypes.uint16,
    TensorProto.UINT32: dtypes.uint32,
    TensorProto.UINT64: dtypes.uint64,
    TensorProto.BOOL: dtypes.bool,
    TensorProto.FLOAT8E4M3FN: dtypes.float8e4m3fn,
    TensorProto.FLOAT8E4M3FNUZ: dtypes.float8e4m3fnuz,
    TensorProto.FLOAT8E5M2: dtypes.float8e5m2,
    TensorProto.FLOAT8E5M2FNUZ: dtypes.float8e5m2fnuz,
    TensorProto.FLOAT8E8M0: dtypes.float8e8m0,
    TensorProto.FLOAT4E2M1: dtypes.float4e2m1,
    TensorProto.INT4: dtypes.int4,
    TensorProto.UINT4: dtypes.uint4,
    TensorProto.INT2: dtypes.int2,
    TensorProto.UINT2: dtypes.uint2,
    # Interned strings (svodc/frontend/strings.py). Only handlers registered with strings=True see them,
    # so a Cast or EyeLike to STRING is refused by the importer, not compiled as numbers.
    TensorProto.STRING: dtypes.string,
}


class UnsupportedDType(Exception):
    pass


def onnx_to_dtype(code: int, where: str = "") -> DType:
    try:
        return _ONNX_TO_DTYPE[code]
    except KeyError:
        name = TensorProto.DataType.Name(code) if code in TensorProto.DataType.values() else str(code)
        raise UnsupportedDType(f"element type {name}{' of ' + where if where else ''} is not supported") from None


def dtype_to_onnx(dtype: DType) -> int:
    """The ONNX element type code of a dtype (for building type protos, e.g. function bodies)."""
    for code, dt in _ONNX_TO_DTYPE.items():
        if dt == dtype:
            return code
    raise UnsupportedDType(f"{dtype.name} has no ONNX element type")
