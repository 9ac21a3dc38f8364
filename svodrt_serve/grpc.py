"""The gRPC infer path: MLServer's servicer, with ModelInfer taking raw_input_contents as np.frombuffer
views (MLServer's own converter unpacks them into Python lists) and answering with
raw_output_contents, as Triton's clients expect. Errors keep MLServer's mapping (400 -> INVALID_ARGUMENT)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc import aio
from mlserver.grpc import dataplane_pb2 as pb
from mlserver.grpc.converters import InferInputTensorConverter, InferRequestedOutputTensorConverter
from mlserver.grpc.dataplane_pb2_grpc import add_GRPCInferenceServiceServicer_to_server
from mlserver.grpc.interceptors import PromServerInterceptor
from mlserver.grpc.model_repository import ModelRepositoryServicer
from mlserver.grpc.model_repository_pb2_grpc import add_ModelRepositoryServiceServicer_to_server
from mlserver.grpc.server import DefaultGrpcWorkers, GRPCServer
from mlserver.grpc.servicers import InferenceServicer
from mlserver.grpc.utils import handle_mlserver_error
from mlserver.types import InferenceRequest, TensorData

from svodrt_serve.tensors import BadTensor


def request_from_pb(request: pb.ModelInferRequest) -> InferenceRequest:
    inputs = [InferInputTensorConverter.to_types(inp) for inp in request.inputs]
    raw = request.raw_input_contents
    if raw:
        empty = [inp for inp in inputs if not inp.data.root]
        if len(empty) != len(raw):
            raise BadTensor(f"{len(raw)} raw_input_contents for {len(empty)} inputs without contents: "
                            "give each input either contents or one raw_input_contents entry")
        for inp, blob in zip(empty, raw, strict=True):
            inp.data = TensorData.model_construct(root=blob)
    outputs = [InferRequestedOutputTensorConverter.to_types(o) for o in request.outputs] or None
    return InferenceRequest.model_construct(id=request.id or None, parameters=None, inputs=inputs, outputs=outputs)


def response_to_pb(response) -> pb.ModelInferResponse:
    out = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version or "",
                                id=response.id or "")
    for o in response.outputs:
        arr = o.data.root
        out.outputs.add(name=o.name, datatype=o.datatype, shape=list(arr.shape))
        if arr.dtype.kind == "O":
            out.raw_output_contents.append(b"".join(len(s.encode()).to_bytes(4, "little") + s.encode()
                                                    for s in arr.reshape(-1)))
        else:
            out.raw_output_contents.append(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
    return out


class SvodInferenceServicer(InferenceServicer):
    @handle_mlserver_error
    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.ServicerContext) -> pb.ModelInferResponse:
        result = await self._data_plane.infer(payload=request_from_pb(request), name=request.model_name,
                                              version=request.model_version or None)
        return response_to_pb(result)


class SvodGRPCServer(GRPCServer):
    """MLServer's gRPC server with the servicer above; stop() waits up to grace_s for running calls."""

    grace_s = 30.0

    def _create_server(self):
        # MLServer's _create_server with this servicer (it builds its own inside, with no hook to swap it).
        self._inference_servicer = SvodInferenceServicer(self._data_plane, self._model_repository_handlers)
        self._model_repository_servicer = ModelRepositoryServicer(self._model_repository_handlers)
        interceptors = [PromServerInterceptor(enable_handling_time_histogram=True)] \
            if self._settings.metrics_endpoint else []
        self._server = aio.server(ThreadPoolExecutor(max_workers=DefaultGrpcWorkers), interceptors=interceptors,
                                  options=self._get_options())
        add_GRPCInferenceServiceServicer_to_server(self._inference_servicer, self._server)
        add_ModelRepositoryServiceServicer_to_server(self._model_repository_servicer, self._server)
        address = f"{self._settings.host}:{self._settings.grpc_port}"
        if not self._server.add_insecure_port(address):
            raise OSError(f"gRPC cannot listen on {address} (port in use?): choose another with --grpc-port")
        return self._server

    async def stop(self, sig: int | None = None):
        await self._server.stop(grace=self.grace_s)
