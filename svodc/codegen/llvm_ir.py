"""Loop-level kernel AST -> LLVM IR text.

Structure of the emitted code: each loop is a scope holding a list of lines; a closed loop is
rendered into its parent's lines. Every value is emitted into the outermost scope where all the
loop indices it depends on are defined (its "free" ranges), so loop-invariant work -- including a
whole LOOP_REDUCE -- sits outside the loops it does not depend on, and a reduction shared by many
output elements is computed once per the loops it needs. Values are cached per scope (common
subexpressions are emitted once).

Loop counters and accumulators live in allocas in the entry block; LLVM's mem2reg turns them into
SSA phis, which keeps this emitter free of phi bookkeeping.

The kernel function: `void @NAME(ptr %bufs, ptr %dims, i32 %part, i32 %nparts)`. It computes
its parameter pointers from the call's buffer table (svodrt/abi.py) and calls the
body `@NAME.body(ptr noalias %p0, ..., i32 %part, i32 %nparts)`: distinct live buffers never
overlap (the memory plan guarantees it), so `noalias` is true and lets LLVM vectorize.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from svodc.codegen.llvm_types import const, ltype, mem_type
from svodc.codegen.share import Template, body_arg_index
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops, ParamArg, RangeArg, RangeKind
from svodc.ir.uop import UOp, toposort
from svodc.policy import GemmBlocking
from svodc.program import Buffer, BufferKind, Kernel
from svodc.target import Target
from svodrt.abi import ARENA_SLOT, WEIGHTS_SLOT, input_slot, output_slot

# The counters of a full GEMM tile's epilogue loops (emit_over_tile): ranges of their own (the GEMM's tile loop is
# -1, its k blocks -2, the integer GEMM's panels -3), distinct for rows and lanes.
_TILE_COUNTERS = (RangeArg(-4, RangeKind.LOOP), RangeArg(-5, RangeKind.LOOP))

FN_ATTRS = 'nounwind "no-builtins" "frame-pointer"="none"'


@dataclass(eq=False)
class Scope:
    range: UOp | None
    lines: list[str] = field(default_factory=list)
    cache: dict[UOp, str] = field(default_factory=dict)
    ivar: str = ""  # the loop index value inside the loop
    ivar_ptr: str = ""
    start: str = "0"
    end: str = "0"
    step: str = "1"
    loop_md: str = ""  # metadata of the loop's back edge ("!llvm.loop !N"), if any
    pseudo: bool = False  # a range bound to a value computed outside (no loop of its own)


class KernelEmitter:
    # How private variables (loop counters, accumulators) are allocated and addressed: GPU emitters
    # put them in the target's private address space (AMDGPU: 5).
    ALLOCA_SUFFIX = ""
    PRIVATE_PTR = "ptr"

    def __init__(self, name: str, ast: UOp, target: Target, gemm_blocking: GemmBlocking | None = None):
        self.name = name
        self.ast = ast
        self.target = target
        self.gemm_blocking = gemm_blocking  # CPU GEMM nodes' register blocking (svodc/policy.py); GPUs: None
        self.shared_functions: dict[str, str] = {}  # name -> definition: helpers kernels may share (GEMM)
        self._n = 0
        self.allocas: list[str] = []
        self.stack: list[Scope] = [Scope(None)]
        self.range_pos: dict[UOp, int] = {}
        self.free: dict[UOp, frozenset[UOp]] = {}
        self.params: dict[int, str] = {}
        self.param_values: dict[int, str] = {}  # a parameter's pointer replaced in the scope emitting now
        self.uses_intrinsics: set[str] = set()
        # Bounded dims read at run time (passes/dynamic.py): the body then takes the entry's `dims` array.
        self.uses_dims = reads_dims(ast)
        for n in toposort([ast]):
            if n.op is Ops.RANGE:
                self.free[n] = frozenset({n})
            elif n.op is Ops.LOOP_REDUCE:
                self.free[n] = self.free[n.src[0]] - frozenset(n.src[1:])
            else:
                self.free[n] = frozenset().union(*(self.free[s] for s in n.src)) if n.src else frozenset()

    def fresh(self, hint: str = "v") -> str:
        self._n += 1
        return f"%{hint}{self._n}"

    # ------------------------------------------------------------------ scopes and loops
    def open_loop(self, r: UOp, start: str, end: str, step: str = "1", loop_md: str = "") -> None:
        ptr = self.fresh("i.addr")
        self.allocas.append(f"{ptr} = alloca i64{self.ALLOCA_SUFFIX}")
        scope = Scope(r, ivar=self.fresh("i"), ivar_ptr=ptr, start=start, end=end, step=step, loop_md=loop_md)
        self.range_pos[r] = len(self.stack)
        self.stack.append(scope)

    def fresh_label(self) -> int:
        self._n += 1
        return self._n

    def bind_range(self, r: UOp, value: str) -> None:
        """Make `r` evaluate to `value` (an SSA value of the current scope) until close_loop()."""
        self.range_pos[r] = len(self.stack)
        self.stack.append(Scope(r, ivar=value, pseudo=True))

    def emit_over_tile(self, store: UOp, bound: list[tuple[UOp, str]], m: tuple[UOp, str, str],
                       n: tuple[UOp, str, str], counts: tuple[int, int] | None = None) -> None:
        """A GEMM epilogue STORE over one tile of C: its batch ranges bound to values, loops over
        m = [m0, m1) and, innermost (contiguous in C), n = [n0, n1); each a (range, start, end).

        counts: a full tile's (rows, lanes). The loops then count from 0 to those constants and each range
        is its start plus the count, so LLVM sees the constant trip counts and emits straight vector code.
        Over [n0, n0 + lanes) it did not: after InstCombine the two ends were different expressions of the
        tile index, and each of a tile's rows got a vector loop, a vectorized remainder and a scalar one
        (ResNet-50's k-blocked GEMMs: 48 loops per kernel, half of its LLVM time in them)."""
        for r, v in bound:
            self.bind_range(r, v)
        if counts is None:
            self.open_loop(*m)
            self.open_loop(*n)
        else:
            for (r, start, _), count, tag in zip((m, n), counts, _TILE_COUNTERS, strict=True):
                self.open_loop(UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, count),), tag), "0", str(count))
                self.bind_range(r, self.emit_line(self.stack[-1], f"add nuw nsw i64 {start}, {self.stack[-1].ivar}"))
        self.emit_statement(store)
        for _ in range(len(bound) + (2 if counts is None else 4)):
            self.close_loop()

    def close_loop(self) -> None:
        s = self.stack.pop()
        del self.range_pos[s.range]
        if s.pseudo:
            self.stack[-1].lines += s.lines
            return
        k = self._n = self._n + 1
        head, body, done, nxt, cond = f"L{k}.head", f"L{k}.body", f"L{k}.done", f"%i.next{k}", f"%c{k}"
        parent = self.stack[-1].lines
        pp = self.PRIVATE_PTR
        parent += [f"  store i64 {s.start}, {pp} {s.ivar_ptr}", f"  br label %{head}", f"{head}:",
                   f"  {s.ivar} = load i64, {pp} {s.ivar_ptr}", f"  {cond} = icmp slt i64 {s.ivar}, {s.end}",
                   f"  br i1 {cond}, label %{body}, label %{done}", f"{body}:"]
        parent += s.lines
        parent += [f"  {nxt} = add nsw i64 {s.ivar}, {s.step}", f"  store i64 {nxt}, {pp} {s.ivar_ptr}",
                   f"  br label %{head}{', ' + s.loop_md if s.loop_md else ''}", f"{done}:"]

    def target_scope(self, n: UOp) -> Scope:
        free = self.free[n]  # (asked for every node at every use: map, not a generator, for the max)
        return self.stack[max(map(self.range_pos.__getitem__, free)) if free else 0]

    def emit_line(self, scope: Scope, rhs: str, hint: str = "v") -> str:
        v = self.fresh(hint)
        scope.lines.append(f"  {v} = {rhs}")
        return v

    def split_index(self, scope: Scope, value: str, sizes: tuple[int | str, ...]) -> list[str]:
        """A flat i64 index as coordinates over `sizes`, innermost first (value % s, then value / s)."""
        out = []
        for s in sizes:
            out.append(self.emit_line(scope, f"urem i64 {value}, {s}"))
            value = self.emit_line(scope, f"udiv i64 {value}, {s}")
        return out

    def affine(self, scope: Scope, base: str, terms: list[tuple[str, int]]) -> str:
        """base + sum(value * coef) as an i64 value; terms with coef 0 emit nothing."""
        acc = base
        for v, s in terms:
            if s == 0:
                continue
            t = self.emit_line(scope, f"mul nsw i64 {v}, {s}")
            acc = self.emit_line(scope, f"add nsw i64 {acc}, {t}")
        return acc

    # ------------------------------------------------------------------ values
    def _direct(self, n: UOp) -> str | None:
        """The value of a node that needs no code (constant, parameter, loop index) or is already
        emitted in its scope; None when it must be emitted."""
        if n.op is Ops.CONST:
            return const(n.dtype, n.arg)
        if n.op is Ops.PARAM:
            assert isinstance(n.arg, ParamArg)
            return self.param_values.get(n.arg.index, f"%p{n.arg.index}")
        if n.op is Ops.RANGE:
            return self.stack[self.range_pos[n]].ivar
        if n.op is Ops.DEFINE_VAR:
            j = body_arg_index(n)
            return self.dim_value(n.arg.slot) if j is None else f"%k{j}"
        return self.target_scope(n).cache.get(n)

    def value(self, n: UOp) -> str:
        """Emit n (and every source it needs) and return its SSA value. Sources are emitted before
        their users, left to right, from an explicit stack: a chain of 20,000 ops needs no Python
        recursion. A LOOP_REDUCE's body is emitted inside its loops by emit_reduce (nesting as deep
        as the reductions, not the graph)."""
        hit = self._direct(n)
        if hit is not None:
            return hit
        from svodc.codegen.llvm_alu import emit_alu

        # Per edge, one _direct look-up: a node popped ready has no cached value but in its own scope (a
        # constant, parameter or index was answered when it was first popped), and its sources were
        # emitted before it (the `or` only guards that).
        stack: list[tuple[UOp, bool]] = [(n, False)]
        while stack:
            node, ready = stack.pop()
            if ready:
                scope = self.target_scope(node)
                if node not in scope.cache:
                    srcs = [self._direct(s) or self.value(s) for s in node.src]
                    scope.cache[node] = emit_alu(self, scope, node, srcs)
                continue
            if self._direct(node) is not None:
                continue
            if node.op is Ops.LOOP_REDUCE:
                scope = self.target_scope(node)
                scope.cache[node] = self.emit_reduce(node, scope)
                continue
            stack.append((node, True))
            stack.extend((s, False) for s in reversed(node.src))
        value = self._direct(n)
        assert value is not None
        return value

    def dim_value(self, slot: int) -> str:
        """dims[slot] (an i64 the runtime checked against the dim's range), loaded once per kernel call."""
        top = self.stack[0]
        key = ("dim", slot)
        if key not in top.cache:
            ptr = self.emit_line(top, f"getelementptr inbounds i64, ptr %dims, i64 {slot}", "dimp")
            top.cache[key] = self.emit_line(top, f"load i64, ptr {ptr}", "dim")
        return top.cache[key]

    def emit_reduce(self, n: UOp, scope: Scope) -> str:
        from svodc.codegen.llvm_alu import combine, reduce_init

        acc = self.fresh("acc")
        t = ltype(n.dtype)
        pp = self.PRIVATE_PTR
        self.allocas.append(f"{acc} = alloca {t}{self.ALLOCA_SUFFIX}")
        scope.lines.append(f"  store {t} {reduce_init(n)}, {pp} {acc}")
        depth = self.stack.index(scope)
        saved_stack, saved_pos = self.stack, self.range_pos
        self.stack = self.stack[: depth + 1]
        self.range_pos = {r: p for r, p in saved_pos.items() if p <= depth}
        for r in n.src[1:]:
            self.open_loop(r, "0", self.value(r.src[0]))
        inner = self.value(n.src[0])
        body = self.stack[-1]
        cur = self.emit_line(body, f"load {t}, {pp} {acc}")
        new = combine(self, body, n, cur, inner)
        body.lines.append(f"  store {t} {new}, {pp} {acc}")
        for _ in n.src[1:]:
            self.close_loop()
        self.stack, self.range_pos = saved_stack, saved_pos
        return self.emit_line(scope, f"load {t}, {pp} {acc}")

    def shared_parallel(self, stores: list[UOp]) -> list[UOp]:
        """The PARALLEL ranges that every one of several STOREs depends on (a two-pass softmax's rows,
        passes/rows.py): the body opens them around all the statements, so statement 2 of an iteration runs
        after statement 1 of the same iteration. Empty for a single statement or a GEMM kernel."""
        if len(stores) < 2 or len(stores) != len(self.ast.src):
            return []
        common = frozenset.intersection(*(self.free[s] for s in stores))
        return sorted((r for r in common if r.arg.kind is RangeKind.PARALLEL), key=lambda r: r.arg.id)

    def emit_store(self, store: UOp) -> None:
        """A STORE with its loops: opens every range it depends on (in id order) around it, but those
        already open (shared_parallel)."""
        ranges = sorted((r for r in self.free[store] if r not in self.range_pos), key=lambda r: r.arg.id)
        for r in ranges:
            assert isinstance(r.arg, RangeArg)
            end = self.value(r.src[0])
            if r.arg.kind is RangeKind.PARALLEL:
                start, stop = self.part_split(end)
                self.open_loop(r, start, stop)
            else:
                self.open_loop(r, "0", end)
        self.emit_statement(store)
        for _ in ranges:
            self.close_loop()

    def emit_statement(self, store: UOp) -> None:
        """A STORE inside loops that are already open (or ranges already bound)."""
        buf, idx, val = store.src
        v = self.value(val)
        i = self.value(idx)
        scope = self.stack[-1]
        if buf.op is Ops.DEFINE_VAR:  # a computed dim written into the `dims` array (passes/dynamic.dims_kernel)
            ptr = self.emit_line(scope, f"getelementptr inbounds i64, ptr %dims, i64 {buf.arg.slot}", "dimp")
            scope.lines.append(f"  store i64 {v}, ptr {ptr}")
            return
        ptr = self.emit_line(scope, f"getelementptr inbounds {mem_type(val.dtype)}, ptr {self.value(buf)}, i64 {i}",
                             "ptr")
        if val.dtype is dtypes.bool:
            v = self.emit_line(scope, f"zext i1 {v} to i8")
        scope.lines.append(f"  store {mem_type(val.dtype)} {v}, ptr {ptr}")

    def part_split(self, total: str) -> tuple[str, str]:
        """Part %part of %nparts of a parallel loop of `total` iterations: [start, stop) (module.py: the
        entry hands out the parts to its threads)."""
        top = self.stack[0]
        t = self.emit_line(top, "sext i32 %part to i64")
        nt = self.emit_line(top, "sext i32 %nparts to i64")
        t1 = self.emit_line(top, f"add nsw i64 {t}, 1")
        a = self.emit_line(top, f"mul nsw i64 {total}, {t}")
        b = self.emit_line(top, f"mul nsw i64 {total}, {t1}")
        return self.emit_line(top, f"sdiv i64 {a}, {nt}"), self.emit_line(top, f"sdiv i64 {b}, {nt}")

    # ------------------------------------------------------------------ the function
    def render_body(self, nparams: int) -> str:
        from svodc.codegen.llvm_gemm import emit_gemm
        from svodc.codegen.llvm_gemm_int8 import emit_int8_gemm

        stores = [s for s in self.ast.src if s.op is not Ops.GEMM]
        shared = self.shared_parallel(stores)
        for r in shared:  # opened once: the statements run one after another in each of its iterations
            self.open_loop(r, *self.part_split(self.value(r.src[0])))
        for stmt in self.ast.src:
            if stmt.op is Ops.GEMM:
                (emit_int8_gemm if stmt.arg.quant else emit_gemm)(self, stmt, self.target, self.gemm_blocking)
            else:
                self.emit_store(stmt)
        for _ in shared:
            self.close_loop()
        params = [f"ptr noalias %p{i}" for i in range(nparams)] + (["ptr %dims"] if self.uses_dims else [])
        args = sorted((j, n.dtype) for n in toposort([self.ast]) if (j := body_arg_index(n)) is not None)
        params += [f"{ltype(dt)} %k{j}" for j, dt in args]
        lines = [f"define internal void @{self.name}.body({', '.join(params)}, i32 %part, i32 %nparts) #0 {{",
                 "entry:", *[f"  {a}" for a in self.allocas], *self.stack[0].lines, "  ret void", "}"]
        return "\n".join(lines)


