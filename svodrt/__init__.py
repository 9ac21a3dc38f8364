"""svodrt: the Svod runtime. Loads a .svod bundle and runs it; needs only numpy, msgpack, zstandard.
`m = svodrt.load("model.svod"); y = m.run({"x": x})`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from svodrt.bundle import TrustSpec
from svodrt.errors import (
    BundleFormatError,
    BundleVersionError,
    DeviceError,
    InputError,
    ModelClosedError,
    RuntimeFailure,
    SvodError,
    UnsupportedHostError,
    UntrustedBundleError,
)
from svodrt.host import Host, detect_host
from svodrt.model import Model
from svodrt.runner import Runner

if TYPE_CHECKING:
    from svodrt_session import InferenceSession, NodeArg, SessionOptions

__version__ = "0.1.0"


def load(source: str | os.PathLike | bytes, threads: int | None = None, host: Host | None = None,
         verify_weights: bool | None = None, variant: int | None = None, device: str = "cpu",
         graph: bool = True, trust: TrustSpec | None = None, spin: bool = True) -> Runner:
    """Load a bundle (path or bytes), checked as docs/architecture.md "What is checksummed when" says (code: always).
    threads: per inference (default: this process's CPUs; a model under 0.3 ms on one thread uses one). host: pick the
    variant for this host (e.g. `detect_host().limited_to("x86-64-v2")`). verify_weights: check the weights' sha256
    (default: up to 16 MiB of them unless this file's record says they passed, all under a trust policy; False:
    never). variant: use this variant (index). device: "cpu", "cuda:N" or "hip:N"; graph: launch a GPU model's
    kernels as one captured graph. trust: the Ed25519 public keys (PEM paths or bytes) whose signed bundles alone
    load (`model.signer` names the signer). spin: helpers spin 10 ms for the next call (False: they sleep at once, as
    onnxruntime's session.intra_op.allow_spinning=0). docs/architecture.md "Runtime"."""
    if device != "cpu":
        from svodrt_gpu import GpuModel

        return GpuModel(source, device, verify_weights=verify_weights, variant=variant, graph=graph, trust=trust)
    return Model(source, threads=threads, host=host, verify_weights=verify_weights, variant=variant, trust=trust,
                 spin=spin)


def __getattr__(name: str) -> object:  # onnxruntime's API (svodrt_session/), imported when first named
    if name in ("InferenceSession", "NodeArg", "SessionOptions"):
        import svodrt_session
        return getattr(svodrt_session, name)
    raise AttributeError(f"module 'svodrt' has no attribute {name!r}")


__all__ = ["BundleFormatError", "BundleVersionError", "DeviceError", "Host", "InferenceSession", "InputError", "Model",
           "ModelClosedError", "NodeArg", "Runner", "RuntimeFailure", "SessionOptions", "SvodError",
           "UnsupportedHostError", "UntrustedBundleError", "detect_host", "load"]
