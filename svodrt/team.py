"""A model's helper threads, waiting for the next call in native code (format 1.10, svodrt/abi.py "The team"). A
helper waiting in the OS needs a wake-up per call, 10-450 us on a shared VM (issue 13; onnxruntime's and OpenBLAS's
workers spin 40 and 100 ms after a call for the same reason): one here spins in `svod_serve` for SPIN_S after its
last call, then sleeps on `_cond` until run() wakes it. svod_lead posts, runs and joins a call in one native call,
and takes back a call no helper took (one asleep or not yet woken): a missed wake-up costs one call's parallelism,
never a wait. The Team keeps the code mapped (Model.close() unmaps it only once every helper exited)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time

from svodrt.abi import TEAM_BOX_SIZE, TEAM_POSTED, TEAM_TAKEN, TEAM_YIELD
from svodrt.bundle import aligned_empty

SPIN_S = 0.01  # a helper spins this long after its last call, then sleeps
CHUNK_S = 0.001  # one svod_serve call spins about this long (calibrated) before the helper's loop looks at the clock
SERVE_FN = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64)  # both release the GIL
LEAD_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class Team:
    """`helpers` threads that run the entry's threads 1..helpers of each call (spin: for SPIN_S after each)."""

    def __init__(self, code, offsets: tuple[int, ...], helpers: int, spin: bool, yield_fn: int):
        self._code = code  # the memory.Mapping the helpers run in: alive as long as they are
        self._serve, self._lead = SERVE_FN(code.address + offsets[0]), LEAD_FN(code.address + offsets[1])
        self._memory, self._first = aligned_empty(helpers * TEAM_BOX_SIZE, "helper boxes")
        self._memory.fill(0)
        boxes = [self._first + i * TEAM_BOX_SIZE for i in range(helpers)]
        for box in boxes:
            ctypes.c_void_p.from_address(box + TEAM_YIELD).value = yield_fn
        self._spin_s, self._cond, self._caller_cpu = SPIN_S * spin, threading.Condition(), -1
        self._sleeping = self._stopping = 0
        self._getcpu = hasattr(os, "sched_setaffinity") and getattr(ctypes.CDLL(None), "sched_getcpu", None)
        self._threads = [threading.Thread(target=self._loop, args=(box,), daemon=True, name=f"svodrt-{i + 1}")
                         for i, box in enumerate(boxes)]
        for t in self._threads:
            t.start()

    def run(self, table, dims, sync) -> None:
        """One call on the caller (thread 0) and every helper; returns when none of them uses the call's memory."""
        if self._sleeping:  # wake them first: a helper woken just before the post finds it while it spins
            with self._cond:
                self._caller_cpu = self._getcpu() if self._getcpu else -1
                self._cond.notify_all()
        self._lead(self._first, len(self._threads), table, dims, sync)

    def close(self) -> bool:
        """Stop every helper; True once all have exited (False on one of them, running a collection there)."""
        with self._cond:
            self._stopping = 1
            self._cond.notify_all()
        self._lead(self._first, len(self._threads), None, None, None)  # the stop call
        for t in (others := [t for t in self._threads if t is not threading.current_thread()]):
            t.join()
        return len(others) == len(self._threads)

    def _loop(self, box: int) -> None:
        posted, taken = (ctypes.c_uint32.from_address(box + o) for o in (TEAM_POSTED, TEAM_TAKEN))
        spins = 1000  # calibrated to about CHUNK_S per call (a pause is 10-150 cycles, by CPU; none on some)
        while not self._stopping:
            last = time.monotonic()
            while not self._stopping:  # run what comes, for SPIN_S after the last call (at least once per wake-up)
                t0 = time.monotonic()
                if self._serve(box, spins if self._spin_s else 1):
                    last = time.monotonic()
                elif (t1 := time.monotonic()) - last >= self._spin_s:
                    break
                elif t1 > t0:  # at most doubling: past 4,000 idle looks each look yields, and costs far more
                    spins = max(100, min(2 * spins, int(spins * CHUNK_S / (t1 - t0))))
            with self._cond:  # then sleep until run() or close() wakes it
                self._sleeping += 1
                if not self._stopping and posted.value == taken.value:
                    self._cond.wait()
                self._sleeping -= 1
            move_off(self._getcpu, {self._caller_cpu})


def move_off(getcpu, taken: set[int]) -> None:
    """Move this thread off the CPUs in `taken` if it is on one: Linux often wakes a thread on the CPU of the thread
    that woke it, where it waits behind the caller while another CPU idles (issue 13: a 2-thread GEMM after a 50 ms
    gap ran at one thread's speed). It moves to a free CPU of its allowed set, and the mask is given back at once."""
    if getcpu and getcpu() in taken:
        with contextlib.suppress(OSError):  # a sandbox that denies these calls, a cpuset changed: run where we are
            if free := (mask := os.sched_getaffinity(0)) - taken:
                os.sched_setaffinity(0, free)  # moves this thread now, before it returns
                os.sched_setaffinity(0, mask)
