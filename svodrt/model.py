"""Model: a loaded bundle, ready to run.

load() reads and verifies the bundle, picks the first code variant this host can run, maps the code
read+execute and the weights read-only (straight from the file when loading a path), and resolves the
entry function. run() validates every input before native code sees it, allocates the outputs, takes
an arena from a small pool (one per concurrent call), and calls the entry function once per thread.

Threads: the entry splits every kernel across `nthreads` callers that meet at barriers. A model owns
threads-1 helper threads. One call at a time uses them; a call that finds them busy (another thread
is running the same model) runs single-threaded instead of waiting, so concurrent calls are safe and
can never deadlock on the barrier.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
from collections.abc import Mapping as MappingT
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from svodrt.bundle import Bundle, TensorInfo, Variant, parse_bundle
from svodrt.errors import InputError, UnsupportedHostError
from svodrt.format import BITS_OF, DTYPES, SYNC_SIZE
from svodrt.host import Host, detect_host
from svodrt.memory import YIELD_FN, Mapping, map_code, map_readonly

NARROW_INTS = frozenset({"int4", "uint4", "int2", "uint2"})

ENTRY_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)
ALIGN = 64


def select_variant(bundle: Bundle, host: Host) -> Variant:
    """The first variant whose architecture is the host's and whose features the host has."""
    reasons = []
    for v in bundle.variants:
        if v.arch != host.arch:
            reasons.append(f"{v.arch}:{v.cpu} (architecture {v.arch})")
            continue
        missing = [f for f in v.features if f not in host.features]
        if not missing:
            return v
        reasons.append(f"{v.arch}:{v.cpu} (missing {', '.join(missing)})")
    raise UnsupportedHostError(f"no code variant of this bundle runs on this {host.arch} host: "
                               f"{'; '.join(reasons)}. Recompile with a variant for this machine, e.g. "
                               f"--target {host.arch}-linux-gnu:{'x86-64' if host.arch == 'x86_64' else 'generic'}")


def _aligned_empty(nbytes: int) -> tuple[np.ndarray, int]:
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    shift = (-raw.ctypes.data) % ALIGN
    return raw, raw.ctypes.data + shift


