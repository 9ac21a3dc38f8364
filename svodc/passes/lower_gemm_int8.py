"""Integer GEMM kernels: an int32 MATMUL of a constant 8-bit weight matrix and 8-bit activations.

The quantized ops (frontend/ops/quantize.py) build C = MATMUL(W - w_zero, x - x_zero) in int32, W a
constant and x an uint8 or int8 tensor. Where W - w_zero fits int8 and x - x_zero is CAST(x) or
SUB(CAST(x), scalar constant), the kernel reads x itself (one byte per element) and accumulates
sum_k W'[m, k] * x[k, n] exactly in int32; the zero point is a constant per row, folded in from the
weights' row sums: sum_k W'[m, k] * (x[k, n] - x_zero) = sum_k W'[m, k] * x[k, n] - x_zero * rowsum[m].

Orientation: A (the rows, m) is the constant weight, B (the lanes, n) the activation. A product whose
constant is its B (MatMulInteger, QLinearMatMul, QGemm: activation x weight) is rewritten as the
transposed product (C^T = W^T x^T, contraction.py), so one kernel shape serves both.

The packing (fixed for every target, so one weights section serves every CPU variant): W' as int8
panels of Q_PANEL rows, each [ceil(K/4)][Q_PANEL][4] (four consecutive k of one row together, zero
past K and past M), and the row sums as an int32 vector of ceil(M/Q_PANEL) * Q_PANEL values. Each
target's micro-kernel (codegen/llvm_gemm_int8.py) reads them the way its dot-product instruction wants.
A product of at most GEMV_N_MAX activation columns puts its lanes along m instead (GemmArg.transposed;
codegen/llvm_gemv_int8.py): the same packing with panels of QT_PANEL rows, a vector of rows per load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from svodc.ir.dtypes import dtypes, max_value, min_value
from svodc.ir.interpret import evaluate
from svodc.ir.ops import ConstData, GemmArg, GemmOperand, KernelArg, Ops, QuantGemm, RangeKind
from svodc.ir.rewrite import graph_rewrite
from svodc.ir.symbolic import pm_symbolic
from svodc.ir.uop import UOp
from svodc.passes.buffers import Buffers
from svodc.passes.fold import is_folded_constant, splat_value
from svodc.passes.lower import KernelLowerer, reshape_index
from svodc.passes.views import affine_view
from svodc.policy import OptimizationPolicy
from svodc.program import Buffer

Q_PANEL = 4  # weight rows per packed panel (the micro-kernel's tile rows)
# At most GEMV_N_MAX activation columns (a classifier or a recurrent step at batch 1): lanes along m, in panels of
# QT_PANEL rows (16: a 512-bit vector of int32; 2 or 4 vectors on narrower machines). The GEMM kernel's lanes run
# along n and used 1 of its 32 (AVX-512): mobilenetv2's int8 classifier, 1000 x 1280 x 1, took 0.12-0.16 ms.
GEMV_N_MAX, QT_PANEL = 4, 16
K_MAX = 8192  # a lane tile's packed activations live on the stack: K x lanes bytes (at most 256 KiB)
# With an epilogue, C goes to a per-thread stack tile of M x C_TILE int32 (lanes <= C_TILE on every
# target: codegen/llvm_gemm_int8.int8_plan), so the epilogue reads it from L1 and no M x N int32 scratch
# is written (4 bytes per output element through the caches to memory and back); M at most C_TILE_ROWS.
C_TILE, C_TILE_ROWS = 32, 1024
BYTE_TYPES = (dtypes.uint8, dtypes.int8)


@dataclass(frozen=True)
class Int8Operand:
    """An activation operand x - zero: `value` is the 8-bit tensor (a view), `zero` its zero point."""

    value: UOp
    zero: int


def int8_activation(x: UOp) -> Int8Operand | None:
    """x as CAST(v, int32) or SUB(CAST(v, int32), scalar constant in v's range) with v uint8 or int8."""
    zero = 0
    if x.op is Ops.SUB:
        z = splat_value(x.src[1])
        if z is None or x.src[1].dtype is not dtypes.int32:
            return None
        x, zero = x.src[0], int(z.arg)
    if x.op is not Ops.CAST or x.dtype is not dtypes.int32 or x.src[0].dtype not in BYTE_TYPES:
        return None
    if not min_value(x.src[0].dtype) <= zero <= max_value(x.src[0].dtype):
        return None  # a zero point is a value of x's type (a padded tap holds it, contraction.py)
    return Int8Operand(x.src[0], zero)


def int8_values(w: UOp) -> np.ndarray | None:
    """The values of a constant int32 tensor (a weight less its zero point) when all fit int8; else None."""
    if w.dtype is not dtypes.int32 or not is_folded_constant(w):
        return None
    data = evaluate([w])[0]
    return data if data.size == 0 or (int(data.min()) >= -128 and int(data.max()) <= 127) else None


def int8_weight(a: UOp) -> np.ndarray | None:
    """The constant weight matrix of an int32 MATMUL's A when it fits int8 and is one matrix for
    every batch index, as [M, K]; else None."""
    data = int8_values(a)
    if data is None:
        return None
    flat = data.reshape((-1,) + data.shape[-2:])
    return flat[0] if not flat.size or (flat == flat[:1]).all() else None


def is_int8_gemm(mm: UOp) -> bool:
    """Does the integer GEMM kernel take this MATMUL? (Evaluates the weight: call once per node.)"""
    a, b = mm.src
    return (mm.dtype is dtypes.int32 and a.shape[-1] <= K_MAX and int8_activation(b) is not None
            and is_folded_constant(a) and int8_weight(a) is not None)


def int8_gemm_shape(mm: UOp) -> bool:
    """The structure is_int8_gemm checks, without evaluating the weight (for the scheduler, after
    decompose has sent every other int32 MATMUL to the generic path)."""
    return mm.dtype is dtypes.int32 and int8_activation(mm.src[1]) is not None and is_folded_constant(mm.src[0])


def c_scratch_shape(mm: UOp) -> tuple[int, ...]:
    """The shape of the buffer an int8 GEMM with an epilogue writes C to: a stack tile's index space
    (row m, column n - n0 of the lane tile at n0: the kernel's pointer to it is the tile less n0, so
    m * C_TILE + n spans M * C_TILE + N), or the whole product where M is past C_TILE_ROWS."""
    m, n = mm.shape[-2:]
    return (m * C_TILE + n,) if m <= C_TILE_ROWS else mm.shape


def pack_int8(w: np.ndarray, panel: int = Q_PANEL) -> tuple[np.ndarray, np.ndarray]:
    """[M, K] int8 -> (panels [ceil(M/panel), ceil(K/4), panel, 4] int8, row sums [ceil(M/panel) * panel] int32)."""
    m, k = w.shape
    mp, k4 = -(-m // panel), -(-k // 4)
    padded = np.zeros((mp * panel, k4 * 4), np.int8)
    padded[:m, :k] = w
    panels = padded.reshape(mp, panel, k4, 4).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(panels), padded.astype(np.int32).sum(axis=1, dtype=np.int32)


class Int8GemmLowerer(KernelLowerer):
    def _lower_node(self, n: UOp, idx: tuple[UOp, ...], top: bool):
        c_buf = self.read_back.get(n)
        if c_buf is not None and c_buf.shape != n.shape:  # the stack tile (c_scratch_shape)
            *_, m, col = idx
            return self.load(c_buf, (graph_rewrite(m * C_TILE + col, pm_symbolic),))
        return (yield from super()._lower_node(n, idx, top))

    def lower_int8_gemm(self, root: UOp, mm: UOp, c_buf: Buffer) -> UOp:
        """The GEMM node writing C into c_buf; with root above mm, the epilogue STORE of root's value
        (read back from c_buf, per lane tile) into the kernel's output."""
        a, b = mm.src
        batch, (m, n), k = mm.shape[:-2], mm.shape[-2:], a.shape[-1]
        act = int8_activation(b)
        assert act is not None and c_buf.dtype is dtypes.int32 and (root is mm) == (c_buf is self.params[0])
        weight = int8_weight(a)
        gemv = n <= GEMV_N_MAX
        panels, sums = pack_int8(weight, QT_PANEL if gemv else Q_PANEL)
        w_param = self.param(self.buffers.weight(UOp(Ops.WEIGHT, dtypes.int8, (), ConstData(panels))))
        s_param = self.param(self.buffers.weight(UOp(Ops.WEIGHT, dtypes.int32, (), ConstData(sums))))

        def is_base(x: UOp) -> bool:
            return x.op is Ops.WEIGHT or self.buffers.get(x) is not None

        view = affine_view(act.value, is_base)
        assert view is not None, "the scheduler realizes a non-affine int8 GEMM operand"
        buf = self.buffers.get(view.base)
        assert buf is not None
        *bs, rs, cs = view.strides
        b_op = GemmOperand(tuple(bs), rs, cs, view.offset)
        c_strides, s = [], m * n
        for d in reversed(batch):
            c_strides.append(s)
            s *= d
        tile = C_TILE if c_buf.shape != mm.shape else 0
        c_op = GemmOperand((0,) * len(batch), C_TILE, 1, 0) if tile else \
            GemmOperand(tuple(reversed(c_strides)), n, 1, 0)
        a_op = GemmOperand((0,) * len(batch), 0, 0, 0, packed=True)
        a_max = int(np.abs(weight.astype(np.int32)).max()) if weight.size else 0
        quant = QuantGemm(act.zero, act.value.dtype is dtypes.int8, a_max, tile)
        arg = GemmArg(tuple(batch), m, n, k, a_op, b_op, c_op, transposed=gemv, quant=quant)
        src = (w_param, self.param(buf), self.param(c_buf), s_param)
        if root is mm:
            return UOp(Ops.GEMM, dtypes.void, src, arg)
        ranges = [self.new_range(d, RangeKind.LOOP) for d in (*batch, m, n)]
        self.read_back[mm] = c_buf
        idx = tuple(graph_rewrite(i, pm_symbolic) for i in reshape_index(tuple(ranges), mm.shape, root.shape))
        value = self.lower(root, idx, top=True)
        store = UOp(Ops.STORE, dtypes.void, (self.param(self.params[0]), self.linear(idx, root.shape), value))
        return UOp(Ops.GEMM, dtypes.void, (*src, store, *ranges), arg)


def lower_int8_gemm_kernel(name: str, root: UOp, mm: UOp, out: Buffer, c_buf: Buffer, buffers: Buffers,
                           policy: OptimizationPolicy) -> tuple[UOp, list[Buffer]]:
    """c_buf: where C goes, `out` itself when root is mm, else a scratch the epilogue reads."""
    lowerer = Int8GemmLowerer(name, out, buffers, policy, None)
    gemm = lowerer.lower_int8_gemm(root, mm, c_buf)
    sink = UOp(Ops.SINK, dtypes.void, (gemm,), KernelArg(name))
    return graph_rewrite(sink, pm_symbolic), lowerer.params
