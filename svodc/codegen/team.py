"""The team functions of the entry module (format 1.10; the contract and the box layout: svodrt/abi.py,
docs/bundle-format.md "The team"): a helper thread of the runtime waits for the next call in `svod_serve`, spinning
on its box; the caller's `svod_lead` posts the call to every box, runs thread 0 and joins every helper, in one
native call, so no signal handler can run between the post and the join.

Ordering: lead writes a call's arguments into a box, then POSTED with a release store; serve reads POSTED with an
acquire load, owns call p once its compare-and-swap moved TAKEN from p - 1 to p (never to a POSTED it read earlier:
a stale read takes nothing), and only then reads the arguments. It publishes FINISHED with a release store after
the entry returned; lead's acquire load of FINISHED makes every output the helper wrote visible to the caller.
lead's own compare-and-swap of TAKEN takes back a call no helper has started (a helper asleep in the OS): exactly
one of the two moves TAKEN, so a call is run by its helper or by nobody, and never after lead has returned. The
entry lets thread 0 finish a call alone (svodc/codegen/module.py), so a call taken back costs only parallelism.
"""

from __future__ import annotations

from svodrt.abi import (
    ENTRY,
    SYNC_YIELD,
    TEAM_BOX_SIZE,
    TEAM_BUFS,
    TEAM_DIMS,
    TEAM_FINISHED,
    TEAM_LEAD,
    TEAM_NTHREADS,
    TEAM_POSTED,
    TEAM_SERVE,
    TEAM_SYNC,
    TEAM_TAKEN,
    TEAM_THREAD,
    TEAM_YIELD,
)

TEAM_SYMBOLS = (TEAM_SERVE, TEAM_LEAD)
_FIELDS = {"posted": TEAM_POSTED, "taken": TEAM_TAKEN, "finished": TEAM_FINISHED, "thread": TEAM_THREAD,
           "nthreads": TEAM_NTHREADS, "bufs": TEAM_BUFS, "dims": TEAM_DIMS, "sync": TEAM_SYNC}


def _fields(box: str) -> str:
    return "\n".join(f"  %{name}p = getelementptr inbounds i8, ptr {box}, i64 {offset}"
                     for name, offset in _FIELDS.items())