def param_pointer(buf: Buffer, nin: int) -> tuple[int, int]:
    """(slot in the entry ABI's buffer table, svodrt/abi.py; byte offset) where a kernel parameter lives (a
    view: in its storage, at its offset; at step 0 of a step loop)."""
    if buf.view_of is not None:
        slot, offset = param_pointer(buf.view_of, nin)
        return slot, offset + buf.view_offset * buf.dtype.itemsize
    if buf.kind is BufferKind.SCRATCH:
        return ARENA_SLOT, buf.offset
    if buf.kind is BufferKind.WEIGHT:
        return WEIGHTS_SLOT, buf.offset
    if buf.kind is BufferKind.INPUT:
        return input_slot(buf.slot), 0
    return output_slot(nin, buf.slot), 0


def render_body(kernel: Kernel, target: Target, blocking: GemmBlocking,
                tmpl: Template | None = None) -> tuple[str, set[str], dict[str, str]]:
    """The kernel's body function `@<name>.body(params..., part, nparts)`, the intrinsics it declares
    and the shared helper functions it calls (name -> definition; one copy per module). With `tmpl`
    (share.template(kernel)) the body is the template's: its constants are the wrapper's to pass."""
    em = KernelEmitter(kernel.name, tmpl.ast if tmpl else kernel.ast, target, blocking)
    return em.render_body(len(kernel.params)), em.uses_intrinsics, em.shared_functions


