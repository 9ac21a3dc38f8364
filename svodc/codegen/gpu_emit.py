"""Loop-level kernel statements -> GPU kernels (LLVM IR text), and the launch list that runs them.

Every statement of a kernel (a STORE, or a GEMM node) becomes one GPU kernel and one launch: kernel
boundaries are the only grid-wide barriers, so statements never race (the pieces of a split STORE
are independent anyway). Grid and block sizes are fixed at compile time and recorded in the launch
list; the code uses them as constants.

Mapping of a STORE ("map" kernel): its output ranges (outermost first) are flattened into one
linear index g in [0, N); thread t of block b starts at g = b*BLOCK + t and strides by the whole
grid, so any N works with a bounded grid. g is split back into the ranges (innermost fastest, so
neighbouring threads write neighbouring elements), and the statement runs with the ranges bound
to those values. Reductions (LOOP_REDUCE) run as loops inside the thread. GEMM nodes: gpu_gemm.py.

Three backends share this code, so what runs on a GPU is what the CPU emulation tests:
- nvptx: `ptx_kernel`, thread/block ids from the PTX special registers;
- amdgcn: `amdgpu_kernel`, global (addrspace 1) parameters, private variables in addrspace 5;
- emulate: an x86-64 function `void SYMBOL(void **args)` (args as cuLaunchKernel passes them: one
  pointer to each argument) that loops over blocks and, inside every barrier-free phase, over the
  threads of a block. The index arithmetic, tiling and epilogues are the same code; only where the
  ids come from and the barriers differ (in the emulation a phase finishes for all threads of a
  block before the next starts, which is what a barrier guarantees).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

from svodc.codegen.llvm_ir import KernelEmitter
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops, RangeArg, RangeKind
from svodc.ir.uop import UOp

BACKENDS = ("nvptx", "amdgcn", "emulate")
MAP_BLOCK = 256  # threads per block of a map kernel
MAX_GRID = 4096  # blocks of a map kernel at most (the grid-stride loop covers the rest)


@dataclass(frozen=True)
class Launch:
    kernel: int  # index of the Program kernel this statement belongs to (its params are the arguments)
    symbol: str
    grid: int  # blocks (1-D)
    block: int  # threads per block (1-D)


def _const_end(r: UOp) -> int:
    end = r.src[0]
    assert end.op is Ops.CONST, "GPU kernels need static loop bounds (format 1 has no symbolic dimensions)"
    return int(end.arg)


def store_ranges(em_free: frozenset[UOp]) -> list[UOp]:
    return sorted(em_free, key=lambda r: r.arg.id)


def map_launch(kernel: int, symbol: str, total: int, serial: bool = False) -> Launch | None:
    """The launch of a map kernel over `total` elements (None: nothing to compute). serial: one thread
    does every element in index order (kernels whose stores must happen in order: a scatter's
    read-modify-write at run-time positions that may repeat)."""
    if total == 0:
        return None
    if serial:
        return Launch(kernel, symbol, 1, 1)
    return Launch(kernel, symbol, min(-(-total // MAP_BLOCK), MAX_GRID), MAP_BLOCK)


def loop_range(uid: int, end: int) -> UOp:
    """A loop of the GPU code itself (blocks, threads, grid stride, k steps), not of the kernel's AST.
    Negative ids never meet the AST's ranges (ids from 0); each id is used for one role, and no two
    loops of the same role are ever open at once (open loops are keyed by their UOp)."""
    return UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, end),), RangeArg(uid, RangeKind.LOOP))


class GpuEmitter(KernelEmitter):
    """Emits one statement as one GPU kernel function for `backend`."""

    def __init__(self, symbol: str, stmt: UOp, launch: Launch, backend: str, md_ids: Iterator[int]):
        super().__init__(symbol, stmt, None)  # type: ignore[arg-type]  (the CPU target is not used)
        assert backend in BACKENDS
        self.backend = backend
        self.launch = launch
        self.globals: list[str] = []
        self.metadata: list[str] = []
        self._md_ids = md_ids  # metadata numbers, unique in the module
        if backend == "amdgcn":
            self.ALLOCA_SUFFIX = ", addrspace(5)"
            self.PRIVATE_PTR = "ptr addrspace(5)"
        self.bid_r = loop_range(-2, launch.grid)
        self.tid_r = loop_range(-3, launch.block)
        self.emulated = backend == "emulate"

    # ------------------------------------------------------------------ ids, phases, memory
    def _special(self, nv: str, amd: str) -> str:
        name = nv if self.backend == "nvptx" else amd
        self.uses_intrinsics.add(f"declare i32 @{name}()")
        v = self.emit_line(self.stack[0], f"call i32 @{name}()")
        return self.emit_line(self.stack[0], f"zext i32 {v} to i64")

    @contextlib.contextmanager
    def blocks(self) -> Iterator[None]:
        """The body of one block: a loop over blocks in the emulation, the block id on a GPU."""
        if self.emulated:
            self.open_loop(self.bid_r, "0", str(self.launch.grid))
        else:
            self.bind_range(self.bid_r, self._special("llvm.nvvm.read.ptx.sreg.ctaid.x", "llvm.amdgcn.workgroup.id.x"))
            self.bind_range(self.tid_r, self._special("llvm.nvvm.read.ptx.sreg.tid.x", "llvm.amdgcn.workitem.id.x"))
        yield
        if not self.emulated:
            self.close_loop()
        self.close_loop()

    @contextlib.contextmanager
    def threads(self) -> Iterator[None]:
        """A barrier-free phase run by every thread of the block (a loop over them in the emulation)."""
        if self.emulated:
            self.open_loop(self.tid_r, "0", str(self.launch.block))
        yield
        if self.emulated:
            self.close_loop()

    def barrier(self) -> None:
        lines = self.stack[-1].lines
        if self.backend == "nvptx":
            self.uses_intrinsics.add("declare void @llvm.nvvm.barrier0()")
            lines.append("  call void @llvm.nvvm.barrier0()")
        elif self.backend == "amdgcn":
            self.uses_intrinsics.add("declare void @llvm.amdgcn.s.barrier()")
            lines += ['  fence syncscope("workgroup") release', "  call void @llvm.amdgcn.s.barrier()",
                      '  fence syncscope("workgroup") acquire']

    def shared(self, name: str, n: int, t: str = "float") -> tuple[str, str]:
        """(pointer, pointer type) of an n-element array shared by the threads of a block."""
        if self.emulated:
            p = self.fresh(name)
            self.allocas.append(f"{p} = alloca [{n} x {t}], align 16")
            return p, "ptr"
        g = f"@{self.name}.{name}"
        self.globals.append(f"{g} = internal addrspace(3) global [{n} x {t}] poison, align 16")
        return g, "ptr addrspace(3)"

    def private_array(self, n: int, t: str = "float") -> str:
        """An n-element array private to each thread (one per thread of the block in the emulation)."""
        total = n * self.launch.block if self.emulated else n
        p = self.fresh("priv")
        self.allocas.append(f"{p} = alloca [{total} x {t}], align 16{self.ALLOCA_SUFFIX}")
        return p

    def private_slot(self, array: str, n: int, i: int, t: str = "float") -> str:
        """Pointer (of type PRIVATE_PTR) to element i of this thread's private array; valid inside
        the current threads() phase."""
        sc = self.stack[-1]
        if not self.emulated:
            return self.emit_line(sc, f"getelementptr inbounds [{n} x {t}], {self.PRIVATE_PTR} {array}, i64 0, i64 {i}",
                                  "ptr")
        base = self.emit_line(sc, f"mul nuw nsw i64 {self.value(self.tid_r)}, {n}")
        off = self.emit_line(sc, f"add nuw nsw i64 {base}, {i}")
        return self.emit_line(sc, f"getelementptr inbounds {t}, ptr {array}, i64 {off}", "ptr")

    def unroll(self, count: int) -> str:
        """Loop metadata asking LLVM to unroll a loop `count` times (1: not at all)."""
        loop, hint = next(self._md_ids), next(self._md_ids)
        what = '!"llvm.loop.unroll.disable"' if count == 1 else f'!"llvm.loop.unroll.count", i32 {count}'
        self.metadata += [f"!{loop} = distinct !{{!{loop}, !{hint}}}", f"!{hint} = !{{{what}}}"]
        return f"!llvm.loop !{loop}"

    # ------------------------------------------------------------------ statements
    def emit_map(self, store: UOp) -> None:
        ranges = store_ranges(self.free[store])
        total = math.prod(_const_end(r) for r in ranges)
        grid, block = self.launch.grid, self.launch.block
        with self.blocks(), self.threads():
            line = self.emit_line
            b = self.value(self.bid_r)
            t = self.value(self.tid_r)
            base = line(self.stack[-1], f"mul nuw nsw i64 {b}, {block}")
            g0 = line(self.stack[-1], f"add nuw nsw i64 {base}, {t}")
            self.open_loop(loop_range(-4, total), g0, str(total), str(grid * block))
            rest = self.stack[-1].ivar
            values: list[str] = []
            for r in reversed(ranges):
                end = _const_end(r)
                if end == 1:
                    values.append("0")
                    continue
                values.append(line(self.stack[-1], f"urem i64 {rest}, {end}"))
                rest = line(self.stack[-1], f"udiv i64 {rest}, {end}")
            for r, v in zip(ranges, reversed(values), strict=True):
                self.bind_range(r, v)
            self.emit_statement(store)
            for _ in ranges:
                self.close_loop()
            self.close_loop()

    def render(self, nparams: int) -> str:
        from svodc.codegen.gpu_gemm import emit_gpu_gemm

        if self.ast.op is Ops.GEMM:
            emit_gpu_gemm(self, self.ast)
        else:
            self.emit_map(self.ast)
        if self.backend == "emulate":
            head = f"define void @{self.name}(ptr %args) #0 {{"
            prologue = []
            for i in range(nparams):
                prologue += [f"  %a{i}.p = getelementptr inbounds ptr, ptr %args, i64 {i}",
                             f"  %a{i} = load ptr, ptr %a{i}.p", f"  %p{i} = load ptr, ptr %a{i}"]
        elif self.backend == "amdgcn":
            params = ", ".join(f"ptr addrspace(1) noalias %g{i}" for i in range(nparams))
            head = f"define amdgpu_kernel void @{self.name}({params}) #0 {{"
            prologue = [f"  %p{i} = addrspacecast ptr addrspace(1) %g{i} to ptr" for i in range(nparams)]
        else:
            params = ", ".join(f"ptr noalias %p{i}" for i in range(nparams))
            head = f"define ptx_kernel void @{self.name}({params}) #0 {{"
            prologue = []
        body = [head, "entry:", *prologue, *[f"  {a}" for a in self.allocas], *self.stack[0].lines, "  ret void", "}"]
        return "\n".join(body)
