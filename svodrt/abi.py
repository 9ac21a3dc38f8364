"""The compiler/runtime contract of bundle format 1 (docs/bundle-format.md "The entry ABI": the entry and kernel
signatures, buffer table, `dims`, `sync`), defined once here: svodc's code generators and svodrt's executors import
these names, tests/test_abi.py fails when either side writes one of these numbers itself. Every value is fixed for
format major 1 (a change old code would misread needs a new major; docs/bundle-format.md "Compatibility")."""

from __future__ import annotations

ENTRY = "svod_entry"

# bufs: the buffer table, one pointer per slot. Each buffer is BUFFER_ALIGN-aligned; the arena is the
# call's own (arena_size bytes, contents undefined on entry); weights are never written.
ARENA_SLOT = 0
WEIGHTS_SLOT = 1
FIRST_IO_SLOT = 2  # inputs in manifest order, then outputs
BUFFER_ALIGN = 64


def input_slot(i: int) -> int:
    return FIRST_IO_SLOT + i


def output_slot(n_inputs: int, i: int) -> int:
    return FIRST_IO_SLOT + n_inputs + i


def table_slots(n_inputs: int, n_outputs: int) -> int:
    return FIRST_IO_SLOT + n_inputs + n_outputs


# dims: the values of the bounded dims, DIM_SIZE bytes (int64) each, in the manifest's `dims` order
# (format 1.5; svodrt/runner.py checks each against its range first). A bundle without `dims` never
# reads it (callers pass NULL); in one with them, every input and output buffer has the layout of
# its shape at the bounds and the code touches only the elements inside the real shapes.
DIM_SIZE = 8
# Format 1.7: the input dims (the runtime writes them), the computed dims (the code writes each, clamped into its
# range, before any kernel reads it), then from index len(dims) DIMS_STATUS_WORDS zeroed words: status (0, or 1 +
# the index of the first dim found wrong), its value, and 0 if it is out of range, else the size its axis must equal.
DIMS_STATUS_WORDS = 3

# sync: SYNC_SIZE bytes, zeroed by the caller before each call, shared by the call's threads. One
# cache line: two calls' blocks never share one. The caller writes only SYNC_YIELD (and a profiler SYNC_TRACE);
# the rest is the code's. Format 1.0 code used [0, 8) for a barrier; [32, SYNC_SIZE) is reserved (zero).
SYNC_SIZE = 64
SYNC_YIELD = 8  # void (*)(void): the host's sched_yield, called by a thread that has spun long enough
SYNC_NEXT = 16  # uint32: the work queue's next ticket to claim (svodc/codegen/module.py)
SYNC_DONE = 20  # uint32: tickets finished; kernel i starts when every ticket of kernels < i is done
# A part trace (svodrt_tools/parts.py): where a profiler puts a pointer here (svodrt leaves it 0), x86_64 entries
# since 2026-12-06 append a record per kernel part they call: after a uint64 count (atomic; past the uint64 capacity
# that follows it still counts, writing none), TRACE_RECORD-byte records of int32 kernel, thread, part, parts, then
# uint64 rdtsc before and after the call.
SYNC_TRACE = 24
TRACE_HEADER, TRACE_RECORD = 16, 32

# The team (format 1.10, docs/bundle-format.md "The team"): a variant's `team` holds the offsets of svod_serve(box,
# spins), which runs the calls posted to its box (returns how many after `spins` idle looks, at once after the stop
# call: bufs NULL), and the caller's svod_lead(boxes, helpers, bufs, dims, sync): posts the call to every box, runs
# thread 0, takes back each call no helper took, waits for the others (bufs NULL: posts the stop call). A box:
# TEAM_BOX_SIZE zeroed bytes (a cache line on every target) per helper, BUFFER_ALIGN-aligned.
TEAM_SERVE, TEAM_LEAD = "svod_serve", "svod_lead"
TEAM_BOX_SIZE = 256  # and TEAM_YIELD below: void (*)(void), the runtime's, written once: serve yields after a while
TEAM_POSTED, TEAM_TAKEN, TEAM_FINISHED = 0, 4, 8  # uint32 call numbers: posted, last taken, last finished
TEAM_THREAD, TEAM_NTHREADS = 12, 16  # int32: the entry's thread and nthreads for the call
TEAM_BUFS, TEAM_DIMS, TEAM_SYNC, TEAM_YIELD = 24, 32, 40, 48  # pointers: the entry's other arguments, and yield
