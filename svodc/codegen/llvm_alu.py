"""Instruction selection for scalar ops: one UOp -> one or a few LLVM instructions.

Only intrinsics that every backend expands inline are used (sqrt, fabs, abs, smax/smin/umax/umin,
fmuladd, fptosi.sat/fptoui.sat): a code image has no libm to call. Integer division never traps:
a zero divisor gives 0, and INT_MIN / -1 wraps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from svodc.codegen.llvm_types import const, ltype, mem_type
from svodc.ir.dtypes import DType, dtypes, max_value, min_value
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp

if TYPE_CHECKING:
    from svodc.codegen.llvm_ir import KernelEmitter, Scope

_FLOAT_BIN = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.DIV: "fdiv"}
_INT_BIN = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}


def _intrinsic(em: KernelEmitter, name: str, ret: str, args: list[str]) -> str:
    em.uses_intrinsics.add(f"declare {ret} @{name}({', '.join(args)})")
    return name


def _suffix(dt: DType) -> str:
    t = ltype(dt)
    return {"float": "f32", "double": "f64", "half": "f16", "bfloat": "bf16"}.get(t, t)


def _signed(dt: DType) -> bool:
    return dt.kind in ("int", "index")


def emit_alu(em: KernelEmitter, scope: Scope, n: UOp, v: list[str]) -> str:
    op, dt = n.op, n.dtype
    t = ltype(dt)
    line = em.emit_line
    if op is Ops.LOAD:
        ptr = line(scope, f"getelementptr inbounds {mem_type(dt)}, ptr {v[0]}, i64 {v[1]}", "ptr")
        x = line(scope, f"load {mem_type(dt)}, ptr {ptr}")
        return line(scope, f"trunc i8 {x} to i1") if dt is dtypes.bool else x
    if op is Ops.CAST:
        return emit_cast(em, scope, n.src[0].dtype, dt, v[0])
    if op is Ops.BITCAST:
        s = ltype(n.src[0].dtype)
        return v[0] if s == t else line(scope, f"bitcast {s} {v[0]} to {t}")
    if op is Ops.WHERE:
        return line(scope, f"select i1 {v[0]}, {t} {v[1]}, {t} {v[2]}")
    if op in (Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE):
        st = n.src[0].dtype
        s = ltype(st)
        if st.is_float:
            pred = {Ops.CMPLT: "olt", Ops.CMPEQ: "oeq", Ops.CMPNE: "une"}[op]
            return line(scope, f"fcmp {pred} {s} {v[0]}, {v[1]}")
        pred = {Ops.CMPLT: "slt" if _signed(st) else "ult", Ops.CMPEQ: "eq", Ops.CMPNE: "ne"}[op]
        return line(scope, f"icmp {pred} {s} {v[0]}, {v[1]}")
    if dt.is_float:
        return _float_op(em, scope, n, v)
    return _int_op(em, scope, n, v)


def _float_op(em: KernelEmitter, scope: Scope, n: UOp, v: list[str]) -> str:
    op, dt = n.op, n.dtype
    t, line = ltype(dt), em.emit_line
    if op in _FLOAT_BIN:
        return line(scope, f"{_FLOAT_BIN[op]} {t} {v[0]}, {v[1]}")
    if op is Ops.NEG:
        return line(scope, f"fneg {t} {v[0]}")
    if op is Ops.RECIP:
        return line(scope, f"fdiv {t} {const(dt, 1.0)}, {v[0]}")
    if op in (Ops.SQRT, Ops.ABS, Ops.ROUND):  # ROUND: kept only for targets with an instruction (native_roundeven)
        fn = {Ops.SQRT: "sqrt", Ops.ABS: "fabs", Ops.ROUND: "roundeven"}[op]
        name = _intrinsic(em, f"llvm.{fn}.{_suffix(dt)}", t, [t])
        return line(scope, f"call {t} @{name}({t} {v[0]})")
    if op is Ops.MULACC:
        name = _intrinsic(em, f"llvm.fmuladd.{_suffix(dt)}", t, [t, t, t])
        return line(scope, f"call {t} @{name}({t} {v[0]}, {t} {v[1]}, {t} {v[2]})")
    if op in (Ops.MAX, Ops.MIN):
        a, b = (1, 0) if _number(n.src[0]) and not _number(n.src[1]) else (0, 1)
        return float_minmax(em, scope, op, dt, v[a], v[b], b_number=_number(n.src[b]))
    raise NotImplementedError(f"no float instruction for {op.name} ({dt.name}); transcendental ops must be "
                              "rewritten by pm_transcendental before emission")


def _number(n: UOp) -> bool:
    """n is a constant that is not NaN (of any numeric type: NaN alone differs from itself)."""
    return n.op is Ops.CONST and n.arg == n.arg


def float_minmax(em: KernelEmitter, scope: Scope, op: Ops, dt: DType, a: str, b: str, b_number: bool = False) -> str:
    """NaN-propagating max/min (numpy semantics) from compare and select, which every target has. Where b is
    known not to be NaN (a clamp's bound), one unordered compare does it (a NaN a is then picked): a clamp is
    two operations, not four (exp's clamp in a softmax loop)."""
    t, line = ltype(dt), em.emit_line
    if b_number:
        pick_a = line(scope, f"fcmp {'ugt' if op is Ops.MAX else 'ult'} {t} {a}, {b}")
        return line(scope, f"select i1 {pick_a}, {t} {a}, {t} {b}")
    pred = "ogt" if op is Ops.MAX else "olt"
    better = line(scope, f"fcmp {pred} {t} {a}, {b}")
    a_nan = line(scope, f"fcmp uno {t} {a}, {a}")
    pick_a = line(scope, f"or i1 {better}, {a_nan}")
    return line(scope, f"select i1 {pick_a}, {t} {a}, {t} {b}")


def _int_op(em: KernelEmitter, scope: Scope, n: UOp, v: list[str]) -> str:
    op, dt = n.op, n.dtype
    t, line = ltype(dt), em.emit_line
    if dt is dtypes.bool and op in (Ops.MAX, Ops.MIN, Ops.ADD, Ops.MUL):
        op = {Ops.MAX: Ops.OR, Ops.ADD: Ops.OR, Ops.MIN: Ops.AND, Ops.MUL: Ops.AND}[op]
    if op in _INT_BIN:
        return line(scope, f"{_INT_BIN[op]} {t} {v[0]}, {v[1]}")
    if op is Ops.NEG:
        return v[0] if dt is dtypes.bool else line(scope, f"sub {t} 0, {v[0]}")
    if op is Ops.NOT:
        return line(scope, f"xor {t} {v[0]}, {'true' if dt is dtypes.bool else -1}")
    if op is Ops.ABS:
        if not _signed(dt):
            return v[0]
        name = _intrinsic(em, f"llvm.abs.{t}", t, [t, "i1"])
        return line(scope, f"call {t} @{name}({t} {v[0]}, i1 false)")
    if op in (Ops.MAX, Ops.MIN):
        kind = ("s" if _signed(dt) else "u") + ("max" if op is Ops.MAX else "min")
        name = _intrinsic(em, f"llvm.{kind}.{t}", t, [t, t])
        return line(scope, f"call {t} @{name}({t} {v[0]}, {t} {v[1]})")
    if op is Ops.MULACC:
        m = line(scope, f"mul {t} {v[0]}, {v[1]}")
        return line(scope, f"add {t} {m}, {v[2]}")
    if op is Ops.DIV:
        return _int_div(em, scope, n, v)
    if op in (Ops.SHL, Ops.SHR):
        return _shift(em, scope, n, v)
    if op in (Ops.IDIV, Ops.MOD):
        return _floor_divmod(em, scope, n, v)
    raise NotImplementedError(f"no integer instruction for {op.name} ({dt.name})")


def _shift(em: KernelEmitter, scope: Scope, n: UOp, v: list[str]) -> str:
    """SHL/SHR; LLVM's shifts by >= the width are poison, the IR's give 0 (or the sign fill)."""
    t, line = ltype(n.dtype), em.emit_line
    instr = "shl" if n.op is Ops.SHL else "ashr" if _signed(n.dtype) else "lshr"
    width = int(t[1:])
    amount = n.src[1]
    if amount.op is Ops.CONST and 0 <= amount.arg < width:
        return line(scope, f"{instr} {t} {v[0]}, {v[1]}")
    big = line(scope, f"icmp uge {t} {v[1]}, {width}")  # unsigned: a negative amount is huge too
    safe = line(scope, f"select i1 {big}, {t} 0, {t} {v[1]}")
    r = line(scope, f"{instr} {t} {v[0]}, {safe}")
    fill = line(scope, f"ashr {t} {v[0]}, {width - 1}") if instr == "ashr" else "0"
    return line(scope, f"select i1 {big}, {t} {fill}, {t} {r}")


def _safe_divisor(em: KernelEmitter, scope: Scope, dt: DType, d: str, signed: bool) -> tuple[str, str]:
    """(divisor that cannot trap, i1 'divisor was zero')."""
    t, line = ltype(dt), em.emit_line
    zero = line(scope, f"icmp eq {t} {d}, 0")
    bad = zero
    if signed:  # INT_MIN / -1 overflows and traps on x86: divide by 1 and negate instead
        m1 = line(scope, f"icmp eq {t} {d}, -1")
        bad = line(scope, f"or i1 {zero}, {m1}")
    return line(scope, f"select i1 {bad}, {t} 1, {t} {d}"), zero


def _int_div(em: KernelEmitter, scope: Scope, n: UOp, v: list[str]) -> str:
    dt = n.dtype
    t, line = ltype(dt), em.emit_line
    signed = _signed(dt)
    if n.src[1].op is Ops.CONST and n.src[1].arg not in (0, -1):
        return line(scope, f"{'sdiv' if signed else 'udiv'} {t} {v[0]}, {v[1]}")
    d, zero = _safe_divisor(em, scope, dt, v[1], signed)
    q = line(scope, f"{'sdiv' if signed else 'udiv'} {t} {v[0]}, {d}")
    if signed:
        m1 = line(scope, f"icmp eq {t} {v[1]}, -1")
        neg = line(scope, f"sub {t} 0, {v[0]}")
        q = line(scope, f"select i1 {m1}, {t} {neg}, {t} {q}")
    return line(scope, f"select i1 {zero}, {t} 0, {t} {q}")


def _floor_divmod(em: KernelEmitter, scope: Scope, n: UOp, v: list[str]) -> str:
    """Floor division / modulo (index arithmetic). Non-negative operands: plain sdiv/srem."""
    x, d = n.src
    t, line = ltype(n.dtype), em.emit_line
    is_div = n.op is Ops.IDIV
    if x.vmin >= 0 and d.op is Ops.CONST and d.arg > 0:
        return line(scope, f"{'sdiv' if is_div else 'srem'} {t} {v[0]}, {v[1]}")
    dv, zero = _safe_divisor(em, scope, n.dtype, v[1], signed=True)
    q = line(scope, f"sdiv {t} {v[0]}, {dv}")
    r = line(scope, f"srem {t} {v[0]}, {dv}")
    rnz = line(scope, f"icmp ne {t} {r}, 0")
    rneg = line(scope, f"icmp slt {t} {r}, 0")
    dneg = line(scope, f"icmp slt {t} {dv}, 0")
    diff = line(scope, f"xor i1 {rneg}, {dneg}")
    adj = line(scope, f"and i1 {rnz}, {diff}")
    if is_div:
        q1 = line(scope, f"sub {t} {q}, 1")
        out = line(scope, f"select i1 {adj}, {t} {q1}, {t} {q}")
    else:
        r1 = line(scope, f"add {t} {r}, {dv}")
        out = line(scope, f"select i1 {adj}, {t} {r1}, {t} {r}")
    return line(scope, f"select i1 {zero}, {t} 0, {t} {out}")


def emit_cast(em: KernelEmitter, scope: Scope, src: DType, dst: DType, x: str, lanes: int = 1) -> str:
    """x: a value of src, or with lanes > 1 a <lanes x src> vector (a GEMM epilogue in registers,
    llvm_gemm_epilogue.py): the same conversion per lane."""
    line = em.emit_line

    def ty(dt: DType | str) -> str:
        t = dt if isinstance(dt, str) else ltype(dt)
        return t if lanes == 1 else f"<{lanes} x {t}>"

    def k(dt: DType, value: float) -> str:
        return const(dt, value) if lanes == 1 else f"splat ({ltype(dt)} {const(dt, value)})"

    s, t, b, i32 = ty(src), ty(dst), ty("i1"), ty("i32")
    h, i16, f32 = ty("half"), ty("i16"), ty("float")
    if src == dst or (ltype(src) == ltype(dst) and src.kind == dst.kind):
        return x
    if dtypes.float16 in (src, dst):  # float16 <-> float32 left by emulate.py for F16C targets (vcvtph2ps/ps2ph)
        if src is dtypes.float16:
            return line(scope, f"fpext {h} {line(scope, f'bitcast {i16} {x} to {h}')} to {f32}")
        return line(scope, f"bitcast {h} {line(scope, f'fptrunc {f32} {x} to {h}')} to {i16}")
    if dst is dtypes.bool:
        if src.is_float:
            return line(scope, f"fcmp une {s} {x}, {k(src, 0.0)}")
        return line(scope, f"icmp ne {s} {x}, {k(src, 0)}")
    if src.is_float and dst.is_float:
        op = "fpext" if src.bits < dst.bits else "fptrunc"
        return line(scope, f"{op} {s} {x} to {t}")
    if src.is_float and dst in (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16):
        # fptosi.sat's integers (NaN -> 0, out of range -> the type's min/max) by compares and selects
        # around a plain conversion: LLVM scalarizes vector fptosi.sat to 8/16 bits on x86, and this
        # vectorizes (requantized outputs are mostly uint8 / int8)
        lo, hi = k(src, float(min_value(dst))), k(src, float(max_value(dst)))
        low = line(scope, f"fcmp olt {s} {x}, {lo}")
        a = line(scope, f"select {b} {low}, {s} {lo}, {s} {x}")
        high = line(scope, f"fcmp ogt {s} {a}, {hi}")
        c = line(scope, f"select {b} {high}, {s} {hi}, {s} {a}")
        nan = line(scope, f"fcmp uno {s} {x}, {x}")
        d = line(scope, f"select {b} {nan}, {s} {k(src, 0.0)}, {s} {c}")
        i = line(scope, f"fptosi {s} {d} to {i32}")
        if lanes > 1:  # the same clamp on the integers: x86 selects it with the trunc as saturating packs
            for op, bound in (("smax", min_value(dst)), ("smin", max_value(dst))):
                fn = _intrinsic(em, f"llvm.{op}.v{lanes}i32", i32, [i32, i32])
                i = line(scope, f"call {i32} @{fn}({i32} {i}, {i32} {k(dtypes.int32, bound)})")
        return line(scope, f"trunc {i32} {i} to {t}")
    if src.is_float:  # saturating: NaN -> 0, out of range -> the type's min/max (never poison)
        kind = "fptosi" if _signed(dst) else "fptoui"
        v = "" if lanes == 1 else f"v{lanes}"
        name = _intrinsic(em, f"llvm.{kind}.sat.{v}{_suffix(dst)}.{v}{_suffix(src)}", t, [s])
        return line(scope, f"call {t} @{name}({s} {x})")
    if dst.is_float:
        op = "sitofp" if _signed(src) else "uitofp"
        return line(scope, f"{op} {s} {x} to {t}")
    sb, db = (1 if src is dtypes.bool else src.bits), dst.bits
    if sb == db:
        return x
    if sb > db:
        return line(scope, f"trunc {s} {x} to {t}")
    return line(scope, f"{'sext' if _signed(src) else 'zext'} {s} {x} to {t}")


def reduce_init(n: UOp) -> str:
    op, dt = n.arg, n.dtype
    if op is Ops.ADD:
        return const(dt, 0)
    if op is Ops.MUL:
        return const(dt, 1)
    return const(dt, min_value(dt) if op is Ops.MAX else max_value(dt))


def combine(em: KernelEmitter, scope: Scope, n: UOp, acc: str, x: str) -> str:
    """acc (op) x. Float sums and products may be reassociated: that is what lets LLVM vectorize
    a reduction; the order is fixed at compile time, so results are deterministic."""
    op, dt = n.arg, n.dtype
    t = ltype(dt)
    if dt.is_float:
        if op in (Ops.MAX, Ops.MIN):
            # llvm.maximum/minimum: NaN-propagating like float_minmax (and +0 > -0), and a recurrence
            # LLVM's loop vectorizer knows (a compare-and-select one it vectorizes only without NaNs).
            name = _intrinsic(em, f"llvm.{'maximum' if op is Ops.MAX else 'minimum'}.{_suffix(dt)}", t, [t, t])
            return em.emit_line(scope, f"call {t} @{name}({t} {acc}, {t} {x})")
        instr = "fadd" if op is Ops.ADD else "fmul"
        return em.emit_line(scope, f"{instr} reassoc contract {t} {acc}, {x}")
    fake = UOp(op, dt, (UOp.const(dt, 0), UOp.const(dt, 0)))
    return _int_op(em, scope, fake, [acc, x])
