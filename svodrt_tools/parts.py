"""`svodrt profile --threads N`: where a multi-threaded call's time goes, from the part trace the entry writes
(svodrt/abi.py SYNC_TRACE: one record per kernel part, with the cycle counter before and after it).

Per kernel: its time on one thread (the same trace, the model loaded with one thread), its wall time on N threads
(first part's start to last part's end), the threads' busy time in it (the sum of its parts) and its parts. A kernel
whose busy time on N threads exceeds its one-thread time by much ran slower per element when shared (its data
split between the cores' caches, or each part re-reading what the others read); a call whose wall time exceeds
its threads' busy time over N waited (parts of unequal size, kernels of one part that thread 0 runs alone, the
queue's claims and waits). Traced at the same cost as a plain call but for two cycle-counter reads per part.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

import numpy as np

from svodrt.abi import SYNC_TRACE, TRACE_HEADER, TRACE_RECORD

RECORD = np.dtype([("kernel", "<i4"), ("thread", "<i4"), ("part", "<i4"), ("parts", "<i4"),
                   ("t0", "<u8"), ("t1", "<u8")])
assert RECORD.itemsize == TRACE_RECORD


class NoPartTrace(RuntimeError):
    """The bundle's entry writes no part trace (not x86_64 code, or compiled before the trace existed)."""


@dataclass(frozen=True)
class PartRow:
    kernel: str
    wall: float  # seconds, median over the calls: first part's start to last part's end
    busy: float  # seconds, median over the calls: the sum of its parts' times on every thread
    parts: int  # parts per call (median)


@dataclass(frozen=True)
class PartTrace:
    threads: int
    call: float  # seconds, median: the call's first part's start to its last part's end
    busy: tuple[float, ...]  # per thread, seconds, median over the calls
    rows: list[PartRow]  # in kernel order; kernels that ran no part are left out


def _traced_calls(model, feeds, calls: int, per_call: int) -> tuple[np.ndarray, list[tuple[int, int]], float]:
    """Run `calls` traced calls: (records, each call's [start, end) in them, cycle-counter ticks per second)."""
    arrays, dims = model._prepare(feeds)
    capacity = max(calls, 2) * per_call
    trace = np.zeros(TRACE_HEADER + capacity * TRACE_RECORD, np.uint8)
    header = trace[:TRACE_HEADER].view(np.uint64)
    header[1] = capacity
    address = trace.ctypes.data
    model._solo_runs = 2  # the requested threads from the first call: the timed one-thread start skipped

    def run(table, sync, dims=None) -> None:
        ctypes.c_uint64.from_address(ctypes.addressof(sync) + SYNC_TRACE).value = address
        model._enter(table, sync, dims)

    bounds, starts = [], []
    for i in range(calls):
        if i == 1:
            time.sleep(0.05)  # calls 0 and 1 start a known time apart: the ticks per second
        first = int(header[0])
        starts.append(time.perf_counter())
        model._call(arrays, run, dims=dims)
        bounds.append((first, int(header[0])))
    if int(header[0]) > capacity:
        raise RuntimeError(f"part trace overflowed: {int(header[0])} records for {capacity} places")
    records = trace[TRACE_HEADER:TRACE_HEADER + int(header[0]) * TRACE_RECORD].view(RECORD)
    if not len(records):
        raise NoPartTrace("this bundle's code writes no part trace (x86_64 bundles compiled since 2026-12-06 do)")
    if calls < 2:
        return records, bounds, 0.0
    t0 = [int(records[a:b]["t0"].min()) for a, b in bounds[:2]]
    hz = (t0[1] - t0[0]) / (starts[1] - starts[0])
    return records, bounds, hz


def part_trace(model, feeds, calls: int = 20) -> PartTrace:
    """Trace `calls` calls of a loaded CPU model at its own thread count (after one untraced call)."""
    model.run(feeds)
    probe, _, _ = _traced_calls(model, feeds, 1, 1 << 16)
    records, bounds, hz = _traced_calls(model, feeds, max(calls, 2), 2 * len(probe) + 64)
    names = [k.name for k in model.bundle.kernels]
    walls: dict[int, list[float]] = {}
    busy: dict[int, list[float]] = {}
    parts: dict[int, list[int]] = {}
    call_walls, thread_busy = [], np.zeros((len(bounds), model.threads))
    for c, (a, b) in enumerate(bounds):
        r = records[a:b]
        took = (r["t1"] - r["t0"]).astype(np.float64) / hz
        call_walls.append(float(r["t1"].max() - r["t0"].min()) / hz)
        np.add.at(thread_busy[c], np.minimum(r["thread"], model.threads - 1), took)
        for k in np.unique(r["kernel"]):
            mine = r["kernel"] == k
            walls.setdefault(int(k), []).append(float(r["t1"][mine].max() - r["t0"][mine].min()) / hz)
            busy.setdefault(int(k), []).append(float(took[mine].sum()))
            parts.setdefault(int(k), []).append(int(mine.sum()))
    rows = [PartRow(names[k], float(np.median(walls[k])), float(np.median(busy[k])), int(np.median(parts[k])))
            for k in sorted(walls)]
    return PartTrace(model.threads, float(np.median(call_walls)), tuple(np.median(thread_busy, axis=0)), rows)


def print_parts(one: PartTrace, many: PartTrace, top: int) -> None:
    """Kernels by the time they lose on many threads against one (wall - one-thread time / threads)."""
    n = many.threads
    solo = {r.kernel: r for r in one.rows}
    rows = [(r.wall - solo[r.kernel].wall / n, r, solo[r.kernel]) for r in many.rows if r.kernel in solo]
    width = max([len("kernel"), *(len(r.kernel) for _, r, _ in rows)])
    print(f"one call: {1e3 * one.call:.3f} ms on 1 thread, {1e3 * many.call:.3f} ms on {n} "
          f"({one.call / many.call:.2f}x); busy per thread " + ", ".join(f"{1e3 * b:.3f}" for b in many.busy) +
          f" ms: {1e3 * sum(r.busy for _, r, _ in rows):.3f} ms in kernels against {1e3 * one.call:.3f} on one "
          f"thread, waiting {1e3 * (n * many.call - sum(many.busy)):.3f} ms")
    print(f"{'kernel':{width}s} {'1 thr ms':>9s} {f'{n} thr ms':>9s} {'speedup':>7s} {'busy/1thr':>9s} {'parts':>5s}")
    for _, r, s in sorted(rows, key=lambda t: -t[0])[:top]:
        print(f"{r.kernel:{width}s} {1e3 * s.wall:9.3f} {1e3 * r.wall:9.3f} {s.wall / r.wall:7.2f} "
              f"{r.busy / s.wall:9.2f} {r.parts:5d}")
