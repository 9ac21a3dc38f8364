"""The operations of the IR and their typed arguments.

Every op has a frozen, hashable argument type (or None); `spec.py` checks that each node's argument
and sources fit its op. Ops come in groups:

- tensor level: sources (INPUT, WEIGHT, CONST), movement (index remapping only, never a copy),
  elementwise ALU ops, REDUCE, and the contractions CONV and MATMUL (first-class, because they are
  where the time goes; `passes/decompose.py` lowers them to REDUCE(MUL) for the generic path);
  data-dependent indexing: GATHER (read at positions computed from an index tensor at run time) and
  SCATTER (a copy with elements replaced or combined at run-time positions);
- kernel/loop level: PARAM, RANGE, LOAD, STORE, LOOP_REDUCE, SINK;
- symbolic: DEFINE_VAR and ALU ops on dtype `index` (the same simplifier handles shapes and indices).

ALU ops are shared by the tensor and the loop level: at tensor level their sources all have the
same shape (broadcasting is an explicit EXPAND); at loop level they work on scalars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from svodc.ir.uop import UOp

    Dim = int | UOp
    Shape = tuple[Dim, ...]


class Ops(Enum):
    # --- graph roots
    SINK = auto()  # src: the values that must be computed (graph outputs, or a kernel's stores)

    # --- tensor-level sources
    INPUT = auto()  # arg InputArg: a graph input
    WEIGHT = auto()  # arg ConstData: a constant tensor with data
    CONST = auto()  # arg: python scalar; shape (); broadcast with RESHAPE + EXPAND

    # --- movement (tensor level): output index -> source index, never a copy
    RESHAPE = auto()  # arg ShapeArg
    PERMUTE = auto()  # arg PermuteArg
    EXPAND = auto()  # arg ShapeArg (dims of size 1 become larger)
    PAD = auto()  # arg PadArg
    SLICE = auto()  # arg SliceArg (start, step per axis; covers shrink and flip)
    WINDOW = auto()  # arg WindowArg (sliding windows: the view pooling and convolution read)

    # --- elementwise ALU (tensor and loop level)
    NEG = auto()
    RECIP = auto()
    SQRT = auto()
    EXP2 = auto()
    LOG2 = auto()
    EXP = auto()  # decomposed into polynomials by codegen/transcendental.py
    LOG = auto()
    TANH = auto()
    ERF = auto()
    SIN = auto()
    COS = auto()
    TAN = auto()
    ASIN = auto()
    ACOS = auto()
    ATAN = auto()
    SINH = auto()
    COSH = auto()
    ASINH = auto()
    ACOSH = auto()
    ATANH = auto()
    ROUND = auto()  # round to nearest, ties to even, float -> float
    TRUNC = auto()  # round toward zero, float -> float
    FLOOR = auto()
    ABS = auto()
    NOT = auto()  # logical not for bool, bitwise for ints
    ADD = auto()
    SUB = auto()
    MUL = auto()
    DIV = auto()  # float division; integer division truncates toward zero (C semantics)
    IDIV = auto()  # integer floor division (index arithmetic: operands known non-negative)
    MOD = auto()  # integer remainder matching IDIV (index arithmetic)
    MAX = auto()
    MIN = auto()
    POW = auto()
    CMPLT = auto()
    CMPEQ = auto()
    CMPNE = auto()
    AND = auto()
    OR = auto()
    XOR = auto()
    SHL = auto()  # integer shift left; a shift by >= the width gives 0
    SHR = auto()  # integer shift right: logical for unsigned, arithmetic for signed (sign fill past the width)
    WHERE = auto()  # (cond, a, b)
    MULACC = auto()  # (a, b, c) -> a*b + c, fused where the target can
    CAST = auto()  # to self.dtype
    BITCAST = auto()

    # --- reductions and contractions (tensor level)
    REDUCE = auto()  # arg ReduceArg; keeps reduced axes as size 1
    CONV = auto()  # arg ConvArg; src (x [N, C, *spatial], w [O, C/groups, *kernel])
    MATMUL = auto()  # src (a [..., M, K], b [..., K, N]); batch dims already broadcast to equal

    # --- data-dependent indexing (tensor level); index values are normalized (negative counts from
    # the end) and clamped into the axis, so no index value can read or write outside a buffer.
    GATHER = auto()  # arg GatherArg; src (x, idx): out[p] = x[p with p[axis] = idx[p]], out.shape = idx.shape
    SCATTER = auto()  # arg ScatterArg; src (x, idx, upd): out = x, then out[p with p[axis] = idx[p]] (op)= upd[p]
    SIZED = auto()  # arg SizedArg; src (x, value, ...): x, with axes sized at run time by values (value dims)

    # --- step loops (tensor level): a recurrent layer's step graph, run `trips` times (passes/steploop.py)
    STEP_IN = auto()  # arg StepInArg; a leaf of a step graph: the previous state k, or step input j at step t
    STEP_LOOP = auto()  # arg StepLoopArg; src (init, *step inputs, *state roots): the states after each step

    # --- symbolic
    DEFINE_VAR = auto()  # arg VarArg: a named dimension with bounds

    # --- kernel / loop level
    PARAM = auto()  # arg ParamArg: the kernel's i-th buffer parameter; dtype is a pointer
    RANGE = auto()  # arg RangeArg; src (end,): loop index 0 <= i < end
    LOAD = auto()  # src (param, index) or (param, index, valid); arg: the value when not valid
    STORE = auto()  # src (param, index, value); dtype void
    LOOP_REDUCE = auto()  # arg ReduceOp (ADD/MAX/MIN/MUL); src (value, *ranges it reduces over)
    GEMM = auto()  # arg GemmArg; src (a param, b param, c param[, epilogue STORE]): a contraction kernel

    # Members are singletons compared by identity: identity hashing is as correct as Enum's hash of the
    # name, and a C call instead of a Python one (every rule lookup, intern key and op-set test hashes an
    # op: a quarter of a million times for resnet50). Nothing may depend on set order either way.
    __hash__ = object.__hash__


# Groups, as frozensets for fast membership tests.
# Unary float functions beyond the basic arithmetic (codegen/transcendental.py writes each in the IR).
MATH_UNARY = frozenset({Ops.EXP2, Ops.LOG2, Ops.EXP, Ops.LOG, Ops.TANH, Ops.ERF, Ops.SIN, Ops.COS, Ops.TAN,
                        Ops.ASIN, Ops.ACOS, Ops.ATAN, Ops.SINH, Ops.COSH, Ops.ASINH, Ops.ACOSH, Ops.ATANH,
                        Ops.ROUND, Ops.TRUNC, Ops.FLOOR})
UNARY = frozenset({Ops.NEG, Ops.RECIP, Ops.SQRT, Ops.ABS, Ops.NOT, Ops.CAST, Ops.BITCAST}) | MATH_UNARY
BINARY = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.DIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.MIN, Ops.POW,
                    Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR})
TERNARY = frozenset({Ops.WHERE, Ops.MULACC})
ALU = UNARY | BINARY | TERNARY
COMPARE = frozenset({Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE})
COMMUTATIVE = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.MIN, Ops.CMPEQ, Ops.CMPNE, Ops.AND, Ops.OR,
                         Ops.XOR})
MOVEMENT = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SLICE, Ops.WINDOW})
REDUCE_OPS = frozenset({Ops.ADD, Ops.MAX, Ops.MIN, Ops.MUL})


# ---------------------------------------------------------------------------------------------
# Typed arguments. All frozen and hashable; `key()` gives a stable, process-independent identity
# used by the structural hash.


@dataclass(frozen=True, slots=True)
class InputArg:
    name: str
    shape: tuple  # Shape


@dataclass(frozen=True, slots=True)
class ShapeArg:
    shape: tuple  # Shape


@dataclass(frozen=True, slots=True)
class PermuteArg:
    order: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PadArg:
    pads: tuple[tuple[int, int], ...]  # (before, after) per axis, non-negative
    value: float | int | bool = 0


@dataclass(frozen=True, slots=True)
class SliceArg:
    """out[i] = src[start + i*step] per axis; `shape` is the output shape (steps may be negative)."""

    starts: tuple[int, ...]
    steps: tuple[int, ...]
    shape: tuple[int, ...]
    # An ONNX Slice over a bounded dim whose starts count from the front and whose ends are its own, not
    # positions the bound's size resolved: passes/dynamic.py may then run it to the real end.
    from_front: bool = False


@dataclass(frozen=True, slots=True)
class WindowArg:
    """Sliding windows over `axes`: each windowed axis becomes its number of window positions, and
    one axis per windowed axis is appended at the end for the offset inside the window.
    out[..., o_a, ..., k_a] = src[..., o_a*stride_a + k_a*dilation_a, ...]"""

    axes: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReduceArg:
    op: Ops  # one of REDUCE_OPS
    axes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ConvArg:
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]  # (before, after) per spatial axis
    groups: int


@dataclass(frozen=True, slots=True)
class GatherArg:
    """GATHER reads x at the output position with axis `axis` replaced by the index value there.
    idx has the output's shape and x's rank; on other axes x has size 1 (broadcast: read at 0) or at
    least the output's size."""

    axis: int
    # (out_axis, mul, div): the index depends only on the output position, as a Resize's by scales does
    # (frontend/ops/resize.py); over a bounded dim, out_axis has floor(value * mul / div) elements
    # (passes/dynamic.py) and the index is clamped into the run-time size (passes/lower.py).
    sized: tuple[int, int, int] | None = None


