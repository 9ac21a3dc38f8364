"""LLVM IR -> object code in worker processes, then our linker -> one code image per target.

LLVM aborts the process on a fatal error, so it never runs in the compiler's own process: kernels
are compiled in a pool of workers, in chunks (which also uses every core). A worker that dies
becomes a CodegenError naming the kernels it was compiling.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable

from svodc.codegen.elf import read_object
from svodc.codegen.emulate import pm_emulate_for
from svodc.codegen.link import CodeImage, link
from svodc.codegen.llvm_job import LLVMJob
from svodc.codegen.module import entry_module, guard_flags, parallel_parts, parts_per_thread
from svodc.codegen.team import TEAM_SYMBOLS
from svodc.codegen.transcendental import pm_transcendental, pm_transcendental_native_round
from svodc.codegen.units import ModuleBuilder
from svodc.codegen.worker import JobStream, WorkerPool, borrow
from svodc.errors import CodegenError
from svodc.ir.rewrite import debug_level, graph_rewrite
from svodc.ir.spec import verify
from svodc.ir.symbolic import pm_symbolic
from svodc.options import CompileOptions
from svodc.policy import policy_for
from svodc.program import Kernel, Program
from svodc.target import Target
from svodrt.abi import ENTRY


def prepare_kernel(kernel: Kernel, target: Target | None = None, check_ir: bool = False) -> Kernel:
    """Target-level rewrites on a kernel's loop AST before emission (verified after them with check_ir)."""
    # emulate.py: float16/float8/int4... as integer bit operations; float16<->float32 casts stay native
    # where the CPU has conversion instructions (else LLVM would call compiler-rt, which the image lacks)
    emulate = pm_emulate_for(target is not None and target.native_f16)
    native_round = target is not None and target.native_roundeven
    ast = graph_rewrite(kernel.ast, emulate + (pm_transcendental_native_round if native_round else pm_transcendental))
    ast = graph_rewrite(ast, pm_symbolic)
    if check_ir:
        verify(ast)
    return dataclasses.replace(kernel, ast=ast)


# Distinct kernel bodies per LLVM module (kernels with identical code share one body, compiled once:
# codegen/units.py). The split depends only on the program, never on the number of workers (-j, cores) or on
# when the passes lowered each kernel: module boundaries change the code layout, and the same model with the
# same options must give the same bytes on every build machine.
KERNELS_PER_MODULE = 4
# The entry is calls, compares and atomics, one block run per kernel per call: LLVM's optimizer buys
# nothing there, and at O3 it took 1.4-1.8 s on resnet50's entry (138 kernels; svod_wait inlined at
# every kernel), at O0 0.1 s.
ENTRY_OPT_LEVEL = 0


def _crashed(job: LLVMJob, message: str) -> CodegenError:
    return CodegenError(f"LLVM crashed while compiling {job.name}: {message}; rerun with SVOD_DEBUG=3 to see "
                        "the IR, and please report it")