def team_functions(hint: str, spin_before_yield: int) -> list[str]:
    """The two functions' IR; hint: the target's spin-wait call (or nothing), as the entry's waits use it. Both
    wait as the entry does: spin_before_yield spins with the hint, then each look after a yield, so a helper
    that shares its CPU with the caller (a busy machine) hands it back instead of spinning through its slice."""
    return f"""
define i32 @{TEAM_SERVE}(ptr %box, i64 %spins) #0 {{
entry:
{_fields("%box")}
  br label %look
look:
  %idle = phi i64 [ 0, %entry ], [ %idle.next, %pause ], [ %idle.next, %yield ], [ 0, %ran ], [ %idle, %take ]
  %runs = phi i32 [ 0, %entry ], [ %runs, %pause ], [ %runs, %yield ], [ %runs.next, %ran ], [ %runs, %take ]
  %t = load atomic i32, ptr %takenp monotonic, align 4
  %p = load atomic i32, ptr %postedp acquire, align 4
  %want = add i32 %t, 1
  %new = icmp eq i32 %p, %want
  br i1 %new, label %take, label %wait
take:
  %x = cmpxchg ptr %takenp, i32 %t, i32 %want acquire monotonic, align 4
  %ok = extractvalue {{ i32, i1 }} %x, 1
  br i1 %ok, label %run, label %look
run:
  %bufs = load ptr, ptr %bufsp, align 8
  %stop = icmp eq ptr %bufs, null
  br i1 %stop, label %stopped, label %call
call:
  %dims = load ptr, ptr %dimsp, align 8
  %sync = load ptr, ptr %syncp, align 8
  %thread = load i32, ptr %threadp, align 4
  %nthreads = load i32, ptr %nthreadsp, align 4
  call void @{ENTRY}(ptr %bufs, ptr %dims, i32 %thread, i32 %nthreads, ptr %sync)
  store atomic i32 %want, ptr %finishedp release, align 4
  br label %ran
ran:
  %runs.next = add i32 %runs, 1
  br label %look
stopped:
  store atomic i32 %want, ptr %finishedp release, align 4
  ret i32 %runs
wait:
  %idle.next = add i64 %idle, 1
  %enough = icmp uge i64 %idle.next, %spins
  br i1 %enough, label %out, label %spin
spin:
  %long = icmp ugt i64 %idle, {spin_before_yield}
  br i1 %long, label %yield, label %pause
pause:
  {hint}
  br label %look
yield:
  %fpp = getelementptr inbounds i8, ptr %box, i64 {TEAM_YIELD}
  %fp = load ptr, ptr %fpp, align 8
  call void %fp()
  br label %look
out:
  ret i32 %runs
}}

define void @{TEAM_LEAD}(ptr %boxes, i32 %helpers, ptr %bufs, ptr %dims, ptr %sync) #0 {{
entry:
  %nthreads = add i32 %helpers, 1
  br label %post
post:
  %i = phi i32 [ 0, %entry ], [ %i.next, %posted ]
  %more = icmp ult i32 %i, %helpers
  br i1 %more, label %post.box, label %posted.all
post.box:
  %off = mul i32 %i, {TEAM_BOX_SIZE}
  %box = getelementptr inbounds i8, ptr %boxes, i32 %off
{_fields("%box")}
  store ptr %bufs, ptr %bufsp, align 8
  store ptr %dims, ptr %dimsp, align 8
  store ptr %sync, ptr %syncp, align 8
  %thread = add i32 %i, 1
  store i32 %thread, ptr %threadp, align 4
  store i32 %nthreads, ptr %nthreadsp, align 4
  %p = load atomic i32, ptr %postedp monotonic, align 4
  %p.next = add i32 %p, 1
  store atomic i32 %p.next, ptr %postedp release, align 4
  br label %posted
posted:
  %i.next = add i32 %i, 1
  br label %post
posted.all:
  %stop = icmp eq ptr %bufs, null
  br i1 %stop, label %out, label %run
run:
  call void @{ENTRY}(ptr %bufs, ptr %dims, i32 0, i32 %nthreads, ptr %sync)
  br label %join
join:
  %j = phi i32 [ 0, %run ], [ %j.next, %joined ]
  %left = icmp ult i32 %j, %helpers
  br i1 %left, label %join.box, label %out
join.box:
  %joff = mul i32 %j, {TEAM_BOX_SIZE}
  %jbox = getelementptr inbounds i8, ptr %boxes, i32 %joff
  %jpostedp = getelementptr inbounds i8, ptr %jbox, i64 {TEAM_POSTED}
  %jtakenp = getelementptr inbounds i8, ptr %jbox, i64 {TEAM_TAKEN}
  %jfinishedp = getelementptr inbounds i8, ptr %jbox, i64 {TEAM_FINISHED}
  %q = load atomic i32, ptr %jpostedp monotonic, align 4
  %before = sub i32 %q, 1
  %x = cmpxchg ptr %jtakenp, i32 %before, i32 %q monotonic monotonic, align 4
  %back = extractvalue {{ i32, i1 }} %x, 1
  br i1 %back, label %joined, label %wait
wait:
  call void @svod_wait_eq(ptr %jfinishedp, i32 %q, ptr %sync)
  br label %joined
joined:
  %j.next = add i32 %j, 1
  br label %join
out:
  ret void
}}
""".splitlines() + wait_function("svod_wait_eq", "eq", hint, spin_before_yield)


def wait_function(name: str, ready: str, hint: str, spin_before_yield: int) -> list[str]:
    """`void name(ptr %word, i32 %want, ptr %sync)`: returns once `icmp <ready> word, want` holds (word by an acquire
    load); spins with the hint, after spin_before_yield of them calls `sync`'s yield at every look. "uge" for
    the work queue's `done` count (reset every call), "eq" for a box's call numbers (they wrap after 2^32 calls)."""
    return f"""define internal void @{name}(ptr %donep, i32 %want, ptr %sync) #0 {{
entry:
  br label %check
check:
  %spins = phi i32 [ 0, %entry ], [ %spins.next, %backoff ]
  %done = load atomic i32, ptr %donep acquire, align 4
  %ready = icmp {ready} i32 %done, %want
  br i1 %ready, label %out, label %spin
spin:
  %spins.next = add i32 %spins, 1
  %long = icmp ugt i32 %spins, {spin_before_yield}
  br i1 %long, label %yield, label %pause
pause:
  {hint}
  br label %backoff
yield:
  %fpp = getelementptr inbounds i8, ptr %sync, i64 {SYNC_YIELD}
  %fp = load ptr, ptr %fpp, align 8
  call void %fp()
  br label %backoff
backoff:
  br label %check
out:
  ret void
}}""".splitlines()