@dataclass(frozen=True, slots=True)
class ScatterArg:
    """SCATTER: the result is x with, for every position p of idx/upd (one shape, x's rank, no larger
    than x on the other axes), the element at p with axis `axis` replaced by idx[p] set to upd[p]
    (reduce None) or combined with it by `reduce` (ADD/MUL/MAX/MIN), in row-major order of p: when
    indices repeat, the last write wins."""

    axis: int
    reduce: Ops | None = None


@dataclass(frozen=True, slots=True)
class SizedArg:
    """SIZED: x computed at its bound, whose axis a has the run-time size of value dim dims[a] (None: the
    bound's size); src[1 + k] is the k-th named dim's value, an int64 scalar, or -1 where the values
    deciding it are invalid (passes/dynamic.py ValueDim; the code writes it into the `dims` array)."""

    dims: tuple[tuple[str, int, int] | None, ...]  # per axis (name, lo, hi) or None


@dataclass(frozen=True, slots=True)
class StepInArg:
    """STEP_IN: in a step graph, `state` k (slot k of the previous step's states, or of the loop's init at
    step 0) or step input j (slice t of the loop's step source j), of `shape`."""

    kind: str  # "state" or "step"
    index: int
    shape: tuple[int, ...]
    # Which loop (its node's outputs and direction): loops of equal shapes keep apart, so what a step graph
    # computes from its leaves alone (views of them) has its own layer's provenance.
    loop: str = ""


