"""InferenceSession: onnxruntime's session API over Model (README "Coming from onnxruntime"). Outputs numpy has
no type for are ml_dtypes arrays if ml_dtypes imports, else their storage ints (bfloat16/float8 bits, int4 values).
run(..., out=...) fills preallocated outputs (list or dict by name): a serving loop allocates nothing."""

from __future__ import annotations

import warnings
from collections import namedtuple
from collections.abc import Mapping, Sequence

import numpy as np

from svodrt.errors import InputError
from svodrt.format import BITS_OF, DTYPES
from svodrt.model import Model
from svodrt.runner import NARROW_INTS
from svodrt.schema import TensorInfo

_ORT_TYPE = {"float32": "float", "float64": "double"}  # onnxruntime's 'tensor(float)'; the rest by name
_ML_NAME = {v: k for k, v in BITS_OF.items()} | {n: n for n in NARROW_INTS}  # bundle dtype -> ml_dtypes name
PROVIDERS = ["CPUExecutionProvider"]
NodeArg = namedtuple("NodeArg", "name shape type")  # shape: ints, and dim names where the bundle has them
ModelMetadata = namedtuple("ModelMetadata", "producer_name graph_name domain description version custom_metadata_map")


class SessionOptions:
    """intra_op_num_threads: threads per run (0: this process's CPUs); "session.intra_op.allow_spinning" "0": helpers
    sleep after a run instead of spinning for the next (svodrt/team.py). Other settings are accepted, without effect."""
    intra_op_num_threads = 0

    def __init__(self) -> None:
        self._config: dict[str, str] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config[key] = value


def _converter(dtype: str):
    """Makes an output of a type numpy lacks an ml_dtypes array; None: nothing to do, or no ml_dtypes."""
    try:
        import ml_dtypes  # the svod[dtypes] extra

        ml = np.dtype(getattr(ml_dtypes, _ML_NAME[dtype]))
    except (KeyError, ImportError, AttributeError):
        return None
    return (lambda a: a.astype(ml)) if dtype in NARROW_INTS else (lambda a: a.view(ml))


def _shape(t: TensorInfo) -> list[int | str]:
    """The ints, with a bounded dim's name on the axes it sizes (format 1.5), as onnxruntime names them."""
    shape: list[int | str] = list(t.shape)
    for axis, d, k in t.dims:
        shape[axis] = d.name if k == 1 else f"{k}*{d.name}"
    return shape


class InferenceSession(Model):
    """A Model (svodrt.load's) that speaks onnxruntime: InferenceSession(path_or_bytes, sess_options, providers)."""

    def __init__(self, path_or_bytes, sess_options: SessionOptions | None = None, providers: Sequence | None = None):
        names = [p[0] if isinstance(p, tuple) else p for p in (providers or PROVIDERS)]
        if "CPUExecutionProvider" not in names:  # onnxruntime falls back to CPU too, and says so
            warnings.warn(f"providers {names} are not available in svodrt; using CPUExecutionProvider", stacklevel=2)
        so = sess_options or SessionOptions()
        spin = getattr(so, "_config", {}).get("session.intra_op.allow_spinning") != "0"
        super().__init__(path_or_bytes, threads=so.intra_op_num_threads or None, spin=spin)
        self._infos = self.outputs
        self._args = {k: [NodeArg(t.name, _shape(t), f"tensor({_ORT_TYPE.get(t.dtype, t.dtype)})") for t in ts]
                      for ts, k in ((self.inputs, "inputs"), (self._infos, "outputs"))}
        self._index = {t.name: i for i, t in enumerate(self._infos)}
        self._convert = [_converter(t.dtype) for t in self._infos]

    def get_inputs(self) -> list[NodeArg]:
        return list(self._args["inputs"])

    def get_outputs(self) -> list[NodeArg]:
        return list(self._args["outputs"])

    def get_providers(self) -> list[str]:
        return list(PROVIDERS)

    def get_modelmeta(self) -> ModelMetadata:  # custom_metadata_map: compiler, options, model_sha256, format
        m = self.bundle.manifest
        model, producer = m.get("model", {}), m.get("producer", {})
        return ModelMetadata(str(model.get("producer", "")), "", "", "", 0, {
            "compiler": f"{producer.get('name', '')} {producer.get('version', '')}".strip(),
            "model_sha256": str(model.get("sha256", "")), "options": repr(m.get("options", {})),
            "format": ".".join(map(str, m.get("format", [])))})

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, object], run_options: object = None,
            out: Sequence[np.ndarray] | Mapping[str, np.ndarray] | None = None) -> list:
        """The outputs named (None: all), in that order; with out=, those arrays, filled in place."""
        if unknown := [n for n in output_names or () if n not in self._index]:
            raise InputError(f"unknown outputs {unknown}; the model's outputs are {list(self._index)}")
        picked = range(len(self._infos)) if output_names is None else [self._index[n] for n in output_names]
        if out is None:  # decoded as Model.run decodes them (strings, ZipMap: format 1.6)
            input_feed = self.edge_feeds(input_feed)
            outs = list(self._results(self._outputs(input_feed), input_feed).values())  # outputs first, in order
            return [outs[i] if self._convert[i] is None else self._convert[i](outs[i]) for i in picked]
        if self.bundle.dims:
            raise InputError("out= needs outputs of one shape; this bundle has bounded dims (format 1.5)")
        arrays = self.check_inputs(input_feed)
        given = [out.get(t.name) for t in self._infos] if isinstance(out, Mapping) else list(out)
        self._call(arrays, outs=self._storage(given))
        return [given[i] for i in picked]

    def _storage(self, given: list) -> list[np.ndarray]:  # checked, viewed as the storage type the code writes
        bufs = []
        for t, a in zip(self._infos, given + [None] * (len(self._infos) - len(given)), strict=True):
            want = np.dtype(DTYPES[t.dtype][0])
            if not (isinstance(a, np.ndarray) and a.shape == tuple(t.shape) and a.flags.c_contiguous
                    and a.flags.writeable and a.flags.aligned and (a.dtype == want or (
                        t.dtype not in NARROW_INTS and a.dtype.name == _ML_NAME.get(t.dtype)))):
                raise InputError(f"out[{t.name!r}] must be a writeable C-contiguous {t.dtype}{list(t.shape)} array "
                                 f"(np.empty({tuple(t.shape)}, {want.name!r})), got {getattr(a, 'dtype', a)!s:.40}"
                                 f"{list(getattr(a, 'shape', ()))}")
            bufs.append(a.view(want))
        return bufs
