"""Program: a bundle opened (regular files only, O_NONBLOCK), verified (bundle.py, plan.py), its
signature checked under a trust policy (trust.py) before any code is read, then read as private
checked bytes; the step every executor (model.py: CPU, gpu_model.py: CUDA, HIP) starts with. Nothing
stays mapped from the file: changing it after load changes nothing (docs/architecture.md "Runtime")."""

from __future__ import annotations

import os

import numpy as np

from svodrt.abi import BUFFER_ALIGN
from svodrt.bundle import Bundle, Section, Source, check_section, parse_bundle
from svodrt.errors import RuntimeFailure
from svodrt.trust import TrustSpec, check_signature, trusted_keys


def aligned_empty(nbytes: int, what: str) -> tuple[np.ndarray, int]:
    """A BUFFER_ALIGN-aligned buffer of nbytes (and its address); RuntimeFailure if the host cannot give it."""
    try:
        raw = np.empty(nbytes + BUFFER_ALIGN, dtype=np.uint8)
    except MemoryError:
        raise RuntimeFailure(f"cannot allocate the {what} ({nbytes} bytes): this host has not that much memory "
                             "free") from None
    return raw, raw.ctypes.data + (-raw.ctypes.data) % BUFFER_ALIGN


def host_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class Program:
    """A verified bundle and the source it is read from (closed by close(), the executor's job)."""

    def __init__(self, source: str | os.PathLike | bytes, verify_weights: bool | None = None,
                 trust: TrustSpec | None = None, variant: int | None = None):
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.source = Source(bytes(source))
        else:
            self.source = Source.open(source)
        try:
            self.bundle: Bundle = parse_bundle(self.source)
            self.signer = check_signature(self.bundle.manifest, None if trust is None else trusted_keys(trust))
            n = len(self.bundle.variants)
            if variant is not None and not 0 <= variant < n:
                raise ValueError(f"variant {variant} does not exist (the bundle has {n})")
            # The weights are checked once (svodrt verify), not at every load, unless asked or under a
            # trust policy (docs/architecture.md "Runtime": at 0.6 ms/MB, more than the whole load).
            self.check_weights = trust is not None or bool(verify_weights)
        except BaseException:
            self.close()
            raise

    def image(self, sec: Section) -> bytes | memoryview:
        """A section's bytes, private and checked against its sha256."""
        data = self.source.read(sec.offset, sec.length)
        check_section(self.source, sec, data)
        return data

    def weights(self) -> tuple[np.ndarray, int]:
        """The weights section in private, aligned memory, checked if check_weights."""
        w = self.bundle.weights
        buf, addr = aligned_empty(w.length, "weights")
        view = memoryview(buf)[addr - buf.ctypes.data:][: w.length]
        self.source.readinto(w.offset, view)
        if self.check_weights:
            check_section(self.source, w, view)
        return buf, addr

    def close(self) -> None:
        self.source.close()
