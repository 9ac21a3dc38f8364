"""Weights from outside the model's protobuf: ONNX external data and safetensors files.

Both are read through mmap: an initializer's array is a read-only numpy view of the mapped file, so
the bytes are never copied on the way into the bundle (the bundle writer streams them from the
mapping into the output file). A view keeps its mapping alive; the mapping closes when the last
view is gone.

safetensors (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N,
N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
then the data; offsets are relative to the end of the header. The header is parsed here with json,
not with the `safetensors` package.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import stat
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from svodc.errors import WeightsError
from svodc.frontend.dtypes import UnsupportedDType, onnx_to_dtype
from svodc.ir.dtypes import DType, dtypes

SAFETENSORS_DTYPES: dict[str, DType] = {
    "F64": dtypes.float64, "F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16,
    "I64": dtypes.int64, "I32": dtypes.int32, "I16": dtypes.int16, "I8": dtypes.int8,
    "U64": dtypes.uint64, "U32": dtypes.uint32, "U16": dtypes.uint16, "U8": dtypes.uint8, "BOOL": dtypes.bool,
    "F8_E4M3": dtypes.float8e4m3fn, "F8_E5M2": dtypes.float8e5m2, "F8_E8M0": dtypes.float8e8m0,
}
MAX_HEADER = 100 << 20  # the safetensors reference refuses larger headers too
# ONNX packs these two (or four) to a byte: their arrays are unpacked, which is a copy.
_PACKED = frozenset({TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT4E2M1, TensorProto.INT2,
                     TensorProto.UINT2})


def _map(path: Path, what: str) -> mmap.mmap:
    """Map a weights file read-only. Opened with O_NONBLOCK and checked to be a regular file first: a
    FIFO or device in its place would otherwise block the compiler forever or map nonsense."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise WeightsError(f"{what}: {str(path)!r} is not a regular file (a FIFO, device or socket)")
            if st.st_size == 0:
                raise WeightsError(f"{what}: {str(path)!r} is empty")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise WeightsError(f"{what}: cannot read {str(path)!r}: {e.strerror or e}") from None


def view(buffer: mmap.mmap, dtype: DType, shape: tuple[int, ...], offset: int) -> np.ndarray:
    """A read-only array over `buffer` (no copy). `dtype` is the buffer's element type."""
    return np.frombuffer(buffer, dtype=dtype.np, count=math.prod(shape), offset=offset).reshape(shape)


