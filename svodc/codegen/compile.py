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
from svodc.codegen.module import entry_module, guard_flags, kernel_modules, parallel_parts, parts_per_thread
from svodc.codegen.team import TEAM_SYMBOLS
from svodc.codegen.transcendental import pm_transcendental, pm_transcendental_native_round
from svodc.codegen.worker import WorkerPool, borrow
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
# module.kernel_modules). The split depends only on the program, never on the number of workers
# (-j, cores): module boundaries change the code layout, and the same model with the same options
# must give the same bytes on every build machine.
KERNELS_PER_MODULE = 4
# The entry is calls, compares and atomics, one block run per kernel per call: LLVM's optimizer buys
# nothing there, and at O3 it took 1.4-1.8 s on resnet50's entry (138 kernels; svod_wait inlined at
# every kernel), at O0 0.1 s.
ENTRY_OPT_LEVEL = 0


def compile_program(program: Program, target: Target, options: CompileOptions,
                    jobs_done: Callable[[int, int], None] | None = None,
                    workers: WorkerPool | None = None) -> CodeImage:
    """The program's code image for one CPU target, with the GEMM blocking of its policy (svodc/policy.py).
    jobs_done(done, total): after each LLVM module. LLVM runs on `workers` (the caller's pool; without
    one, a pool of options.jobs workers for this call)."""
    policy = policy_for(target, options.policies)
    blocking, trip = policy.blocking(target), policy.vector_min_trip_count_of(target)
    kernels = [prepare_kernel(k, target, options.check_ir) for k in program.kernels]
    nin = len(program.inputs)
    dbg = debug_level()
    jobs = []
    for chunk, ir in kernel_modules(kernels, nin, target, blocking, KERNELS_PER_MODULE):
        jobs.append(LLVMJob(f"kernels[{', '.join(k.name for k in chunk[:4])}{'...' if len(chunk) > 4 else ''}]",
                            ir, target.triple, target.llvm_cpu, target.llvm_features, options.opt_level,
                            target.codemodel, dbg >= 4, abiname=target.abiname, vector_min_trip_count=trip))
    entry = entry_module([(k.name, parallel_parts(k, target, blocking), parts_per_thread(k, target, blocking))
                          for k in kernels], target,
                         [guard_flags(k.guard, nin) for k in kernels], program.loops)
    jobs.append(LLVMJob("entry", entry, target.triple, target.llvm_cpu,
                        target.llvm_features, ENTRY_OPT_LEVEL, target.codemodel, dbg >= 4,
                        abiname=target.abiname, vector_min_trip_count=trip))
    if dbg >= 3:
        for j in jobs:
            print(f"===== LLVM IR {j.name} =====\n{j.ir}", file=sys.stderr)
    with borrow(workers, worker_count(options)) as pool:
        results = run_jobs(jobs, pool, jobs_done)
    if dbg >= 4:
        for j, (_, asm) in zip(jobs, results, strict=True):
            print(f"===== assembly {j.name} =====\n{asm}", file=sys.stderr)
    objects = [read_object(obj, j.name) for j, (obj, _) in zip(jobs, results, strict=True)]
    return link(objects, [ENTRY, *TEAM_SYMBOLS, *(k.name for k in kernels)])


def worker_count(options: CompileOptions) -> int:
    return options.jobs or os.cpu_count() or 1


def run_jobs(jobs: list[LLVMJob], workers: WorkerPool,
             jobs_done: Callable[[int, int], None] | None = None) -> list[tuple[bytes, str]]:
    """Compile jobs on the worker pool; results in job order."""

    def crashed(job: LLVMJob, message: str) -> CodegenError:
        return CodegenError(f"LLVM crashed while compiling {job.name}: {message}; rerun with SVOD_DEBUG=3 to see "
                            "the IR, and please report it")

    replies = workers.run(jobs, crashed, jobs_done, cost=lambda job: len(job.ir))  # IR size: about its LLVM time
    out = []
    for job, reply in zip(jobs, replies, strict=True):
        if reply[0] == "error":
            raise CodegenError(f"{job.name}: {reply[1]}")
        out.append((reply[1], reply[2]))
    return out
