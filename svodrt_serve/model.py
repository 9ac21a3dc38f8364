"""SvodModel: one bundle as an MLServer model.

load() maps the bundle with svodrt.load and, unless told not to, runs `svodrt verify`'s check first
(every checksum, the embedded test vectors on this host); MLServer reports the model ready only when
load() returns True, so /v2/health/ready stays false until every bundle passed. predict() decodes the
inputs (tensors.py), runs the model on a thread (svodrt's native code releases the GIL, and concurrent
run() calls are safe) and answers with the output arrays themselves; the transports encode them."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from mlserver import MLModel
from mlserver.errors import MLServerError
from mlserver.types import (
    InferenceRequest,
    InferenceResponse,
    MetadataModelResponse,
    MetadataTensor,
    Parameters,
    ResponseOutput,
    TensorData,
)

import svodrt
from svodrt.errors import InputError, SvodError
from svodrt_serve.tensors import BadTensor, decode_input, describe, input_table, transport_note, v2_datatype, v2_shape

# Inferences in flight per model: one per core (a call that finds the runtime's helper threads busy runs
# on one thread, so more would only queue inside the runtime).
INFERENCE_WORKERS = max(2, os.cpu_count() or 1)


class BundleCheckError(SvodError):
    """A bundle failed `svodrt verify`'s check at server start."""


def _metadata(tensors) -> list[MetadataTensor]:
    out = []
    for t in tensors:
        note = transport_note(t)
        out.append(MetadataTensor(name=t.name, datatype=v2_datatype(t), shape=v2_shape(t),
                                  parameters=Parameters(**note) if note else None))
    return out


def _field(obj: object, key: str) -> object:
    """A request field from a validated pydantic object or one built with model_construct."""
    value = getattr(obj, key, None)
    return getattr(value, "value", value)  # a Datatype enum's string


class SvodModel(MLModel):
    _runner: svodrt.Runner | None = None
    _pool: ThreadPoolExecutor | None = None

    async def load(self) -> bool:
        extra = (self.settings.parameters.extra if self.settings.parameters else None) or {}
        path = self.settings.parameters.uri
        trust = extra.get("trust") or None  # a signature policy: refused bundles never load
        loop = asyncio.get_running_loop()
        if extra.get("verify", True):
            from svodrt_tools.verify import verify

            report = await loop.run_in_executor(None, lambda: verify(path, trust=trust))
            if not report.ok:
                raise BundleCheckError(f"{path} failed verification: {report.failures[0]}")
        self._runner = await loop.run_in_executor(None, lambda: svodrt.load(path, threads=extra.get("threads"),
                                                                            trust=trust))
        self._pool = ThreadPoolExecutor(INFERENCE_WORKERS, thread_name_prefix=f"svod-{self.name}")
        self._inputs = {t.name: t for t in self._runner.inputs}
        self._outputs = {t.name: t for t in self._runner.outputs}
        self.inputs = _metadata(self._runner.inputs)
        self.outputs = _metadata(self._runner.outputs)
        return True

    async def unload(self) -> bool:
        """Wait for running inferences, then unmap the bundle (MLServer unloads a model that failed too)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._runner is not None:
            self._runner.close()
        return True

    async def metadata(self) -> MetadataModelResponse:
        return MetadataModelResponse(name=self.name, versions=[self.version] if self.version else None,
                                     platform="svod", inputs=self.inputs, outputs=self.outputs)

    def decode(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        feeds: dict[str, np.ndarray] = {}
        for inp in request.inputs or []:
            name = _field(inp, "name")
            want = self._inputs.get(name) if isinstance(name, str) else None
            if want is None:
                raise BadTensor(f"input {name!r} is not an input of model {self.name!r}; its inputs are "
                                f"{input_table(self._runner.inputs)}")
            if name in feeds:
                raise BadTensor(f"input {name!r} appears twice in the request")
            data = _field(inp, "data")
            data = data.root if isinstance(data, TensorData) else data
            feeds[name] = decode_input(name, _field(inp, "datatype"), _field(inp, "shape"), data, want)
        missing = [t for n, t in self._inputs.items() if n not in feeds]
        if missing:
            raise BadTensor(f"missing input{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(f'{t.name!r} ({describe(t)})' for t in missing)} for model {self.name!r}")
        return feeds

    def requested_outputs(self, request: InferenceRequest) -> list[str]:
        names = [_field(o, "name") for o in (request.outputs or [])] or list(self._outputs)
        unknown = [n for n in names if n not in self._outputs]
        if unknown:
            raise BadTensor(f"output {unknown[0]!r} is not an output of model {self.name!r}; its outputs are "
                            f"{input_table(self._runner.outputs)}")
        return names

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = self.decode(payload)
        names = self.requested_outputs(payload)
        try:
            outs = await asyncio.get_running_loop().run_in_executor(self._pool, self._runner.run, feeds)
        except InputError as e:  # what tensors.py does not check itself (e.g. a string not in the vocabulary)
            raise BadTensor(str(e)) from None
        except SvodError as e:
            raise MLServerError(f"model {self.name!r} failed: {e}", status_code=500) from None
        outputs = [ResponseOutput.model_construct(name=n, shape=list(outs[n].shape),
                                                  datatype=v2_datatype(self._outputs[n]),
                                                  data=TensorData.model_construct(root=outs[n]))
                   for n in names]
        return InferenceResponse.model_construct(model_name=self.name, model_version=self.version,
                                                 id=payload.id, outputs=outputs)