def reads_dims(ast: UOp) -> bool:
    """Does the kernel read bounded dims (passes/dynamic.py)? Its body then takes the entry's `dims`."""
    return any((n.op is Ops.DEFINE_VAR and n.arg.slot >= 0) or (n.op is Ops.GEMM and n.arg.runtime)
               for n in toposort([ast]))


def body_name(kernel: Kernel) -> str:
    return f"{kernel.name}.body"


def render_wrapper(kernel: Kernel, nin: int, body: str, tmpl: Template | None = None) -> str:
    """`@<name>(bufs, dims, part, nparts)`: the kernel's buffer-table entry point, which finds its
    parameters in the table and calls `@<body>` (its own body, or an identical kernel's; with `tmpl`,
    the template's body, passed the kernel's pointer shifts and lifted constants)."""
    lines = [f"define void @{kernel.name}(ptr %bufs, ptr %dims, i32 %{'coded' if kernel.stepped else 'part'}, "
             "i32 %nparts) #0 {", "entry:"]
    if kernel.stepped:  # the entry passes step * nparts + part (codegen/module.py, step loops)
        lines += ["  %step = udiv i32 %coded, %nparts", "  %part = urem i32 %coded, %nparts",
                  "  %step64 = zext i32 %step to i64"]
    if getattr(kernel.ast.arg, "serial", False):  # one part only (module.parallel_parts says 1)
        lines += ["  %not_first = icmp ne i32 %part, 0", "  br i1 %not_first, label %skip, label %run",
                  "skip:", "  ret void", "run:"]
    args = []
    for i, buf in enumerate(kernel.params):
        slot, offset = param_pointer(buf, nin)
        offset += tmpl.shifts[i] * buf.dtype.itemsize if tmpl else 0
        lines.append(f"  %s{i} = getelementptr inbounds ptr, ptr %bufs, i64 {slot}")
        lines.append(f"  %b{i} = load ptr, ptr %s{i}")
        if kernel.stepped and buf.step_stride:
            lines += [f"  %m{i} = mul i64 %step64, {buf.step_stride * buf.dtype.itemsize}",
                      f"  %o{i} = add i64 %m{i}, {offset}"]
            offset = f"%o{i}"
        lines.append(f"  %a{i} = getelementptr inbounds i8, ptr %b{i}, i64 {offset}")
        args.append(f"ptr %a{i}")
    if reads_dims(kernel.ast):
        args.append("ptr %dims")
    args += [f"{ltype(v.dtype)} {const(v.dtype, v.arg)}" for v in (tmpl.values if tmpl else ())]
    lines.append(f"  call void @{body}({', '.join(args)}, i32 %part, i32 %nparts)")
    lines += ["  ret void", "}"]
    return "\n".join(lines)