@dataclass(frozen=True, slots=True)
class StepLoopArg:
    """STEP_LOOP(init [S, ...], step sources x_j [trips, ...], state roots r_k [...]): hist[0] = init, and
    for t < trips hist[t + 1][k] = r_k with STEP_IN state k = hist[t][k] and STEP_IN step j = x_j[t].
    The value is hist, [trips + 1, S, ...]: every step's states (Y and the final states are views of it)."""

    trips: int
    steps: int  # how many step sources follow init in src; the S = init.shape[0] state roots follow them


@dataclass(frozen=True, slots=True)
class VarArg:
    name: str
    lo: int
    hi: int
    slot: int = 0  # a bounded input dim: its index in the entry's `dims` array (passes/dynamic.py)


@dataclass(frozen=True, slots=True)
class ParamArg:
    index: int
    name: str  # what the buffer holds, for the IR dump and error messages


class RangeKind(Enum):
    LOOP = auto()  # an output loop
    PARALLEL = auto()  # an output loop cut into parts that threads share (codegen/module.py)
    REDUCE = auto()  # bound by a LOOP_REDUCE


@dataclass(frozen=True, slots=True)
class RangeArg:
    id: int
    kind: RangeKind


@dataclass(frozen=True, slots=True)
class KernelArg:
    name: str
    # Run by one thread only (the others skip it): for kernels whose stores must happen in order
    # (a scatter's read-modify-write at run-time positions, which may repeat).
    serial: bool = False


