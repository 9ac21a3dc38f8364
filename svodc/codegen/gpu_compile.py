"""Program -> GPU code objects and launch lists, one per GPU target; and the CPU emulation of the same
kernels that tests run here (no GPU needed).

One LLVM module per GPU variant: a code object is one module (AMD metadata notes and PTX files do
not merge), so kernels are not split across workers; the variants of a bundle compile in parallel.
- NVIDIA: LLVM emits PTX (kept in the bundle: the driver can JIT it for newer GPUs); ptxas, when
  installed, assembles it into a cubin for the exact architecture (loads instantly).
- AMD: LLVM emits a relocatable object for gfxNNN with code object v5; ld.lld links it into the
  loadable shared object the HIP module loader takes; the result is checked (gpu_tools.py).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from svodc.codegen.compile import prepare_kernel, run_jobs
from svodc.codegen.elf import read_object
from svodc.codegen.gpu_emit import GpuEmitter, Launch, map_launch, scaling_dims
from svodc.codegen.gpu_gemm import gemm_launch
from svodc.codegen.gpu_tools import assemble_ptx, check_amd_code_object, link_amd_code_object
from svodc.codegen.link import CodeImage, link
from svodc.codegen.llvm_ir import FN_ATTRS
from svodc.codegen.llvm_job import LLVMJob
from svodc.codegen.worker import WorkerPool, borrow
from svodc.errors import CodegenError
from svodc.gpu_target import GpuTarget
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp, output_ranges
from svodc.options import CompileOptions
from svodc.program import Program
from svodc.target import Target

KERNELS_PER_EMULATION_MODULE = 8


@dataclass(frozen=True)
class GpuImage:
    target: GpuTarget
    code: bytes  # PTX text, NUL-terminated (cuda), or the linked code object (hip)
    cubin: bytes | None  # cuda, when ptxas was available
    launches: list[Launch]


@dataclass(frozen=True)
class Statement:
    launch: Launch
    stmt: UOp
    nparams: int


def _map_launch(ki: int, symbol: str, stmt: UOp, serial: bool, with_dims: bool) -> Launch | None:
    extents = [r.src[0] for r in output_ranges(stmt)]
    return map_launch(ki, symbol, math.prod(int(e.vmax) for e in extents), serial,
                      scaling_dims(extents) if with_dims else None)


def plan_statements(program: Program, check_ir: bool = False) -> list[Statement]:
    """Every statement of every kernel (after the target-level rewrites) with its launch, in execution
    order. Symbols are ours (`svod_k<kernel>_<statement>`): PTX allows no '.' in names. With bounded
    dims, every kernel takes `dims` after its buffers (Launch.dims)."""
    if program.loops:  # svodc.api compiles GPU bundles with CompileOptions.step_loops off
        raise CodegenError(f"{len(program.loops)} step loops: GPU variants take unrolled recurrent layers only; "
                           "compile with CompileOptions(step_loops=False) (svodc compile --no-step-loops)")
    out = []
    with_dims = bool(program.dims)
    for ki, kernel in enumerate(program.kernels):
        k = prepare_kernel(kernel, check_ir=check_ir)
        serial = getattr(k.ast.arg, "serial", False)
        for si, stmt in enumerate(k.ast.src):
            symbol = f"svod_k{ki}_{si}"
            launch = gemm_launch(ki, symbol, stmt.arg, with_dims) if stmt.op is Ops.GEMM else \
                _map_launch(ki, symbol, stmt, serial, with_dims)
            if launch is not None:
                out.append(Statement(launch, stmt, len(kernel.params)))
    return out


def gpu_module(statements: list[Statement], backend: str, triple: str, matrix: str | None = None) -> str:
    bodies, declares, globals_, metadata = [], set(), [], []
    md_ids = itertools.count(1)  # !0 is the module flag
    for s in statements:
        em = GpuEmitter(s.launch.symbol, s.stmt, s.launch, backend, md_ids, matrix)
        bodies.append(em.render(s.nparams))
        declares |= em.uses_intrinsics
        globals_ += em.globals
        metadata += em.metadata
    if backend == "amdgcn":
        attrs = f'nounwind "no-builtins" "amdgpu-flat-work-group-size"="1,{max_block(statements)}"'
    elif backend == "nvptx":
        attrs = f'nounwind "no-builtins" "nvvm.maxntid"="{max_block(statements)}"'
    else:
        attrs = FN_ATTRS
    lines = [f'target triple = "{triple}"', "", *sorted(declares), *globals_, "", *bodies, "",
             f"attributes #0 = {{ {attrs} }}"]
    lines += metadata
    if backend == "amdgcn":
        lines += ["!llvm.module.flags = !{!0}", '!0 = !{i32 1, !"amdhsa_code_object_version", i32 500}']
    return "\n".join(lines) + "\n"


def max_block(statements: list[Statement]) -> int:
    return max((s.launch.block for s in statements), default=1)


def compile_gpu_programs(program: Program, targets: list[GpuTarget], options: CompileOptions,
                         workers: WorkerPool | None = None) -> list[GpuImage]:
    statements = plan_statements(program, options.check_ir)
    launches = [s.launch for s in statements]
    jobs = []
    for t in targets:
        backend = "nvptx" if t.kind == "cuda" else "amdgcn"
        module = gpu_module(statements, backend, t.triple, t.spec.matrix)
        jobs.append(LLVMJob(f"kernels for {t.describe()}", module, t.triple, t.cpu,
                            t.llvm_features, options.opt_level, "small", False, set_datalayout=True,
                            emit="assembly" if t.kind == "cuda" else "object"))
    with borrow(workers, options.jobs or len(jobs)) as pool:
        results = run_jobs(jobs, pool)
    images = []
    for t, (obj, asm) in zip(targets, results, strict=True):
        what = f"GPU code for {t.describe()}"
        if t.kind == "cuda":
            images.append(GpuImage(t, asm.encode() + b"\0", assemble_ptx(asm, t.cpu, what), launches))
        else:
            so = link_amd_code_object(obj, what)
            check_amd_code_object(so, t.cpu, {s.launch.symbol: s.nparams + (s.launch.dims is not None)
                                              for s in statements})
            images.append(GpuImage(t, so, None, launches))
    return images


def compile_gpu_emulation(program: Program, host: Target, options: CompileOptions,
                          workers: WorkerPool | None = None,
                          matrix: str | None = None) -> tuple[CodeImage, list[Launch]]:
    """The GPU kernels as CPU functions `void SYMBOL(void **args)` (one call runs the whole grid), in
    one code image for `host`, with the launch list they implement. For tests: the grid mapping,
    tiling and epilogues of the GPU code, checked by running them here. matrix="mma": GEMMs with
    float16/bfloat16 weights as the CUDA variants run them (gpu_mma.py), else on the vector path."""
    statements = plan_statements(program, options.check_ir)
    chunks = [statements[i: i + KERNELS_PER_EMULATION_MODULE]
              for i in range(0, len(statements), KERNELS_PER_EMULATION_MODULE)]
    jobs = [LLVMJob(f"emulated GPU kernels {i}", gpu_module(c, "emulate", host.triple, matrix), host.triple,
                    host.llvm_cpu, host.llvm_features, options.opt_level, host.codemodel, False)
            for i, c in enumerate(chunks)]
    with borrow(workers, options.jobs or 2) as pool:
        results = run_jobs(jobs, pool)
    objects = [read_object(obj, j.name) for j, (obj, _) in zip(jobs, results, strict=True)]
    return link(objects, [s.launch.symbol for s in statements]), [s.launch for s in statements]
