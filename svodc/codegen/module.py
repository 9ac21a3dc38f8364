"""The entry module (runs every kernel in order, its parts shared by the calling threads) and the work
estimates that cut kernels into parts; the kernels' own modules are units.py's.

The entry ABI (signature, buffer table, sync block) is svodrt/abi.py's, for both sides.

Work queue (nthreads > 1). Kernel i is cut into n_i parts (n_i = min(its cap, its parts per thread *
nthreads); the cap comes from its estimated work, `parallel_parts`: a small kernel is one part; the parts per
thread are PARTS_PER_THREAD but where each part pays a fixed cost, `parts_per_thread`).
Parts are numbered by one counter across the whole entry: kernel i owns tickets [base_i, base_i +
n_i). A thread waits until `done` (abi.SYNC_DONE) reaches base_i -- every part of the kernels before i
is finished, an acquire that pairs with the release of each part's increment -- then claims tickets
of kernel i with a compare-and-swap on `next` (abi.SYNC_NEXT) that never goes past kernel i's last
ticket, runs part (ticket - base_i) of n_i, and counts it done. When kernel i has no ticket left the
thread moves on to kernel i+1. So a thread only ever holds a part it can run right away: a thread
the OS has descheduled holds nothing, and the others take all the work instead of waiting for it at
a barrier (the static split did; on a busy machine that cost a time slice per kernel). Waits spin
briefly, then call `yield`, so an oversubscribed machine is not burned. A thread returns when the
last kernel has no ticket left; the caller joins every thread before it reads the outputs.

A kernel too small to split (one part) is the calling thread's (thread 0) alone: it takes one ticket,
which thread 0 counts on `next` (an atomic add: no claim races it, a helper still in an earlier
kernel's claim loop sees `next` past that kernel's tickets) and on `done` once it has run; the
helpers skip it and wait at the next splittable kernel. So a helper never holds a tiny kernel (a
helper the OS deschedules mid-kernel would stall the call for a time slice), a chain of tiny kernels
runs on one core with its data in that core's caches and no claim traffic between cores, and when
the last kernels are tiny the helpers return early.

Guarded kernels (a run-time If's branches, passes/branches.py) run only when their guard holds, a
formula over one-byte flags that earlier kernels wrote. Invariant: every thread takes the same
decision, so all agree on every kernel's tickets (a one-part kernel takes its ticket whether it runs
or not: only thread 0 reads its guard). A thread reads a kernel's flags only after its
wait for that kernel (`done` >= base_i, an acquire): the kernels that wrote them are all finished
and visible, and nothing writes a flag again in the call (memory.plan_arena keeps flags to the end of
the call: a thread held back by the OS may read one after the others have run every later kernel), so
every thread reads the same bytes. A skipped kernel has n_i = 0 tickets, so base_(i+1) = base_i for
everyone.

Step loops (Program.loops, passes/steploop.py): kernels[first:end] run `trips` times. Every thread runs
every step: the tickets go on across steps (a loop's kernels take trips * their parts in all), so the
wait for "every earlier part done" orders step t + 1 after step t as it orders kernels. Each call of a
loop's kernel passes step * nparts + part as its part (one part: the step), which its wrapper splits
(llvm_ir.render_wrapper), so the kernel ABI is unchanged and a kernel called alone (svodrt's profile)
runs step 0.
"""

from __future__ import annotations

import math

from svodc.codegen.llvm_gemm_int8 import int8_plan
from svodc.codegen.team import team_functions, wait_function
from svodc.codegen.units import attributes, header
from svodc.gemm_plan import cpu_plan
from svodc.ir.ops import ALU, GemmArg, Ops, RangeKind
from svodc.policy import GemmBlocking
from svodc.program import BufferKind, Kernel, KernelGuard
from svodc.target import Target
from svodrt.abi import (
    ARENA_SLOT,
    ENTRY,
    SYNC_DONE,
    SYNC_NEXT,
    SYNC_TRACE,
    TRACE_HEADER,
    TRACE_RECORD,
    input_slot,
    output_slot,
)