class SafetensorsFile:
    """The tensors of one safetensors file, as zero-copy views of its mapping."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        where = f"weights file {str(self.path)!r}"
        self._map = _map(self.path, where)
        size = len(self._map)
        if size < 8:
            raise WeightsError(f"{where}: {size} bytes is too short for a safetensors header")
        n = int.from_bytes(self._map[:8], "little")
        if n > min(size - 8, MAX_HEADER):
            raise WeightsError(f"{where}: the header claims {n} bytes, the file has {size - 8} after the length")
        try:
            header = json.loads(bytes(self._map[8:8 + n]))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise WeightsError(f"{where}: the header is not JSON: {e}") from None
        if not isinstance(header, dict):
            raise WeightsError(f"{where}: the header is not a JSON object")
        self.metadata = header.pop("__metadata__", None)
        start, data_size = 8 + n, size - 8 - n
        self.tensors: dict[str, tuple[DType, tuple[int, ...], int]] = {}
        for name, entry in header.items():
            self.tensors[name] = self._entry(where, name, entry, start, data_size)

    @staticmethod
    def _entry(where: str, name: str, entry: object, start: int, data_size: int) -> tuple[DType, tuple[int, ...], int]:
        bad = f"{where}: tensor {name!r}"
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise WeightsError(f"{bad} needs dtype, shape and data_offsets")
        dt = SAFETENSORS_DTYPES.get(entry["dtype"])
        if dt is None:
            raise WeightsError(f"{bad} has dtype {entry['dtype']!r}, which svodc does not read "
                               f"(known: {', '.join(SAFETENSORS_DTYPES)})")
        shape, offsets = entry["shape"], entry["data_offsets"]
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise WeightsError(f"{bad}: shape {shape!r} is not a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data_size):
            raise WeightsError(f"{bad}: data_offsets {offsets!r} are outside the {data_size} data bytes")
        nbytes = math.prod(shape) * dt.itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise WeightsError(f"{bad}: {offsets[1] - offsets[0]} bytes hold a {dt.name}{shape} of {nbytes} bytes")
        return dt, tuple(shape), start + offsets[0]

    def array(self, name: str) -> np.ndarray:
        dt, shape, offset = self.tensors[name]
        return view(self._map, dt, shape, offset)


class ExternalData:
    """Reads initializers, mapping ONNX external data files (each file once) relative to base_dir."""

    def __init__(self, base_dir: Path | None):
        self.base_dir = base_dir
        self._maps: dict[Path, mmap.mmap] = {}

    def array(self, init: onnx.TensorProto, dtype: DType) -> np.ndarray:
        """The initializer's value as dtype's compute array; a view of its bytes where possible."""
        shape = tuple(init.dims)
        if init.data_location == TensorProto.EXTERNAL:
            return self._external(init, dtype, shape)
        if init.raw_data and init.data_type not in _PACKED and dtype.np.itemsize == dtype.itemsize:
            if len(init.raw_data) != math.prod(shape) * dtype.itemsize:  # an invalid model, not a weights file
                raise ValueError(f"{len(init.raw_data)} bytes of raw data for a {dtype.name}{list(shape)}")
            return np.frombuffer(init.raw_data, dtype=dtype.np).reshape(shape)
        return numpy_helper.to_array(init)

    def _external(self, init: onnx.TensorProto, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
        info = {e.key: e.value for e in init.external_data}
        what = f"initializer {init.name!r}"
        location = info.get("location", "")
        if self.base_dir is None:
            raise WeightsError(f"{what} keeps its data in the external file {location!r}: compile the model "
                               "from its path so the file can be found next to it")
        rel = Path(location)
        if not location or rel.is_absolute() or ".." in rel.parts:
            raise WeightsError(f"{what}: external data location {location!r} must be a path inside the model's folder")
        path = self.base_dir / rel
        if path not in self._maps:
            self._maps[path] = _map(path, f"{what}: external data")
        buf = self._maps[path]
        offset = int(info.get("offset", 0))
        nbytes = math.prod(shape) * dtype.itemsize if init.data_type not in _PACKED else \
            (math.prod(shape) * (2 if init.data_type in (TensorProto.INT2, TensorProto.UINT2) else 4) + 7) // 8
        length = int(info.get("length", nbytes))
        if length != nbytes or offset < 0 or offset + length > len(buf):
            raise WeightsError(f"{what}: bytes {offset}..{offset + length} of {str(path)!r} ({len(buf)} bytes) do not "
                               f"hold a {dtype.name}{list(shape)} ({nbytes} bytes)")
        if init.data_type in _PACKED:  # unpack through onnx: small tensors, a copy is fine
            t = TensorProto()
            t.CopyFrom(init)
            t.ClearField("external_data")
            t.data_location = TensorProto.DEFAULT
            t.raw_data = bytes(buf[offset:offset + length])
            return numpy_helper.to_array(t)
        return view(buf, dtype, shape, offset)


def _declared(vi_type: onnx.TypeProto | None, init: onnx.TensorProto | None) -> tuple[DType | None, tuple | None]:
    """What the model declares for a name: (dtype, shape with None for unknown dims)."""
    try:
        if init is not None:
            return onnx_to_dtype(init.data_type), tuple(init.dims)
        if vi_type is None or not vi_type.HasField("tensor_type"):
            return None, None
        tt = vi_type.tensor_type
        dt = onnx_to_dtype(tt.elem_type) if tt.elem_type else None
        shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim) \
            if tt.HasField("shape") else None
        return dt, shape
    except UnsupportedDType:
        return None, None


def weight_files(paths: tuple[str, ...], graph: onnx.GraphProto) -> dict[str, tuple[DType, np.ndarray]]:
    """{name: (dtype, array)} from the safetensors files, each checked against the model: the name must
    be an initializer or a graph input, with the dtype and shape the model declares for it."""
    inits = {i.name: i for i in graph.initializer}
    inputs = {vi.name: vi for vi in graph.input}
    out: dict[str, tuple[DType, np.ndarray]] = {}
    seen: dict[str, Path] = {}
    for p in paths:
        f = SafetensorsFile(p)
        for name, (dt, shape, _) in f.tensors.items():
            where = f"tensor {name!r} of {str(f.path)!r}"
            if name in seen:
                raise WeightsError(f"{where} is also in {str(seen[name])!r}: give each tensor once")
            if name not in inits and name not in inputs:
                raise WeightsError(f"{where} is neither an initializer nor an input of the model")
            want_dt, want_shape = _declared(inputs[name].type if name in inputs else None, inits.get(name))
            if want_dt is not None and want_dt != dt:
                raise WeightsError(f"{where} is {dt.name}, the model declares {name!r} as {want_dt.name}")
            if want_shape is not None and (len(want_shape) != len(shape) or any(
                    w is not None and w != s for w, s in zip(want_shape, shape, strict=True))):
                shown = [w if w is not None else "?" for w in want_shape]
                raise WeightsError(f"{where} has shape {list(shape)}, the model declares {name!r} as {shown}")
            seen[name] = f.path
            out[name] = (dt, f.array(name))
    return out
