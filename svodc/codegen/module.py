"""Assemble LLVM modules: kernel modules (a chunk of kernels each, compiled in parallel) and the
entry module (runs every kernel in order with a barrier between them).

The entry ABI (fixed for bundle format 1, see docs/bundle-format.md):

    void svod_entry(void **bufs, const int64_t *dims, int32_t thread, int32_t nthreads, svod_sync *sync)

- bufs: [0] arena, [1] weights section, [2 .. 2+n_inputs) inputs, then outputs;
- dims: values of symbolic dimensions (reserved; none yet);
- thread in [0, nthreads): every thread calls the entry at once; each kernel's parallel loop is
  split statically by thread;
- sync: { uint32 count; uint32 generation; void (*yield)(void); } zero-initialized by the caller,
  shared by the nthreads threads of one call. Between two kernels every thread waits at a barrier:
  it spins briefly, then calls `yield` (the host's sched_yield), so an oversubscribed machine is
  not burned.
"""

from __future__ import annotations

from svodc.codegen.llvm_ir import FN_ATTRS, render_kernel
from svodc.program import Kernel
from svodc.target import Target

ENTRY = "svod_entry"
SPIN_BEFORE_YIELD = 4000


def _header(target: Target, name: str) -> list[str]:
    return [f"; ModuleID = '{name}'", f'target triple = "{target.triple}"', ""]


def _attrs(target: Target) -> list[str]:
    tune = f' "tune-cpu"="{target.tune_cpu}"' if target.tune_cpu != "generic" else ""
    return [f"attributes #0 = {{ {FN_ATTRS}{tune} }}"]


def kernel_module(kernels: list[Kernel], nin: int, target: Target, name: str) -> str:
    bodies = []
    declares: set[str] = set()
    shared: dict[str, str] = {}
    for k in kernels:
        text, intrinsics, helpers = render_kernel(k, nin, target)
        bodies.append(text)
        declares |= intrinsics
        shared.update(helpers)
    helpers_text = [shared[n] for n in sorted(shared)]
    return "\n".join([*_header(target, name), *sorted(declares), "", *helpers_text, *bodies, "", *_attrs(target), ""])


def _spin_hint(target: Target) -> tuple[str, str]:
    """(declaration, call) of the target's spin-wait hint instruction."""
    if target.arch == "x86_64":
        return "declare void @llvm.x86.sse2.pause()", "call void @llvm.x86.sse2.pause()"
    return "", ""


def entry_module(kernel_names: list[str], target: Target) -> str:
    decl, hint = _spin_hint(target)
    lines = [*_header(target, "entry"), decl]
    lines += [f"declare void @{k}(ptr, ptr, i32, i32)" for k in kernel_names]
    lines += ["", f"define void @{ENTRY}(ptr %bufs, ptr %dims, i32 %thread, i32 %nthreads, ptr %sync) #0 {{",
              "entry:"]
    for i, k in enumerate(kernel_names):
        lines.append(f"  call void @{k}(ptr %bufs, ptr %dims, i32 %thread, i32 %nthreads)")
        if i + 1 < len(kernel_names):
            lines.append("  call void @svod_barrier(ptr %sync, i32 %nthreads)")
    lines += ["  ret void", "}", ""]
    lines += f"""define internal void @svod_barrier(ptr %sync, i32 %n) #0 {{
entry:
  %single = icmp sle i32 %n, 1
  br i1 %single, label %done, label %arrive
arrive:
  %genp = getelementptr inbounds i8, ptr %sync, i64 4
  %g = load atomic i32, ptr %genp acquire, align 4
  %c = atomicrmw add ptr %sync, i32 1 acq_rel
  %last = sub i32 %n, 1
  %is_last = icmp eq i32 %c, %last
  br i1 %is_last, label %release, label %wait
release:
  store atomic i32 0, ptr %sync monotonic, align 4
  %old = atomicrmw add ptr %genp, i32 1 release
  br label %done
wait:
  %spins = phi i32 [ 0, %arrive ], [ %spins.next, %backoff ]
  %cur = load atomic i32, ptr %genp acquire, align 4
  %same = icmp eq i32 %cur, %g
  br i1 %same, label %spin, label %done
spin:
  %spins.next = add i32 %spins, 1
  %long = icmp ugt i32 %spins, {SPIN_BEFORE_YIELD}
  br i1 %long, label %yield, label %pause
pause:
  {hint}
  br label %backoff
yield:
  %fpp = getelementptr inbounds i8, ptr %sync, i64 8
  %fp = load ptr, ptr %fpp, align 8
  call void %fp()
  br label %backoff
backoff:
  br label %wait
done:
  ret void
}}""".splitlines()
    lines += ["", *_attrs(target), ""]
    return "\n".join(lines)
