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