SPIN_BEFORE_YIELD = 4000
# Enough parts that a thread slowed by the OS leaves its share to the others; more cost claims and moving data
# between cores: 4 -> 2 made squeezenet 0.97x and shufflenet 0.93x at two threads, others unchanged, and with
# another process busy on one of the two cores both settings ran alike (Zen 4, 2 vCPU, alternating blocks).
PARTS_PER_THREAD = 2
MAX_PARTS = 1 << 16
# Work estimates that decide the parts (only their order of magnitude matters): a part is worth
# PART_NS; an element of a loop nest costs NS_PER_ELEMENT, or NS_PER_LOAD per load, or NS_PER_OP per ALU op
# (index arithmetic included), whichever is more (a Winograd output transform: 9-12 loads per element, 1.4 ns each,
# estimated 0.5 ns and left in one part of 34 us; loop kernels of six CNNs and gpt2 took 0.06-0.15 ns per load,
# Zen 4. inception_v2's Winograd tile gathers, one load and ~30 ALU ops of index arithmetic per element, took
# 1.6 ns each, estimated 0.5 and left in one part of 53 us; its output transforms at 7x7, 9 loads and ~30 ALU
# ops, 1.5 ns: one part of 24 us. Intel Xeon, family 6 model 167), a GEMM multiply-add GEMM_NS_PER_MAC.
PART_NS = 10_000
NS_PER_ELEMENT = 0.5
NS_PER_LOAD = 0.12
NS_PER_OP = 0.05
GEMM_NS_PER_MAC = 0.02
# A GEMM whose every part first copies a share of its operands that does not shrink with the part (copy_all: the
# whole vector side; a packed block of the scalar side: gemm_plan.py) pays that copy once per part: about
# COPY_NS_PER_FLOAT per float, PACK_NS_PER_FLOAT where the block is packed from a transposed B's columns (a float
# per k from another line; both measured on Zen 4). Such a kernel takes one part per thread unless the copies of
# PARTS_PER_THREAD parts per thread cost at most COPY_SHARE of its time per thread.
COPY_NS_PER_FLOAT = 0.08
PACK_NS_PER_FLOAT = 0.27
COPY_SHARE = 0.05


def _spin_hint(target: Target) -> tuple[str, str]:
    """(declaration, call) of the target's spin-wait hint, or nothing where there is none we can emit.

    - x86_64: `pause`.
    - aarch64: `isb sy`, not `yield`: yield is a no-op on most cores, isb really waits a little
      (the choice Rust's spin_loop and several runtimes made).
    - riscv64: `pause` (Zihintpause) only when the variant has it, so a variant uses no instruction
      its feature list does not name.
    - ppc64le: none. POWER's hint is `or 27,27,27` (glibc's __ppc_yield), which only inline asm can
      express, and llvmlite has no assembler parser for inline asm; the barrier yields after
      SPIN_BEFORE_YIELD spins anyway.
    - s390x: none exists in problem state (Linux's cpu_relax is a compiler barrier there).
    """
    if target.arch == "x86_64":
        return "declare void @llvm.x86.sse2.pause()", "call void @llvm.x86.sse2.pause()"
    if target.arch == "aarch64":
        return "declare void @llvm.aarch64.isb(i32)", "call void @llvm.aarch64.isb(i32 15)"
    if target.arch == "riscv64" and "zihintpause" in target.features:
        return "declare void @llvm.riscv.pause()", "call void @llvm.riscv.pause()"
    return "", ""


def _trace_functions() -> list[str]:
    """svod_clock(trace): the cycle counter, or 0 without a trace; svod_record(trace, kernel, thread, part, parts, t0):
    appends a record (svodrt/abi.py SYNC_TRACE) where there is a trace. Without one each costs a test and a branch."""
    fields = [(4, "i32 %thread"), (8, "i32 %part"), (12, "i32 %parts"), (16, "i64 %t0"), (24, "i64 %t1")]
    return ["", "declare i64 @llvm.readcyclecounter()", "",
            "define internal i64 @svod_clock(ptr %trace) #0 {", "entry:", "  %on = icmp ne ptr %trace, null",
            "  br i1 %on, label %read, label %off", "read:", "  %t = call i64 @llvm.readcyclecounter()",
            "  ret i64 %t", "off:", "  ret i64 0", "}", "",
            "define internal void @svod_record(ptr %trace, i32 %kernel, i32 %thread, i32 %part, i32 %parts, i64 %t0) "
            "#0 {", "entry:", "  %on = icmp ne ptr %trace, null", "  br i1 %on, label %count, label %done", "count:",
            "  %t1 = call i64 @llvm.readcyclecounter()", "  %i = atomicrmw add ptr %trace, i64 1 monotonic",
            "  %capp = getelementptr inbounds i8, ptr %trace, i64 8", "  %cap = load i64, ptr %capp, align 8",
            "  %fits = icmp ult i64 %i, %cap", "  br i1 %fits, label %write, label %done", "write:",
            f"  %at = mul i64 %i, {TRACE_RECORD}", f"  %off = add i64 %at, {TRACE_HEADER}",
            "  %rec = getelementptr inbounds i8, ptr %trace, i64 %off", "  store i32 %kernel, ptr %rec, align 4",
            *(line for j, (at, value) in enumerate(fields) for line in (
                f"  %f{j} = getelementptr inbounds i8, ptr %rec, i64 {at}",
                f"  store {value}, ptr %f{j}, align {4 if value.startswith('i32') else 8}")),
            "  br label %done", "done:", "  ret void", "}"]


