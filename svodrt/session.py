"""InferenceSession: onnxruntime's session API over svodrt.load, so code written for onnxruntime runs on a
bundle with `onnxruntime` replaced by `svodrt` (README "Coming from onnxruntime"). svodrt.load stays the
native API; this is a thin layer over Model that only renames and reshapes.

bfloat16/float8/float4 outputs come back as ml_dtypes arrays when ml_dtypes is importable, else as their
storage integers (uint16 bits for bfloat16, uint8 bits for the 8- and 4-bit floats; int4/uint4/int2/uint2
as int8/uint8 values). run(..., out=...) fills preallocated outputs, so a serving loop allocates nothing.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from svodrt.errors import InputError
from svodrt.format import BITS_OF, DTYPES
from svodrt.model import NARROW_INTS, Model

# onnxruntime's type strings: 'tensor(float)' for float32, 'tensor(double)' for float64; the rest by name.
_ORT_TYPE = {"float32": "float", "float64": "double"}
_ML_NAME = {v: k for k, v in BITS_OF.items()} | {n: n for n in NARROW_INTS}  # bundle dtype -> ml_dtypes name
PROVIDERS = ["CPUExecutionProvider"]


def _ml_dtype(dtype: str) -> np.dtype | None:
    """The ml_dtypes type of a bundle dtype numpy lacks, or None (not such a type, or no ml_dtypes)."""
    if dtype not in _ML_NAME:
        return None
    try:
        return np.dtype(getattr(importlib.import_module("ml_dtypes"), _ML_NAME[dtype]))
    except (ImportError, AttributeError):
        return None


@dataclass(frozen=True)
class NodeArg:
    """An input or output as onnxruntime describes it: shape entries are ints or dim names (str)."""

    name: str
    shape: list[int | str]
    type: str


@dataclass
class SessionOptions:
    """The options that mean something here; the others onnxruntime scripts set are accepted and
    have no effect (svodc optimized the model already; there is one thread pool)."""

    intra_op_num_threads: int = 0  # 0: all cores (svodrt.load's default)
    inter_op_num_threads: int = 0
    graph_optimization_level: object = None
    log_severity_level: int = 2


@dataclass(frozen=True)
class ModelMetadata:
    producer_name: str
    graph_name: str
    domain: str
    description: str
    version: int
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


def _shape(entry: Mapping, info_shape: tuple[int, ...]) -> list[int | str]:
    """A bundle tensor's shape with its dim names where the manifest has them (a `dims` list of names,
    ints or {"name": ...} maps, one per axis); the static ints otherwise."""
    dims = entry.get("dims") if isinstance(entry, Mapping) else None
    if not isinstance(dims, list) or len(dims) != len(info_shape):
        return list(info_shape)
    out: list[int | str] = []
    for d, n in zip(dims, info_shape, strict=True):
        d = d.get("name", n) if isinstance(d, Mapping) else d
        out.append(d if isinstance(d, str) and d else n)
    return out


def _args(infos, entries) -> list[NodeArg]:
    return [NodeArg(t.name, _shape(e, tuple(t.shape)), f"tensor({_ORT_TYPE.get(t.dtype, t.dtype)})")
            for t, e in zip(infos, entries, strict=True)]


class InferenceSession:
    """`InferenceSession(path_or_bytes, sess_options=None, providers=None)`: a bundle (path or bytes)."""

    def __init__(self, path_or_bytes: str | os.PathLike | bytes, sess_options: SessionOptions | None = None,
                 providers: Sequence[str | tuple] | None = None, **_ignored: object):
        names = [p[0] if isinstance(p, tuple) else p for p in (providers or PROVIDERS)]
        if "CPUExecutionProvider" not in names:  # onnxruntime falls back to CPU; so do we, aloud
            warnings.warn(f"providers {names} are not available in svodrt; using CPUExecutionProvider", stacklevel=2)
        threads = (sess_options or SessionOptions()).intra_op_num_threads or None
        self._model = Model(path_or_bytes, threads=threads)
        m = self._model.bundle.manifest
        self._inputs = _args(self._model.inputs, m["inputs"])
        self._outputs = _args(self._model.outputs, m["outputs"])
        self._index = {t.name: i for i, t in enumerate(self._outputs)}
        self._views = [_ml_dtype(t.dtype) for t in self._model.outputs]

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        return list(PROVIDERS)

    def get_modelmeta(self) -> ModelMetadata:
        """The ONNX producer; custom_metadata_map holds the compiler's name and version, its options
        (as the manifest records them) and the sha256 of the ONNX model the bundle was made from."""
        m = self._model.bundle.manifest
        model, producer = m.get("model", {}), m.get("producer", {})
        custom = {"compiler": f"{producer.get('name', '')} {producer.get('version', '')}".strip(),
                  "model_sha256": str(model.get("sha256", "")),
                  "options": repr(m.get("options", {})),
                  "format": ".".join(str(x) for x in m.get("format", []))}
        return ModelMetadata(str(model.get("producer", "")), "", "", "", 0, custom)

    def _selected(self, output_names: Sequence[str] | None) -> list[int]:
        if output_names is None:
            return list(range(len(self._outputs)))
        unknown = [n for n in output_names if n not in self._index]
        if unknown:
            raise InputError(f"unknown output{'s' if len(unknown) > 1 else ''} {unknown}; the model's outputs are "
                             f"{list(self._index)}")
        return [self._index[n] for n in output_names]

    def _buffers(self, out: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Every output's preallocated array (a list in output order or a dict by name), checked and
        viewed as its storage type, which the code writes directly."""
        arrays = [out.get(t.name) for t in self._outputs] if isinstance(out, Mapping) else list(out)
        if len(arrays) != len(self._outputs):
            raise InputError(f"out must hold all {len(self._outputs)} outputs {list(self._index)}, got {len(arrays)}")
        bufs = []
        for t, a in zip(self._model.outputs, arrays, strict=True):
            want = np.dtype(DTYPES[t.dtype][0])
            if (not isinstance(a, np.ndarray) or a.shape != tuple(t.shape) or a.dtype.itemsize != want.itemsize
                    or not a.flags.c_contiguous or not a.flags.writeable or a.ctypes.data % want.itemsize):
                got = f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
                raise InputError(f"out[{t.name!r}] must be a writeable C-contiguous {t.dtype}{list(t.shape)} array "
                                 f"(np.empty({tuple(t.shape)}, {want.name!r})), got {got}")
            if a.dtype != want and (t.dtype in NARROW_INTS or a.dtype.name != _ML_NAME.get(t.dtype)):
                raise InputError(f"out[{t.name!r}] has dtype {a.dtype}, expected {t.dtype} (as {want.name})")
            bufs.append(a.view(want))
        return bufs

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, object], run_options: object = None,
            out: Sequence[np.ndarray] | Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """Outputs named by output_names (None: all), in that order. out: preallocated arrays for every
        output (list in output order or dict by name), filled in place and returned (no allocation)."""
        picked = self._selected(output_names)
        arrays = self._model.check_inputs(input_feed)
        if out is not None:
            bufs = self._buffers(out)
            self._model._call(arrays, outs=bufs)
            given = [out[t.name] for t in self._outputs] if isinstance(out, Mapping) else list(out)
            return [given[i] for i in picked]
        outs = self._model._call(arrays)
        return [outs[i] if self._views[i] is None else self._view(i, outs[i]) for i in picked]

    def _view(self, i: int, a: np.ndarray) -> np.ndarray:
        ml = self._views[i]
        return a.astype(ml) if self._model.outputs[i].dtype in NARROW_INTS else a.view(ml)

    def close(self) -> None:
        self._model.close()

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
