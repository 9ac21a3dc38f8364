"""Model: a loaded bundle, ready to run (docs/architecture.md "Runtime").

load() verifies the bundle's structure, picks the first code variant this host can run, copies that
code into fresh memory, checks its sha256 there and makes it read+execute, checks the weights' sha256
when they are small (WEIGHTS_CHECK_LIMIT) and maps them read-only. run() validates every input before
native code sees it, takes an arena from a small pool (one per concurrent call) and calls the entry
once per thread; the entry hands out every kernel's parts to its callers (svodc/codegen/module.py).
A model owns threads-1 helper threads; one call at a time uses them, a call that finds them busy runs
single-threaded, so concurrent calls are safe. close() waits for running calls, then unmaps.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
import time
from collections.abc import Mapping as MappingT
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from svodrt.bundle import Bundle, TensorInfo, Variant, check_section, parse_bundle
from svodrt.errors import InputError, ModelClosedError, UnsupportedHostError
from svodrt.features import feature_names
from svodrt.format import BITS_OF, DTYPES, GPU_KINDS, STRING, SYNC_SIZE
from svodrt.host import Host, detect_host
from svodrt.memory import PAGE, YIELD_FN, Mapping, map_code, map_readonly
from svodrt.strings import StringTable, normalize, strings_of

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

NARROW_INTS = frozenset({"int4", "uint4", "int2", "uint2"})

ENTRY_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)
ALIGN = 64
MAX_THREADS = 1024
# Weights sections up to this size are checksummed at every load (sha256: ~10 ms for 16 MiB); larger
# ones only when asked (load(verify_weights=True), svodrt verify). See docs/architecture.md.
WEIGHTS_CHECK_LIMIT = 16 << 20


def variant_problem(v: Variant, host: Host) -> str | None:
    """Why this host's CPU cannot run variant v, or None if it can."""
    if v.kind in GPU_KINDS:
        return f"a {v.kind} GPU variant: load with device='{v.kind}:0'"
    if v.kind != "cpu":
        return f"variant kind {v.kind!r} is unknown to this runtime: upgrade svodrt"
    if v.arch != host.arch:
        return f"architecture {v.arch}"
    missing = [f for f in v.features if f not in host.features]
    if not missing:
        return None
    known = set(feature_names(v.arch))
    unknown = [f for f in missing if f not in known]
    note = f"; {', '.join(unknown)} unknown to this runtime: upgrade svodrt" if unknown else ""
    return f"missing {', '.join(missing)}{note}"


def select_variant(bundle: Bundle, host: Host, index: int | None = None) -> Variant:
    """The first variant whose architecture is the host's and whose features the host has all of
    (or variant `index`, if the host can run it)."""
    candidates = bundle.variants if index is None else [bundle.variants[index]]
    reasons = []
    for v in candidates:
        problem = variant_problem(v, host)
        if problem is None:
            return v
        reasons.append(f"{v.describe()} ({problem})")
    if index is None and all(v.kind == "cpu" and v.arch != host.arch for v in candidates):  # [cross] name them
        has = ", ".join(v.describe() for v in candidates)
        raise UnsupportedHostError(f"this bundle has no code for this {host.arch} host; it has {has}. Recompile "
                                   f"with a variant for {host.arch}, e.g. --target {host.arch}-linux-gnu, or add one "
                                   f"to a fat bundle: --target {candidates[0].arch},{host.arch}")
    which = "no code variant of this bundle runs" if index is None else f"variant {index} does not run"
    fallback = ":x86-64" if host.arch == "x86_64" else ""  # elsewhere the default CPU is the most portable
    raise UnsupportedHostError(f"{which} on this {host.arch} host: {'; '.join(reasons)}. Recompile with a "
                               f"variant for this machine, e.g. --target {host.arch}-linux-gnu{fallback}")


def _aligned_empty(nbytes: int) -> tuple[np.ndarray, int]:
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    shift = (-raw.ctypes.data) % ALIGN
    return raw, raw.ctypes.data + shift


AUTO_PARALLEL_MIN_S = 300e-6  # models faster than this on one thread use one thread


