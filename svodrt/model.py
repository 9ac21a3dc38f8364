"""Model: the CPU executor, built on a Program: maps the first variant this host runs (memory.py), runs the
entry (abi.py) on up to `threads` threads; its invariants: docs/architecture.md "Runtime" (threads, fork, close)."""

from __future__ import annotations

import ctypes
import os
import time
import weakref
from collections.abc import Mapping as MappingT
from typing import TYPE_CHECKING

import numpy as np

from svodrt.abi import ARENA_SLOT, FIRST_IO_SLOT, SYNC_SIZE, SYNC_YIELD, WEIGHTS_SLOT, table_slots
from svodrt.bundle import Bundle, Program, TrustSpec, Variant, aligned_empty, host_memory
from svodrt.errors import ModelClosedError, RuntimeFailure, UnsupportedHostError
from svodrt.features import feature_names
from svodrt.format import GPU_KINDS
from svodrt.host import Host, detect_host
from svodrt.runner import Runner, check_dims_status, check_input, real_output  # noqa: F401 (check_input: API)

if TYPE_CHECKING:
    from svodrt.team import Team

ENTRY_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)
KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)
MAX_THREADS = 1024
AUTO_PARALLEL_MIN_S = 300e-6  # models faster than this on one thread use one thread
_LIVE: weakref.WeakSet[Model] = weakref.WeakSet()  # what a forked child must reset (_after_fork)
_EXIT_HOOK: list[bool] = []  # [True] once _stop_teams is registered


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
    unknown = [f for f in missing if f not in feature_names(v.arch)]
    note = f"; {', '.join(unknown)} unknown to this runtime: upgrade svodrt" if unknown else ""
    return f"missing {', '.join(missing)}{note}"


def select_variant(bundle: Bundle, host: Host, index: int | None = None) -> Variant:
    """The first variant this host runs, or variant `index` if it runs (docs/architecture.md "Runtime")."""
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


