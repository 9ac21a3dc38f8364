"""What an LLVM worker runs (svodc/codegen/worker.py): a job's IR text -> optimized ELF object (or assembly).

Kept apart from the rest of codegen so that a worker imports llvmlite and nothing else of svodc's: a worker
that imported svodc.codegen.compile (numpy, the policy, targets, the IR, every emitter) took 0.3 s of CPU to
start instead of 0.06 s, twice per compile, beside the passes on a 2-core machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from svodc.errors import CodegenError


@dataclass(frozen=True)
class LLVMJob:
    name: str
    ir: str
    triple: str
    cpu: str
    features: str
    opt_level: int
    codemodel: str
    want_asm: bool
    # GPU modules: set the module's data layout from the target machine (AMDGPU's private address
    # space depends on it), and "assembly" when the assembly is the product (PTX; no object file).
    set_datalayout: bool = False
    emit: str = "object"
    abiname: str = ""  # riscv64: "lp64d" (svodc/arches.py)
    # LLVM's vectorizer counts an inner loop of fewer constant iterations as tiny (masked tails or scalar;
    # svodc/policy.py); 16 is LLVM's own default. Set in the worker for every job (an LLVM option outlives the
    # job that set it), so each job's code depends on its own value only.
    vector_min_trip_count: int = 16  # LLVM's own (policy.LLVM_MIN_TRIP_COUNT; tests/test_policy.py checks)


def llvm_init():
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm


def compile_llvm(job: LLVMJob) -> tuple[bytes, str]:
    """Run in a worker: parse, optimize, emit an ELF object (and assembly text when asked)."""
    llvm = llvm_init()
    llvm.set_option("svodc", f"-vectorizer-min-trip-count={job.vector_min_trip_count}")
    tm = llvm.Target.from_triple(job.triple).create_target_machine(
        cpu=job.cpu, features=job.features, opt=job.opt_level, reloc="pic", codemodel=job.codemodel,
        abiname=job.abiname)
    try:
        mod = llvm.parse_assembly(job.ir)
        if job.set_datalayout:
            mod.data_layout = str(tm.target_data)
        mod.verify()
    except RuntimeError as e:
        raise CodegenError(f"LLVM rejected the IR of {job.name}: {e}") from None
    if job.opt_level > 0:
        pto = llvm.create_pipeline_tuning_options(speed_level=job.opt_level)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
    if job.emit == "assembly":
        return b"", tm.emit_assembly(mod)
    asm = ""
    if job.want_asm:
        asm = tm.emit_assembly(llvm.parse_assembly(str(mod)))  # emitting mutates a module: use a copy
    return tm.emit_object(mod), asm