class Runner:
    """What every loaded model shares, whatever runs it: its description and input checking.
    Subclasses set `bundle` and `variant`, call _set_io(), and implement run() and close()."""

    bundle: Bundle
    variant: Variant

    def _set_io(self) -> None:
        self._input_specs = [(t.name, np.dtype(DTYPES[t.dtype][0]), tuple(t.shape)) for t in self.bundle.inputs]
        self._output_specs = [(tuple(t.shape), np.dtype(DTYPES[t.dtype][0])) for t in self.bundle.outputs]
        self._output_names = [t.name for t in self.bundle.outputs]
        self._string_inputs = [t for t in self.bundle.inputs if t.dtype == STRING]
        self._strings = StringTable(self.bundle.vocabulary) if self._string_inputs else None
        # Format 1.5: outputs decoded at the edge, string ids -> str and ZipMap scores -> dicts.
        self._string_outputs = [t.name for t in self.bundle.outputs if t.dtype == STRING]
        self._decode = StringTable(self.bundle.vocabulary) if (self._string_outputs or self.bundle.zipmaps
                                                               or self.bundle.edge_outputs) else None

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
        return f"<svodrt.Model ({ins}) -> ({outs}) on {self.variant.describe()}>"

    # ------------------------------------------------------------------ running
    def _fast_inputs(self, feeds: object) -> list[np.ndarray] | None:
        """The common case in a few comparisons: a dict of exactly the inputs, each an ndarray of the
        declared dtype and shape, C-contiguous and aligned. None means: take the full check."""
        specs = self._input_specs
        if type(feeds) is not dict or len(feeds) != len(specs) or self._strings is not None:
            return None
        arrays = []
        for name, dtype, shape in specs:
            a = feeds.get(name)
            if (type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous
                    or not a.flags.aligned):
                return None
            arrays.append(a)
        return arrays

    def check_inputs(self, feeds: MappingT[str, object]) -> list[np.ndarray]:
        """Validate a feed dict against the model's inputs; returns the arrays the code will read, in
        input order (C-contiguous and aligned: copied if they were not)."""
        fast = self._fast_inputs(feeds)
        if fast is not None:
            return fast
        if not isinstance(feeds, MappingT):
            raise InputError(f"inputs must be a dict of name -> array, got {type(feeds).__name__}")
        expected = [t.name for t in self.bundle.inputs]
        unexpected = [k for k in feeds if k not in expected]
        if unexpected:
            raise InputError(f"unexpected input{'s' if len(unexpected) > 1 else ''} {unexpected}; the model's "
                             f"inputs are {expected}")
        for t in self.bundle.inputs:
            if t.name not in feeds:
                raise InputError(f"missing input {t.name!r} ({t.dtype}{list(t.shape)}); the model's inputs are "
                                 f"{expected}")
        if self._strings is not None:  # strings become int32 ids, one numbering per call (svodrt/strings.py)
            feeds = {**feeds, **self._strings.intern(self._string_inputs, feeds)}
        return [check_input(t, feeds[t.name]) for t in self.bundle.inputs]

    def _results(self, outs: list[np.ndarray], feeds: MappingT[str, object]) -> dict:
        result: dict = dict(zip(self._output_names, outs, strict=True))
        if self._decode is not None:
            for name in self._string_outputs:
                result[name] = self._decode.decode(result[name], self._string_inputs, feeds)
            for name, keys in self.bundle.zipmaps:
                result[name] = [dict(zip(keys, row, strict=True)) for row in result[name].tolist()]
            for name, source, attrs in self.bundle.edge_outputs:  # StringNormalizer of a string input
                t = next(t for t in self._string_inputs if t.name == source)
                result[name] = normalize(np.array(strings_of(t, feeds[source]), dtype=object).reshape(t.shape), **attrs)
        return result

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class Model(Runner):
    def __init__(self, source: str | os.PathLike | bytes, threads: int | None = None, host: Host | None = None,
                 verify_weights: bool | None = None, variant: int | None = None):
        self._closed = False
        self._maps: list[Mapping] = []
        self._keep: list[object] = []
        self._pool: ThreadPoolExecutor | None = None
        self._state = threading.Condition()
        self._active = 0
        n = threads if threads is not None else (os.cpu_count() or 1)
        self._parallel = True
        self._solo_runs = 0
        self._solo_best = float("inf")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THREADS:
            raise ValueError(f"threads must be an integer in [1, {MAX_THREADS}], got {threads!r}")
        self.threads = n
        if isinstance(source, (bytes, bytearray, memoryview)):
            self._load(memoryview(bytes(source)), None, host, verify_weights, variant)
        else:
            with open(Path(source), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                fmap = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else None
                data = memoryview(fmap if fmap is not None else b"")
                try:
                    self._load(data, f.fileno(), host, verify_weights, variant)
                finally:
                    with contextlib.suppress(BufferError):  # a traceback may still hold a view: GC closes it
                        data.release()
                        if fmap is not None:
                            fmap.close()
        self._entry = ENTRY_FN(self._maps[0].address + self.variant.entry)
        if self.threads > 1:
            from concurrent.futures import ThreadPoolExecutor  # here: its import (logging...) costs ~3 ms

            self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="svodrt")
        self._team = threading.Lock()
        self._set_io()
        self._table_type = ctypes.c_void_p * (2 + len(self.bundle.inputs) + len(self.bundle.outputs))
        self._arenas: list[tuple[np.ndarray, int]] = []
        self._arena_lock = threading.Lock()

    def _load(self, data: memoryview, fd: int | None, host: Host | None, verify_weights: bool | None,
              variant: int | None) -> None:
        try:
            self.bundle = parse_bundle(data)
            if variant is not None and not 0 <= variant < len(self.bundle.variants):
                raise ValueError(f"variant {variant} does not exist (the bundle has {len(self.bundle.variants)})")
            self.variant = select_variant(self.bundle, host or detect_host(), variant)
            sec = self.variant.section
            self._maps.append(map_code(data[sec.offset: sec.offset + sec.length], self.variant.fixups, sec.sha256,
                                       f"code section {sec.name!r} at offset {sec.offset}"))
            w = self.bundle.weights
            if verify_weights or (verify_weights is None and w.length <= WEIGHTS_CHECK_LIMIT):
                check_section(data, w)
            self.weights_address = self._map_weights(fd, data)
        except BaseException:
            self._unmap()
            raise

    def _map_weights(self, fd: int | None, data: memoryview) -> int:
        w = self.bundle.weights
        if fd is not None and w.length and w.offset % PAGE == 0:
            m = map_readonly(fd, w.offset, w.length, "weights")
            self._maps.append(m)
            return m.address
        buf, addr = _aligned_empty(w.length)  # from bytes, or a small section not on a page boundary
        ctypes.memmove(addr, bytes(data[w.offset: w.offset + w.length]), w.length)
        self._keep.append(buf)
        return addr

    def _arena(self) -> tuple[np.ndarray, int]:
        with self._arena_lock:
            if self._arenas:
                return self._arenas.pop()
        return _aligned_empty(self.bundle.arena_size)

    def _begin(self) -> None:
        """Count a call in flight (close() waits for it); refuse calls after close()."""
        with self._state:
            if self._closed:
                raise ModelClosedError("this model was closed; load the bundle again to run it")
            self._active += 1

    def _end(self) -> None:
        with self._state:
            self._active -= 1
            if not self._active:
                self._state.notify_all()

    def run(self, feeds: MappingT[str, object]) -> dict[str, np.ndarray]:
        """Run the model: {input name: array} -> {output name: array}. Safe to call from many threads."""
        return self._results(self._call(self.check_inputs(feeds)), feeds)

    def profile(self, feeds: MappingT[str, object], repeat: int = 10) -> list[tuple[str, float, tuple[str, ...]]]:
        """Time each kernel alone (single-threaded, its own entry point): [(kernel, median seconds,
        ONNX nodes)], in execution order. Times are the calling thread's CPU time, so a busy machine
        that preempts the thread does not inflate them."""
        kernel_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)
        fns = [kernel_fn(self._maps[0].address + off) for off in self.variant.kernels]
        times: list[list[float]] = [[] for _ in fns]

        def each_kernel(table, _sync) -> None:
            for _ in range(repeat):
                for i, fn in enumerate(fns):
                    t0 = time.thread_time()
                    fn(table, None, 0, 1)
                    times[i].append(time.thread_time() - t0)

        self._call(self.check_inputs(feeds), each_kernel)
        return [(k.name, float(np.median(t)), k.provenance) for k, t in zip(self.bundle.kernels, times, strict=True)]

    def _call(self, arrays: list[np.ndarray], run=None) -> list[np.ndarray]:
        """Outputs allocated, an arena lent, the buffer table and sync block made, and run(table, sync)
        called (default: the entry, on as many threads as pay off). The hot path of every inference."""
        self._begin()
        try:
            outs = [np.empty(shape, dtype) for shape, dtype in self._output_specs]
            arena = self._arena()
            try:
                table = self._table_type(arena[1], self.weights_address, *(a.ctypes.data for a in arrays),
                                         *(o.ctypes.data for o in outs))
                sync = (ctypes.c_uint64 * (SYNC_SIZE // 8))()
                sync[1] = YIELD_FN  # offset 8: the entry's yield function
                (run or self._enter)(table, sync)
            finally:
                with self._arena_lock:
                    self._arenas.append(arena)
        finally:
            self._end()
        return outs

    def _enter(self, table, sync) -> None:
        n = self.threads
        if n > 1 and self._solo_runs < 2:
            # The first two calls run on one thread and are timed; a model faster than
            # AUTO_PARALLEL_MIN_S stays single-threaded (waking helpers would cost more than it saves).
            t0 = time.perf_counter()
            self._entry(table, None, 0, 1, sync)
            self._solo_best = min(self._solo_best, time.perf_counter() - t0)
            self._solo_runs += 1
            if self._solo_runs == 2 and self._solo_best < AUTO_PARALLEL_MIN_S:
                self._parallel = False
            return
        if self._pool is not None and self._parallel and self._team.acquire(blocking=False):
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
        """Refuse new runs, wait for running ones to finish, then release the code and weights."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            while self._active:
                self._state.wait()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._unmap()

    def _unmap(self) -> None:
        for m in self._maps:
            m.close()
        self._maps.clear()
        self._keep.clear()



def _as_transport(t: TensorInfo, value: np.ndarray, want: np.dtype) -> np.ndarray:
    """An array of a type numpy lacks (ml_dtypes bfloat16, float8, int4...) in the form it travels in:
    the bits of a float format, the values of a narrow integer. Anything else is an InputError."""
    name = value.dtype.name
    if BITS_OF.get(name) == t.dtype and value.dtype.itemsize == want.itemsize:
        return value.view(want)
    if name == t.dtype and t.dtype in NARROW_INTS:
        return value.astype(want)
    got, hint = str(value.dtype), ""
    if want.name != t.dtype:
        what = "values" if t.dtype in NARROW_INTS else "raw bits"
        hint = f" (pass {t.dtype} as its {what} in a {want} array, or as an ml_dtypes {t.dtype} array)"
    if value.dtype.kind != "V" and value.dtype.newbyteorder("=") == want:
        order = "big" if value.dtype.byteorder == ">" else "little"  # s390x hosts are big-endian
        got, hint = value.dtype.str, f" in {order}-endian byte order: convert with .astype('{want.str}')"
    raise InputError(f"input {t.name!r} has dtype {got}, expected {t.dtype}{hint}")


def check_input(t: TensorInfo, value: object) -> np.ndarray:
    """Validate one input against its declaration; returns a C-contiguous, aligned array.
    Non-contiguous or misaligned arrays are copied (documented); a wrong type, dtype (including byte
    order), rank or dimension is an InputError, never a silent conversion."""
    if not isinstance(value, np.ndarray) or isinstance(value, np.ma.MaskedArray):
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
        value = np.array(value, order="C", copy=True)  # numpy allocations are aligned
    if value.nbytes != t.nbytes:  # shapes matched; this guards the size arithmetic itself
        raise InputError(f"input {t.name!r} is {value.nbytes} bytes, expected {t.nbytes}")
    return value