class Model(Runner):
    def __init__(self, source: str | os.PathLike | bytes, threads: int | None = None, host: Host | None = None,
                 verify_weights: bool | None = None, variant: int | None = None, trust: TrustSpec | None = None,
                 spin: bool = True):
        self._closed = True  # until loaded: close() and __del__ have nothing to release
        self._spin = spin
        n = threads if threads is not None else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else (os.cpu_count() or 1)  # the CPUs this process may use (taskset, a container's cpuset)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THREADS:
            raise ValueError(f"threads must be an integer in [1, {MAX_THREADS}], got {threads!r}")
        self.threads = n
        program = Program(source, verify_weights, trust, variant)
        try:
            self.bundle, self.signer, self.weights_verified = program.bundle, program.signer, program.weights_verified
            self.variant = select_variant(self.bundle, host or detect_host(), variant)
            b = self.bundle
            arena, need = b.arena_size, b.arena_size + sum(t.nbytes for t in (*b.inputs, *b.outputs))
            if need > host_memory():  # a clear error now, not a MemoryError at run()
                raise RuntimeFailure(f"the bundle needs {need} bytes for its arena, inputs and outputs, more than "
                                     f"this host's {host_memory()} bytes of memory")
            from svodrt import memory  # at load, not at `import svodrt`: mmap, libc through ctypes
            sec, self._yield = self.variant.section, memory.YIELD_FN
            self._code = memory.map_code(lambda view: program.source.readinto(sec.offset, view), self.variant.fixups,
                                         sec.sha256, f"code section {sec.name!r} at offset {sec.offset}", sec.length)
            self._arenas = [aligned_empty(arena, "arena")]  # at load: a host without the memory says so now
            self._weights, self.weights_address = program.weights()  # last: no failure after it keeps a lease
            self._lease = self._weights if isinstance(self._weights, memory.FileWeights) else None
        finally:
            program.close()
        self._entry = ENTRY_FN(self._code.address + self.variant.entry)
        self._set_io()
        self._table_type = ctypes.c_void_p * table_slots(len(self.bundle.inputs), len(self.bundle.outputs))
        self._parallel, self._solo_runs, self._solo_best = True, 0, float("inf")
        self._reset_threads()
        self._closed = False
        _LIVE.add(self)

    def _reset_threads(self) -> None:
        """Fresh locks, no helpers (started at the first parallel call), no arena in use: at load, and
        in a forked child, where the parent's helper threads and any lock they held do not exist."""
        import threading  # here, not at `import svodrt`
        self._helpers: Team | None = None  # format 1.10 code: helpers that wait in native code (svodrt/team.py)
        self._team = threading.Lock()
        self._state = threading.Condition()
        self._active = 0

    def _begin(self, arena: bool = False) -> tuple[np.ndarray, int] | None:
        """Count a call in flight (close() waits for it); refuse calls after close(). arena: lend an idle
        arena too, if there is one (None: the caller makes one). One lock for both: the per-call floor."""
        with self._state:
            if self._closed:
                raise ModelClosedError("this model was closed; load the bundle again to run it")
            if self._lease is not None and self._lease.lost:
                raise RuntimeFailure(f"the weights of this model are lost: {self._lease.lost}; load the bundle again")
            self._active += 1
            return self._arenas.pop() if arena and self._arenas else None

    def _end(self, arena: tuple[np.ndarray, int] | None = None) -> None:
        with self._state:
            if arena is not None:
                self._arenas.append(arena)
            self._active -= 1
            if self._closed and not self._active:  # only close() waits: no notify (~1 us) on every call
                self._state.notify_all()

    def run(self, feeds: MappingT[str, object]) -> dict[str, np.ndarray]:
        """Run the model: {input name: array} -> {output name: array}. Safe to call from many threads."""
        feeds = self.edge_feeds(feeds)
        return self._results(self._outputs(feeds), feeds)

    def _outputs(self, feeds: MappingT[str, object]) -> list[np.ndarray]:
        """Checked inputs in, outputs at their real shapes out (cut from the bound's: svodrt/runner.py)."""
        arrays, dims = self._prepare(feeds)
        outs = self._call(arrays, dims=dims)
        if dims is None:
            return outs
        check_dims_status(dims, self.bundle.dims)
        return [real_output(t, o, dims, self._dim_slots) for t, o in zip(self.bundle.outputs, outs, strict=True)]

    def _call(self, arrays: list[np.ndarray], run=None, outs: list[np.ndarray] | None = None,
              dims=None) -> list[np.ndarray]:
        """Outputs allocated (or given, checked: svodrt_session/session.py), an arena lent, the buffer table and sync
        block made (svodrt/abi.py), run(table, sync[, dims]) called (default: the entry, on as many threads
        as pay off). dims: the bounded dims' values (svodrt/runner.py), None in a static bundle."""
        arena = self._begin(arena=True)
        try:  # _end takes the arena back: _enter returns only once no thread uses it
            arena = arena or aligned_empty(self.bundle.arena_size, "arena")
            outs = outs if outs is not None else [np.empty(shape, dtype) for shape, dtype in self._output_specs]
            table = self._table_type()
            table[ARENA_SLOT], table[WEIGHTS_SLOT] = arena[1], self.weights_address
            table[FIRST_IO_SLOT:] = [_address(a) for a in (*arrays, *outs)]
            sync = (ctypes.c_uint64 * (SYNC_SIZE // 8))()
            sync[SYNC_YIELD // 8] = self._yield
            fn = run or self._enter
            fn(table, sync) if dims is None else fn(table, sync, dims)
        finally:
            self._end(arena)
        return outs

    def _enter(self, table, sync, dims=None) -> None:
        n = self.threads if self.variant.team else 1  # code older than format 1.10 has no team: one thread
        if n > 1 and self._solo_runs < 2:
            # The first two calls run on one thread and are timed; a model faster than
            # AUTO_PARALLEL_MIN_S stays single-threaded (waking helpers would cost more than it saves).
            t0 = time.perf_counter()
            self._entry(table, dims, 0, 1, sync)
            self._solo_best = min(self._solo_best, time.perf_counter() - t0)
            self._solo_runs += 1
            if self._solo_runs == 2 and self._solo_best < AUTO_PARALLEL_MIN_S:
                self._parallel = False
            return
        if n > 1 and self._parallel and self._team.acquire(blocking=False):
            try:
                if self._helpers is None:
                    self._helpers = _start_team(self, n - 1)
                self._helpers.run(table, dims, sync)
            finally:
                self._team.release()
        else:
            self._entry(table, dims, 0, 1, sync)

    def close(self) -> None:
        """Refuse new runs, wait for running ones to finish, then release the code and weights."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            while self._active:
                self._state.wait()
        if self._helpers is None or self._helpers.close():  # else (a collection on a helper) the Team unmaps it
            self._code.close()
        self._weights = self._lease = self._arenas = self._helpers = None  # type: ignore[assignment]  # exit stops no Team twice


def _address(a: np.ndarray) -> int:  # ~3x cheaper than a.ctypes.data (an object per call), a third of the floor
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):  # read-only or empty
        return a.ctypes.data


def _start_team(m: Model, helpers: int) -> Team:
    import threading

    from svodrt.team import Team

    if not _EXIT_HOOK:  # threading's exit hooks run before daemon threads are dropped (concurrent.futures' way)
        threading._register_atexit(_stop_teams)  # type: ignore[attr-defined]
        _EXIT_HOOK.append(True)
    return Team(m._code, m.variant.team, helpers, m._spin, m._yield)


def _stop_teams() -> None:  # at exit: no helper is left in native code; a later call runs on one thread
    for m in list(_LIVE):
        with m._team:
            m._parallel = False
            if m._helpers is not None:
                m._helpers.close()


def _after_fork() -> None:
    for m in list(_LIVE):
        if not m._closed:  # the parent's idle arenas stay: they are the child's own copies
            m._reset_threads()


os.register_at_fork(after_in_child=_after_fork)
