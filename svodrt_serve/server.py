"""`svodrt serve`: MLServer serving the bundles of PATH over REST and gRPC (Open Inference Protocol).

Lifecycle: the servers listen at once (live), the bundles load and pass their check concurrently, and
only then is the server ready (/v2/health/ready, gRPC ServerReady). A bundle that fails makes the
process stop with exit status 1. SIGTERM/SIGINT: readiness goes false, the listeners close (new
connections refused), running requests finish (up to GRACE_S), the models are closed, exit status 0."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import platform
from dataclasses import dataclass
from pathlib import Path

from mlserver import MLServer
from mlserver.handlers import DataPlane
from mlserver.logging import logger
from mlserver.rest import RESTServer
from mlserver.settings import ModelParameters, ModelSettings, Settings

import svodrt
from svodrt_serve.grpc import SvodGRPCServer
from svodrt_serve.model import SvodModel
from svodrt_serve.repository import BundleEntry, find_bundles
from svodrt_serve.rest import RestFront

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
GRACE_S = 30.0  # how long SIGTERM waits for running requests before closing their connections


@dataclass(frozen=True)
class ServeOptions:
    host: str = "0.0.0.0"
    http_port: int = 8080
    grpc_port: int = 8081
    metrics_port: int = 8082  # 0: no metrics server
    threads: int | None = None  # threads per inference (svodrt.load); None: the host's cores
    verify: bool = True
    max_request_bytes: int = 64 << 20
    trust: tuple[str, ...] = ()  # Ed25519 public keys (PEM paths): serve only bundles they signed


class GatedDataPlane:
    """MLServer's data plane, ready only while serving: after every bundle loaded and passed, until
    shutdown begins (MLServer's own says ready while no model is registered yet). A wrapper, not a
    subclass: a second DataPlane would register its Prometheus metrics twice."""

    def __init__(self, inner: DataPlane):
        self._inner = inner
        self.serving = False

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    async def ready(self) -> bool:
        return self.serving and await self._inner.ready()

    async def model_ready(self, name: str, version: str | None = None) -> bool:
        return self.serving and await self._inner.model_ready(name, version)


class SvodRESTServer(RESTServer):
    max_body = ServeOptions.max_request_bytes

    def _get_config(self):
        config = super()._get_config()
        config.app = RestFront(config.app, self._data_plane, self.max_body)
        config.timeout_graceful_shutdown = int(GRACE_S)
        return config

    async def start(self):
        where = f"HTTP cannot listen on {self._settings.host}:{self._settings.http_port} (port in use?): " \
                "choose another with --http-port"
        try:
            await super().start()
        except SystemExit:  # uvicorn logs the bind error, then exits the process
            raise OSError(where) from None
        if not self._server.started:
            raise OSError(where)


class SvodServer(MLServer):
    def __init__(self, settings: Settings, max_body: int):
        self._max_body = max_body
        self.failure: str | None = None
        super().__init__(settings)

    def _create_servers(self):
        self._data_plane = GatedDataPlane(self._data_plane)
        self._rest_server = SvodRESTServer(self._settings, self._data_plane, self._model_repository_handlers)
        self._rest_server.max_body = self._max_body
        self._grpc_server = SvodGRPCServer(self._settings, self._data_plane, self._model_repository_handlers)
        self._grpc_server.grace_s = GRACE_S
        self._kafka_server = None

    async def start(self, models_settings: list[ModelSettings]):
        servers = [self._rest_server.start(), self._grpc_server.start()]
        if self._metrics_server:
            servers.append(self._metrics_server.start())
        servers_task = asyncio.gather(*servers)
        try:
            await asyncio.gather(*[self._model_registry.load(m) for m in models_settings])
            self._data_plane.serving = True
            logger.info("svodrt serve: ready, %d model(s)", len(models_settings))
        except Exception as e:
            self.failure = f"{type(e).__name__}: {e}"
            await self.stop()
        try:
            await servers_task
        except OSError as e:
            self.failure = self.failure or str(e)
            await self.stop()
        for model in await self._model_registry.get_models():
            if model.ready:
                await model.unload()

    async def stop(self, sig: int | None = None):
        self._data_plane.serving = False
        stops = [s.stop(sig) for s in (self._rest_server, self._grpc_server, self._metrics_server)
                 if s is not None and getattr(s, "_server", None) is not None]
        await asyncio.gather(*stops, return_exceptions=True)


def model_settings(entry: BundleEntry, options: ServeOptions) -> ModelSettings:
    return ModelSettings(name=entry.name, implementation=SvodModel, platform="svod",
                         parameters=ModelParameters(uri=str(entry.path), version=entry.version,
                                                    extra={"threads": options.threads, "verify": options.verify,
                                                           "trust": list(options.trust)}))


async def _serve(path: Path, options: ServeOptions) -> str | None:
    entries = find_bundles(path)
    settings = Settings(debug=False, host=options.host, http_port=options.http_port, grpc_port=options.grpc_port,
                        metrics_port=options.metrics_port,
                        metrics_endpoint="/metrics" if options.metrics_port else None,
                        parallel_workers=0, grpc_max_message_length=options.max_request_bytes,
                        server_name="svodrt", server_version=svodrt.__version__, extensions=["binary_tensor_data"],
                        model_repository_root=str(path if path.is_dir() else path.parent))
    server = SvodServer(settings, options.max_request_bytes)
    await server.start([model_settings(e, options) for e in entries])
    return server.failure


def _fixed_mmap_threshold(nbytes: int = 256 << 10) -> None:
    """glibc: allocations of nbytes and more (request bodies, tensors) always get their own mapping,
    unmapped when freed. By default glibc raises that threshold after the first such free, and then
    large buffers of concurrent requests fragment the heap: RSS drifts up under load instead of
    following the requests in flight. Elsewhere (musl, macOS) nothing to do."""
    if platform.libc_ver()[0] != "glibc":
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, nbytes)


def serve(path: str | Path, options: ServeOptions) -> str | None:
    """Serve until SIGTERM/SIGINT; None after a clean shutdown, else why the server stopped."""
    _fixed_mmap_threshold()
    return asyncio.run(_serve(Path(path), options))
