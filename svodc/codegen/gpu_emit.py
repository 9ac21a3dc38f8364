"""Loop-level kernel statements -> GPU kernels (LLVM IR text), and the launch list that runs them.

Every statement of a kernel (a STORE, or a GEMM node) becomes one GPU kernel and one launch: kernel
boundaries are the only grid-wide barriers, so statements never race (the pieces of a split STORE
are independent anyway). Grid and block sizes are fixed at compile time and recorded in the launch
list; the code uses them as constants. With bounded dims every kernel also takes the device address
of `dims` (svodrt/abi.py) after its buffers: loop bounds come from it, and a launch that scales with
dims runs `launch_blocks` blocks, which the code computes the same way (its stride over the work).

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
MATRIX_UNITS = (None, "wmma", "mma", "mfma")  # gpu_wmma.py, gpu_mma.py, gpu_mfma.py
MAP_BLOCK = 256  # threads per block of a map kernel
MAX_GRID = 4096  # blocks of a map kernel at most (the grid-stride loop covers the rest)


@dataclass(frozen=True)
class Launch:
    kernel: int  # index of the Program kernel this statement belongs to (its params are the arguments)
    symbol: str
    grid: int  # blocks (1-D), at the dims' upper bounds
    block: int  # threads per block (1-D)
    # None: the bundle has no bounded dims. Else the kernel takes `dims` after its buffers, and these
    # (dims slot, upper bound) scale its grid at run time (svodrt_gpu.abi.launch_blocks).
    dims: tuple[tuple[int, int], ...] | None = None


def scaling_dims(extents: list[UOp]) -> tuple[tuple[int, int], ...]:
    """(slot, bound) of the bounded dims in loop extents, once per extent that has them (each extent is
    a dim's value times a constant: passes/dynamic.py)."""
    out = []
    for e in extents:
        out += sorted({(n.arg.slot, n.arg.hi) for n in e.toposort() if n.op is Ops.DEFINE_VAR})
    return tuple(out)


def store_ranges(em_free: frozenset[UOp]) -> list[UOp]:
    return sorted(em_free, key=lambda r: r.arg.id)


def map_launch(kernel: int, symbol: str, total: int, serial: bool = False,
               dims: tuple[tuple[int, int], ...] | None = None) -> Launch | None:
    """The launch of a map kernel over `total` elements at the bounds (None: nothing to compute). serial:
    one thread does every element in index order (kernels whose stores must happen in order: a scatter's
    read-modify-write at run-time positions that may repeat). dims: see Launch."""
    if total == 0:
        return None
    if serial:
        return Launch(kernel, symbol, 1, 1, None if dims is None else ())
    return Launch(kernel, symbol, min(-(-total // MAP_BLOCK), MAX_GRID), MAP_BLOCK, dims)


def loop_range(uid: int, end: int) -> UOp:
    """A loop of the GPU code itself (blocks, threads, grid stride, k steps), not of the kernel's AST.
    Negative ids never meet the AST's ranges (ids from 0); each id is used for one role, and no two
    loops of the same role are ever open at once (open loops are keyed by their UOp)."""
    return UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, end),), RangeArg(uid, RangeKind.LOOP))


class GpuEmitter(KernelEmitter):
    """Emits one statement as one GPU kernel function for `backend`."""

    def __init__(self, symbol: str, stmt: UOp, launch: Launch, backend: str, md_ids: Iterator[int],
                 matrix: str | None = None):
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
        # the matrix units GEMMs with float16/bfloat16 weights use (GpuArch.matrix; the emulation models "mma")
        assert matrix in MATRIX_UNITS and (not self.emulated or matrix in (None, "mma")), matrix
        self.matrix = matrix

    # ------------------------------------------------------------------ ids, phases, memory
    def extent(self, r: UOp) -> str:
        """A loop's trip count: a constant, or computed from `dims` once per kernel call."""
        end = r.src[0]
        return str(int(end.arg)) if end.op is Ops.CONST else self.value(end)

    def product(self, factors: list[str]) -> str:
        """The product of i64 values (constants folded), in the function's first scope."""
        const = math.prod(int(f) for f in factors if f.lstrip("-").isdigit())
        out = str(const)
        for f in factors:
            if not f.lstrip("-").isdigit():
                out = f if out == "1" else self.emit_line(self.stack[0], f"mul nuw nsw i64 {out}, {f}")
        return out

    def split_flat(self, scope, value: str, ends: list[str]) -> list[str]:
        """A flat index below the product of `ends` (outermost first) as coordinates, innermost first. The
        outermost is what remains after the inner ones: no division by it, which is a run-time size when a
        bounded dim leads (a division by a run-time value is a long instruction sequence on a GPU)."""
        out: list[str] = []
        for i, end in enumerate(reversed(ends)):
            if end == "1":
                out.append("0")
            elif i == len(ends) - 1:
                out.append(value)
            else:
                out.append(self.emit_line(scope, f"urem i64 {value}, {end}"))
                value = self.emit_line(scope, f"udiv i64 {value}, {end}")
        return out

    def grid_value(self) -> str:
        """Blocks of this launch at run time: svodrt_gpu.abi.launch_blocks over the launch's dims, as the runtime
        computes it (the grid at the bounds when none scale it)."""
        scale = self.launch.dims or ()
        if not scale:
            return str(self.launch.grid)
        top = self.stack[0]
        if ("grid",) not in top.cache:
            bounds = math.prod(hi for _, hi in scale)
            v = self.product([str(self.launch.grid), *(self.dim_value(slot) for slot, _ in scale)])
            v = self.emit_line(top, f"add nuw nsw i64 {v}, {bounds - 1}")
            top.cache[("grid",)] = self.emit_line(top, f"udiv i64 {v}, {bounds}")
        return top.cache[("grid",)]

    def _special(self, nv: str, amd: str) -> str:
        name = nv if self.backend == "nvptx" else amd
        self.uses_intrinsics.add(f"declare i32 @{name}()")
        v = self.emit_line(self.stack[0], f"call i32 @{name}()")
        return self.emit_line(self.stack[0], f"zext i32 {v} to i64")

    @contextlib.contextmanager
    def blocks(self) -> Iterator[None]:
        """The body of one block: a loop over blocks in the emulation, the block id on a GPU."""
        if self.emulated:
            self.open_loop(self.bid_r, "0", self.grid_value())
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
        ends = [self.extent(r) for r in ranges]
        total = self.product(ends)
        at_bound = math.prod(int(r.src[0].vmax) for r in ranges)
        block = self.launch.block
        stride = self.product([self.grid_value(), str(block)])
        with self.blocks(), self.threads():
            line = self.emit_line
            b = self.value(self.bid_r)
            t = self.value(self.tid_r)
            base = line(self.stack[-1], f"mul nuw nsw i64 {b}, {block}")
            g0 = line(self.stack[-1], f"add nuw nsw i64 {base}, {t}")
            self.open_loop(loop_range(-4, at_bound), g0, total, stride)
            values = self.split_flat(self.stack[-1], self.stack[-1].ivar, ends)
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
        names = [f"p{i}" for i in range(nparams)] + (["dims"] if self.launch.dims is not None else [])
        if self.backend == "emulate":
            head = f"define void @{self.name}(ptr %args) #0 {{"
            prologue = []
            for i, p in enumerate(names):
                prologue += [f"  %a{i}.p = getelementptr inbounds ptr, ptr %args, i64 {i}",
                             f"  %a{i} = load ptr, ptr %a{i}.p", f"  %{p} = load ptr, ptr %a{i}"]
        elif self.backend == "amdgcn":
            params = ", ".join(f"ptr addrspace(1) noalias %g{i}" for i in range(len(names)))
            head = f"define amdgpu_kernel void @{self.name}({params}) #0 {{"
            prologue = [f"  %{p} = addrspacecast ptr addrspace(1) %g{i} to ptr" for i, p in enumerate(names)]
        else:
            params = ", ".join(f"ptr noalias %{p}" for p in names)
            head = f"define ptx_kernel void @{self.name}({params}) #0 {{"
            prologue = []
        body = [head, "entry:", *prologue, *[f"  {a}" for a in self.allocas], *self.stack[0].lines, "  ret void", "}"]
        return "\n".join(body)