def parallel_parts(kernel: Kernel, target: Target, blocking: GemmBlocking) -> int:
    """How many parts kernel's work is worth cutting into: about PART_NS of estimated work each, never
    more than its shortest parallel loop has iterations (a part of nothing only costs a claim)."""
    if getattr(kernel.ast.arg, "serial", False):
        return 1
    work_ns, trips = 0.0, []
    for stmt in kernel.ast.src:
        if stmt.op is Ops.GEMM:
            arg: GemmArg = stmt.arg
            # the GEMM's parallel tile loop (llvm_gemm.py, llvm_gemm_int8.py)
            trips.append(int8_plan(arg, target, blocking)[2] if arg.quant else cpu_plan(arg, target, blocking).tiles)
            work_ns += _gemm_ns(arg)
            continue
        sizes, loads, alu = [], 0, 0
        for u in stmt.toposort():
            if u.op is Ops.RANGE:
                size = u.src[0].vmax  # a run-time trip count (a bounded dim) is estimated at its bound
                sizes.append(size)
                if u.arg.kind is RangeKind.PARALLEL:
                    trips.append(size)
            elif u.op is Ops.LOAD:
                loads += 1
            elif u.op in ALU:
                alu += 1
        work_ns += math.prod(sizes) * max(NS_PER_ELEMENT, loads * NS_PER_LOAD, alu * NS_PER_OP)
    if not trips:
        return 1
    return max(1, min(min(trips), int(work_ns // PART_NS), MAX_PARTS))


def _gemm_ns(arg: GemmArg) -> float:
    return math.prod(arg.batch) * arg.m * arg.n * arg.k * GEMM_NS_PER_MAC


def parts_per_thread(kernel: Kernel, target: Target, blocking: GemmBlocking) -> int:
    """PARTS_PER_THREAD (a thread the OS slows leaves its share to the others), or 1 for a kernel whose parts each
    copy a share of a GEMM's operands that does not shrink with the part (see COPY_NS_PER_FLOAT). mobilenetv2's
    projections at 14x14 and 7x7 (copy_all, 576 x 196; packed blocks of B transposed, 960 x 49) spent 0.07-0.09 ms
    of 0.16-0.23 in copies over 8 parts at two threads."""
    work_ns = copy_ns = 0.0
    for stmt in kernel.ast.src:
        if stmt.op is not Ops.GEMM:
            continue
        arg: GemmArg = stmt.arg
        work_ns += _gemm_ns(arg)
        if arg.quant or arg.runtime:
            continue
        plan = cpu_plan(arg, target, blocking)
        if plan.copy_all:
            copy_ns += arg.k * plan.lane_tiles * plan.lanes * COPY_NS_PER_FLOAT
        elif plan.block_row_tiles:
            per_float = PACK_NS_PER_FLOAT if arg.transposed else COPY_NS_PER_FLOAT
            copy_ns += min(plan.block_row_tiles, plan.row_tiles) * plan.rows * arg.k * per_float
    if copy_ns and (PARTS_PER_THREAD - 1) * copy_ns > COPY_SHARE * work_ns / 2:
        return 1
    return PARTS_PER_THREAD


# A kernel's guard as the entry reads it: conjunctions of (buffer-table slot, byte offset, value).
FlagGuard = tuple[tuple[tuple[int, int, bool], ...], ...]


def guard_flags(guard: KernelGuard, nin: int) -> FlagGuard:
    def where(b) -> tuple[int, int]:
        if b.kind is BufferKind.SCRATCH:
            return ARENA_SLOT, b.offset
        return (input_slot(b.slot) if b.kind is BufferKind.INPUT else output_slot(nin, b.slot)), 0

    return tuple(tuple((*where(b), value) for b, value in term) for term in guard)


def _guard_test(guard: FlagGuard, name: str) -> list[str]:
    """Instructions that set %{name} (i1) to whether the guard holds."""
    lines, terms = [], []
    for t, term in enumerate(guard):
        acc = "true"
        for j, (slot, offset, value) in enumerate(term):
            v = f"%{name}.{t}.{j}"
            lines += [f"  {v}.p = getelementptr inbounds ptr, ptr %bufs, i64 {slot}",
                      f"  {v}.b = load ptr, ptr {v}.p, align 8",
                      f"  {v}.a = getelementptr inbounds i8, ptr {v}.b, i64 {offset}",
                      f"  {v}.v = load i8, ptr {v}.a, align 1",
                      f"  {v} = icmp {'ne' if value else 'eq'} i8 {v}.v, 0",
                      f"  {v}.and = and i1 {acc}, {v}"]
            acc = f"{v}.and"
        terms.append(acc)
    acc = "false"
    for t, term in enumerate(terms):
        lines.append(f"  %{name}.or{t} = or i1 {acc}, {term}")
        acc = f"%{name}.or{t}"
    lines.append(f"  %{name} = or i1 {acc}, false")
    return lines


def entry_module(kernels: list[tuple[str, int, int]], target: Target, guards: list[FlagGuard] | None = None,
                 loops: list[tuple[int, int, int]] = ()) -> str:
    """kernels: (name, parallel_parts, parts_per_thread) in execution order; guards: each kernel's (() runs it
    always); loops: Program.loops, the step loops (see the module docstring)."""
    guards = guards or [()] * len(kernels)
    starts = {first: (j, end, trips) for j, (first, end, trips) in enumerate(loops)}
    ends = {end - 1: j for j, (_, end, _) in enumerate(loops)}
    step_of = {i: j for j, (first, end, _) in enumerate(loops) for i in range(first, end)}
    decl, hint = _spin_hint(target)
    traced = target.arch == "x86_64"  # the cycle counter every x86-64 reads in user mode (rdtsc)
    calls = iter(range(1 << 30))

    def call_lines(i: int, part: str, nparts: str) -> list[str]:
        """Kernel i's call for this part, recorded in the caller's part trace where there is one (abi.SYNC_TRACE)."""
        call = f"  call void @{kernels[i][0]}(ptr %bufs, ptr %dims, i32 {part}, i32 {nparts})"
        if not traced:
            return [call]
        u = next(calls)
        return [f"  %ta{u} = call i64 @svod_clock(ptr %trace)", call,
                f"  call void @svod_record(ptr %trace, i32 {i}, i32 %thread, i32 {part}, i32 {nparts}, i64 %ta{u})"]

    lines = [*header(target, "entry"), decl]
    lines += [f"declare void @{k}(ptr, ptr, i32, i32)" for k, _, _ in kernels]
    lines += ["", f"define void @{ENTRY}(ptr %bufs, ptr %dims, i32 %thread, i32 %nthreads, ptr %sync) #0 {{",
              "entry:"]
    if traced:
        lines += [f"  %tracep = getelementptr inbounds i8, ptr %sync, i64 {SYNC_TRACE}",
                  "  %trace = load ptr, ptr %tracep, align 8"]
    lines += ["  %multi = icmp sgt i32 %nthreads, 1", "  br i1 %multi, label %queue, label %solo", "solo:"]
    for i, guard in enumerate(guards):
        if i in starts:
            j = starts[i][0]
            lines += [f"  br label %sl{j}.pre", f"sl{j}.pre:", f"  br label %sl{j}.head", f"sl{j}.head:",
                      f"  %st{j} = phi i32 [0, %sl{j}.pre], [%st{j}.next, %sl{j}.latch]"]
        part = f"%st{step_of[i]}" if i in step_of else "0"
        call = call_lines(i, part, "1")
        if not guard:
            lines += call
        else:
            lines += [*_guard_test(guard, f"s{i}"), f"  br i1 %s{i}, label %s{i}.run, label %s{i}.next",
                      f"s{i}.run:", *call, f"  br label %s{i}.next", f"s{i}.next:"]
        if i in ends:
            j = ends[i]
            lines += [f"  br label %sl{j}.latch", f"sl{j}.latch:", f"  %st{j}.next = add i32 %st{j}, 1",
                      f"  %sa{j} = icmp ult i32 %st{j}.next, {loops[j][2]}",
                      f"  br i1 %sa{j}, label %sl{j}.head, label %sl{j}.exit", f"sl{j}.exit:"]
    lines += ["  ret void", "queue:",
              f"  %nextp = getelementptr inbounds i8, ptr %sync, i64 {SYNC_NEXT}",
              f"  %donep = getelementptr inbounds i8, ptr %sync, i64 {SYNC_DONE}",
              "  %caller = icmp eq i32 %thread, 0",
              "  br label %k0.start"]
    base = "0"
    for i, ((_, cap, per_thread), guard) in enumerate(zip(kernels, guards, strict=True)):
        # a step loop's last kernel goes on to the loop's latch, which runs the next step or leaves
        nxt = f"%r{ends[i]}.latch" if i in ends else f"%k{i + 1}.start"
        lines.append(f"k{i}.start:")
        if i in starts:  # every thread runs every step: the tickets go on from the step before's
            j = starts[i][0]
            lines += [f"  br label %r{j}.head", f"r{j}.head:",
                      f"  %t{j} = phi i32 [0, %k{i}.start], [%t{j}.next, %r{j}.latch]",
                      f"  %rb{j} = phi i32 [{base}, %k{i}.start], [%end{starts[i][1] - 1}, %r{j}.latch]"]
            base = f"%rb{j}"
        step = f"%t{step_of[i]}" if i in step_of else None
        if cap == 1:  # the calling thread's alone: see the module docstring
            lines += [f"  %end{i} = add i32 {base}, 1", f"  br i1 %caller, label %k{i}.solo, label {nxt}",
                      f"k{i}.solo:"]
            if i:
                lines.append(f"  call void @svod_wait(ptr %donep, i32 {base}, ptr %sync)")
            call = call_lines(i, step or "0", "1")
            if guard:  # read after the wait above, by the one thread that reads it
                lines += [*_guard_test(guard, f"q{i}"), f"  br i1 %q{i}, label %k{i}.run, label %k{i}.done",
                          f"k{i}.run:", *call, f"  br label %k{i}.done", f"k{i}.done:"]
            else:
                lines += call
            lines += [f"  %c{i} = atomicrmw add ptr %nextp, i32 1 monotonic",
                      f"  %d{i} = atomicrmw add ptr %donep, i32 1 release", f"  br label {nxt}"]
        else:
            if i:
                lines.append(f"  call void @svod_wait(ptr %donep, i32 {base}, ptr %sync)")
            n = f"%n{i}.all" if guard else f"%n{i}"
            lines += [f"  %limit{i} = mul i32 %nthreads, {per_thread}", f"  %few{i} = icmp ult i32 {cap}, %limit{i}",
                      f"  {n} = select i1 %few{i}, i32 {cap}, i32 %limit{i}"]
            if guard:  # read after the wait above: see the module docstring
                lines += [*_guard_test(guard, f"q{i}"), f"  %n{i} = select i1 %q{i}, i32 {n}, i32 0"]
            coded = [f"  %pc{i} = mul i32 {step}, %n{i}", f"  %pk{i} = add i32 %pc{i}, %part{i}"] if step else []
            lines += [f"  %end{i} = add i32 {base}, %n{i}", f"  br label %k{i}.claim",
                      f"k{i}.claim:",
                      f"  %c{i} = load atomic i32, ptr %nextp monotonic, align 4",
                      f"  %more{i} = icmp ult i32 %c{i}, %end{i}",
                      f"  br i1 %more{i}, label %k{i}.try, label {nxt}",
                      f"k{i}.try:",
                      f"  %c{i}.1 = add i32 %c{i}, 1",
                      f"  %x{i} = cmpxchg ptr %nextp, i32 %c{i}, i32 %c{i}.1 monotonic monotonic, align 4",
                      f"  %ok{i} = extractvalue {{ i32, i1 }} %x{i}, 1",
                      f"  br i1 %ok{i}, label %k{i}.run, label %k{i}.claim",
                      f"k{i}.run:",
                      f"  %part{i} = sub i32 %c{i}, {base}", *coded,
                      *call_lines(i, f"%pk{i}" if step else f"%part{i}", f"%n{i}"),
                      f"  %d{i} = atomicrmw add ptr %donep, i32 1 release",
                      f"  br label %k{i}.claim"]
        base = f"%end{i}"
        if i in ends:
            j = ends[i]
            lines += [f"r{j}.latch:", f"  %t{j}.next = add i32 %t{j}, 1",
                      f"  %ra{j} = icmp ult i32 %t{j}.next, {loops[j][2]}",
                      f"  br i1 %ra{j}, label %r{j}.head, label %k{i + 1}.start"]
    lines += [f"k{len(kernels)}.start:", "  ret void", "}", ""]
    lines += _trace_functions() if traced else []
    lines += wait_function("svod_wait", "uge", hint, SPIN_BEFORE_YIELD)
    lines += [*team_functions(hint, SPIN_BEFORE_YIELD), "", *attributes(target), ""]
    return "\n".join(lines)