class KernelStream:
    """One CPU target's code, compiled as the kernels come: build_program calls add() with each kernel it has
    lowered, and every body module that completes (units.ModuleBuilder) goes to the LLVM workers at once, at
    most `limit` at a time (one while the passes hold the other core of a 2-core machine); finish() adds the
    kernels not seen, the wrappers' and entry modules, and links. Made at the end from all the kernels (no
    add() before finish()), the modules are the same, so the bytes never depend on streaming. A program whose
    kernels are not those it saw, in order, followed by others (a pass that rewrote a lowered kernel) is
    compiled again from its own kernels."""

    def __init__(self, target: Target, options: CompileOptions, workers: WorkerPool, limit: int | None = None):
        policy = policy_for(target, options.policies)
        self.target, self.options, self.workers = target, options, workers
        self.blocking, self.trip = policy.blocking(target), policy.vector_min_trip_count_of(target)
        self.builder = ModuleBuilder(target, self.blocking, KERNELS_PER_MODULE)
        self.seen: list[Kernel] = []  # the kernels added, as the passes made them
        self.jobs: list[LLVMJob] = []
        self.stream = JobStream(workers, _crashed, limit=limit)
        self.debug = debug_level()

    def add(self, kernel: Kernel) -> None:
        self.seen.append(kernel)
        for name, kernels, ir in self.builder.add(prepare_kernel(kernel, self.target, self.options.check_ir)):
            self._submit(f"{name}[{', '.join(k.name for k in kernels[:4])}{'...' if len(kernels) > 4 else ''}]", ir,
                         self.options.opt_level)

    def _submit(self, name: str, ir: str, opt_level: int) -> None:
        t = self.target
        job = LLVMJob(name, ir, t.triple, t.llvm_cpu, t.llvm_features, opt_level, t.codemodel, self.debug >= 4,
                      abiname=t.abiname, vector_min_trip_count=self.trip)
        self.jobs.append(job)
        self.stream.submit(job, len(ir))  # IR size: about its LLVM time

    def follows(self, program: Program) -> bool:
        n = len(self.seen)
        return n <= len(program.kernels) and all(a is b for a, b in zip(self.seen, program.kernels[:n], strict=True))

    def cancel(self) -> None:
        self.stream.cancel()

    def finish(self, program: Program, jobs_done: Callable[[int, int], None] | None = None) -> CodeImage:
        for k in program.kernels[len(self.seen):]:
            self.add(k)
        self.stream.set_limit(self.workers.size)
        nin = len(program.inputs)
        for name, _, ir in self.builder.finish(nin):
            self._submit(name, ir, self.options.opt_level)
        kernels = self.builder.kernels
        entry = entry_module([(k.name, parallel_parts(k, self.target, self.blocking),
                               parts_per_thread(k, self.target, self.blocking)) for k in kernels], self.target,
                             [guard_flags(k.guard, nin) for k in kernels], program.loops)
        self._submit("entry", entry, ENTRY_OPT_LEVEL)
        if self.debug >= 3:
            for j in self.jobs:
                print(f"===== LLVM IR {j.name} =====\n{j.ir}", file=sys.stderr)
        results = [_reply(job, r) for job, r in zip(self.jobs, self.stream.results(jobs_done), strict=True)]
        if self.debug >= 4:
            for j, (_, asm) in zip(self.jobs, results, strict=True):
                print(f"===== assembly {j.name} =====\n{asm}", file=sys.stderr)
        objects = [read_object(obj, j.name) for j, (obj, _) in zip(self.jobs, results, strict=True)]
        return link(objects, [ENTRY, *TEAM_SYMBOLS, *(k.name for k in kernels)])


def compile_program(program: Program, target: Target, options: CompileOptions,
                    jobs_done: Callable[[int, int], None] | None = None,
                    workers: WorkerPool | None = None, stream: KernelStream | None = None) -> CodeImage:
    """The program's code image for one CPU target, with the GEMM blocking of its policy (svodc/policy.py).
    jobs_done(done, total): after each LLVM module. LLVM runs on `workers` (the caller's pool; without
    one, a pool of options.jobs workers for this call). stream: this target's KernelStream that build_program
    fed, if any (its pool is `workers`)."""
    with borrow(workers, worker_count(options)) as pool:
        if stream is not None and not stream.follows(program):
            stream.cancel()
            stream = None
        return (stream or KernelStream(target, options, pool)).finish(program, jobs_done)


def worker_count(options: CompileOptions) -> int:
    return options.jobs or os.cpu_count() or 1


def run_jobs(jobs: list[LLVMJob], workers: WorkerPool,
             jobs_done: Callable[[int, int], None] | None = None) -> list[tuple[bytes, str]]:
    """Compile jobs on the worker pool; results in job order."""
    replies = workers.run(jobs, _crashed, jobs_done, cost=lambda job: len(job.ir))  # IR size: about its LLVM time
    return [_reply(job, r) for job, r in zip(jobs, replies, strict=True)]


def _reply(job: LLVMJob, reply: tuple) -> tuple[bytes, str]:
    if reply[0] == "error":
        raise CodegenError(f"{job.name}: {reply[1]}")
    return reply[1], reply[2]