class Model:
    def __init__(self, source: str | os.PathLike | bytes, threads: int | None = None, host: Host | None = None,
                 verify: bool = True):
        self._closed = False
        self._file: mmap.mmap | None = None
        self._maps: list[Mapping] = []
        self._keep: list[object] = []
        fd = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = memoryview(bytes(source))
        else:
            path = Path(source)
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self._file = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else None
                data = memoryview(self._file) if self._file is not None else memoryview(b"")
                self._fd = os.dup(f.fileno())
                fd = self._fd
        try:
            self.bundle = parse_bundle(data, verify_checksums=verify)
            self.variant = select_variant(self.bundle, host or detect_host())
            sec = self.variant.section
            code = map_code(fd, sec.offset, data[sec.offset: sec.offset + sec.length], self.variant.fixups)
            self._maps.append(code)
            self.weights_address = self._map_weights(fd, data)
        except BaseException:
            self._release(data)
            raise
        self._release(data)
        self._entry = ENTRY_FN(code.address + self.variant.entry)
        self.threads = max(1, int(threads if threads is not None else (os.cpu_count() or 1)))
        self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="svodrt") if self.threads > 1 else None
        self._team = threading.Lock()
        self._arenas: list[tuple[np.ndarray, int]] = []
        self._arena_lock = threading.Lock()

    def _map_weights(self, fd: int | None, data: memoryview) -> int:
        w = self.bundle.weights
        if w.length == 0:
            buf, addr = _aligned_empty(0)
            self._keep.append(buf)
            return addr
        if fd is not None:
            m = map_readonly(fd, w.offset, w.length, "weights")
            self._maps.append(m)
            return m.address
        buf, addr = _aligned_empty(w.length)
        ctypes.memmove(addr, bytes(data[w.offset: w.offset + w.length]), w.length)
        self._keep.append(buf)
        return addr

    def _release(self, data: memoryview) -> None:
        """Drop the parse-time view of the file; mappings made from it stay valid on their own."""
        try:
            data.release()
            if self._file is not None:
                self._file.close()
        except BufferError:
            pass  # a view is still referenced (e.g. by a traceback): the mmap closes when it is collected
        self._file = None
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None

    # ------------------------------------------------------------------ description
    @property
    def inputs(self) -> list[TensorInfo]:
        return list(self.bundle.inputs)

    @property
    def outputs(self) -> list[TensorInfo]:
        return list(self.bundle.outputs)

    def __repr__(self) -> str:
        ins = ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}" for t in self.inputs)
        outs = ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}" for t in self.outputs)
        return f"<svodrt.Model ({ins}) -> ({outs}) on {self.variant.arch}:{self.variant.cpu}>"

    # ------------------------------------------------------------------ running
    def _check_inputs(self, feeds: MappingT[str, object]) -> list[np.ndarray]:
        if not isinstance(feeds, MappingT):
            raise InputError(f"inputs must be a dict of name -> array, got {type(feeds).__name__}")
        expected = [t.name for t in self.bundle.inputs]
        unexpected = [k for k in feeds if k not in expected]
        if unexpected:
            raise InputError(f"unexpected input{'s' if len(unexpected) > 1 else ''} {unexpected}; the model's "
                             f"inputs are {expected}")
        arrays = []
        for t in self.bundle.inputs:
            if t.name not in feeds:
                raise InputError(f"missing input {t.name!r} ({t.dtype}{list(t.shape)}); the model's inputs are "
                                 f"{expected}")
            arrays.append(check_input(t, feeds[t.name]))
        return arrays

    def _arena(self) -> tuple[np.ndarray, int]:
        with self._arena_lock:
            if self._arenas:
                return self._arenas.pop()
        return _aligned_empty(self.bundle.arena_size)

    def run(self, feeds: MappingT[str, object]) -> dict[str, np.ndarray]:
        """Run the model: {input name: array} -> {output name: array}."""
        if self._closed:
            raise RuntimeError("this model was closed")
        arrays = self._check_inputs(feeds)
        outs = [np.empty(t.shape, dtype=np.dtype(DTYPES[t.dtype][0])) for t in self.bundle.outputs]
        arena = self._arena()
        ptrs = [arena[1], self.weights_address, *(a.ctypes.data for a in arrays), *(o.ctypes.data for o in outs)]
        table = (ctypes.c_void_p * len(ptrs))(*ptrs)
        sync = (ctypes.c_uint64 * (SYNC_SIZE // 8))()
        sync[1] = YIELD_FN  # offset 8: the barrier's yield function
        try:
            self._call(table, sync)
        finally:
            with self._arena_lock:
                self._arenas.append(arena)
        return {t.name: o for t, o in zip(self.bundle.outputs, outs, strict=True)}

    def _call(self, table, sync) -> None:
        n = self.threads
        if n > 1 and self._team.acquire(blocking=False):
            try:
                futures = [self._pool.submit(self._entry, table, None, i, n, sync) for i in range(1, n)]
                self._entry(table, None, 0, n, sync)
                for f in futures:
                    f.result()
            finally:
                self._team.release()
        else:
            self._entry(table, None, 0, 1, sync)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for m in self._maps:
            m.close()
        self._maps.clear()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _as_transport(t: TensorInfo, value: np.ndarray, want: np.dtype) -> np.ndarray:
    """An array of a type numpy lacks (ml_dtypes bfloat16, float8, int4...) in the form it travels in:
    the bits of a float format, the values of a narrow integer. Anything else is an InputError."""
    name = value.dtype.name
    if BITS_OF.get(name) == t.dtype and value.dtype.itemsize == want.itemsize:
        return value.view(want)
    if name == t.dtype and t.dtype in NARROW_INTS:
        return value.astype(want)
    raise InputError(f"input {t.name!r} has dtype {value.dtype}, expected {t.dtype}"
                     + (f" (passed as {want})" if want.name != t.dtype else ""))


def check_input(t: TensorInfo, value: object) -> np.ndarray:
    """Validate one input against its declaration; returns a C-contiguous, aligned array.
    Non-contiguous or misaligned arrays are copied (documented); a wrong dtype, rank or dimension is
    an InputError, never a silent conversion."""
    if not isinstance(value, np.ndarray):
        raise InputError(f"input {t.name!r} must be a numpy.ndarray, got {type(value).__name__}")
    want = np.dtype(DTYPES[t.dtype][0])
    if value.dtype != want:
        value = _as_transport(t, value, want)
    if value.ndim != len(t.shape):
        raise InputError(f"input {t.name!r} has rank {value.ndim} (shape {list(value.shape)}), expected rank "
                         f"{len(t.shape)} (shape {list(t.shape)})")
    for i, (got, exp) in enumerate(zip(value.shape, t.shape, strict=True)):
        if got != exp:
            raise InputError(f"input {t.name!r} dim {i}: got {got}, expected {exp}")
    if not value.flags.c_contiguous or value.ctypes.data % want.itemsize:
        value = np.ascontiguousarray(value).copy()
    if value.nbytes != t.nbytes:  # shapes matched; this guards the size arithmetic itself
        raise InputError(f"input {t.name!r} is {value.nbytes} bytes, expected {t.nbytes}")
    return value