@dataclass(frozen=True, slots=True)
class GemmOperand:
    """Where element (batch..., row, col) of an operand lives, in elements from its parameter.
    A: row = m, col = k. B: row = k, col = n. C: row = m, col = n.
    packed: the operand is a constant laid out in panels (svodc/gemm_plan.py: A_PANEL rows of A, or
    B_PANEL columns of B), zero-padded to whole panels; row/col strides are then ignored."""

    batch_strides: tuple[int, ...]
    row_stride: int
    col_stride: int
    offset: int = 0
    packed: bool = False


@dataclass(frozen=True, slots=True)
class QuantGemm:
    """An integer GEMM (passes/lower_gemm_int8.py): A is int8 weight panels (its row sums a fourth
    source), B 8-bit activations (int8 when signed, else uint8) less the scalar zero point
    b_zero, C int32."""

    b_zero: int
    b_signed: bool
    # max |A|: at most 64 (7-bit weights, quantize_static's reduce_range), a u8 x s8 byte pair sums
    # exactly in int16 (255 * 64 * 2 < 2^15), which x86 without VNNI's vpmaddubsw needs
    a_max: int = 128
    # 0: C is the kernel's buffer. Else the epilogue reads C from a per-thread stack tile of M rows of
    # c_tile int32 (passes/lower_gemm_int8.C_TILE), one lane tile at a time, instead of an M x N scratch
    c_tile: int = 0


@dataclass(frozen=True, slots=True)
class GemmArg:
    """C[b, m, n] = sum_k A[b, m, k] * B[b, k, n] for every batch index b (then the epilogue).

    transposed: the micro-kernels vectorize along m instead of n (C^T = B^T A^T), for products whose
    n is small and not a multiple of the vector width (late convolution layers: n = 7*7). A is then
    packed like a B panel (B_PANEL consecutive m per k) and C tiles are stored with a stride."""

    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    a: GemmOperand
    b: GemmOperand
    c: GemmOperand
    transposed: bool = False
    # Bounded dims (passes/dynamic.py), not transposed: batch_var sizes batch[0] (only the tiles of batch
    # indices below its run-time value run), m_var m and n_var n (the row / lane tiles end at the run-time
    # size), k_var k (neither operand packed).
    batch_var: VarArg | None = None
    m_var: VarArg | None = None
    n_var: VarArg | None = None
    k_var: VarArg | None = None
    quant: QuantGemm | None = None  # an integer GEMM (its own kernels: codegen/llvm_gemm_int8.py)

    @property
    def runtime(self) -> bool:
        """Does a size of this GEMM come from the entry's `dims`?"""
        return any(v is not None for v in (self.batch_var, self.m_var, self.n_var, self.k_var))


class ConstData:
    """The data of a WEIGHT: an immutable numpy array, identified by its content.

    Two ConstData with equal dtype, shape and bytes are equal (so identical weights are shared by
    hash-consing). The digest is computed once; the array is made read-only so it cannot change
    under the digest.
    """

    __slots__ = ("_hash", "array", "digest")

    def __init__(self, array, digest: bytes | None = None):
        import hashlib

        import numpy as np

        a = np.asarray(array, order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
        if a.flags.writeable:
            a = a.copy() if a.base is not None else a
            a.flags.writeable = False
        self.array = a
        if digest is None:
            h = hashlib.sha256()
            h.update(f"{a.dtype.str}{a.shape}".encode())
            # the bytes, without a copy (a uint8 view: memoryview refuses ml_dtypes' bfloat16 etc.)
            h.update(a.reshape(-1).view(np.uint8).data if a.size else b"")
            digest = h.digest()
        self.digest = digest
        self._hash = hash(digest)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConstData) and self.digest == other.digest

    def __repr__(self) -> str:
        return f"ConstData({self.array.dtype}{list(self.shape)}, {self.digest[:4].hex()})"


def arg_key(arg: object) -> object:
    """A hashable key for an argument that distinguishes what Python's == conflates or breaks:
    1 vs 1.0 vs True, -0.0 vs 0.0, and NaN (which is not equal to itself)."""
    if isinstance(arg, float):
        return ("f", math.copysign(1.0, arg), arg.hex() if not math.isnan(arg) else "nan")
    if isinstance(arg, bool):
        return ("b", arg)
    if isinstance(arg, tuple):
        return tuple(arg_key(a) for a in arg)
    if isinstance(arg, PadArg):
        return ("pad", arg.pads, arg_key(arg.value))
    return arg
