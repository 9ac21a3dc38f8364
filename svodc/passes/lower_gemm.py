"""Lowering of a contraction kernel: a realized tensor whose fused subgraph contains a MATMUL.

The kernel becomes one GEMM node: C = A x B over the batch axes, written into the kernel's output
buffer (the scheduler only fuses a MATMUL with consumers that keep its memory layout: ALU ops and
reshapes), followed by an epilogue STORE that rewrites each tile of C in place while it is still
in cache: bias, folded BatchNormalization, activation, residual add...

Operands are read through affine views. A constant operand is packed at compile time into panels
(svodc/gemm_plan.py; A: A_PANEL rows, B: B_PANEL columns, zero-padded), the layout the micro-kernels
stream; the run time never repacks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from svodc.gemm_plan import A_PANEL, B_PANEL
from svodc.ir.dtypes import DType, dtypes
from svodc.ir.interpret import evaluate
from svodc.ir.ops import (
    ConstData,
    GemmArg,
    GemmOperand,
    KernelArg,
    Ops,
    RangeKind,
    VarArg,
)
from svodc.ir.rewrite import graph_rewrite
from svodc.ir.symbolic import pm_symbolic
from svodc.ir.uop import UOp
from svodc.passes.buffers import Buffers, computed_nodes
from svodc.passes.dynamic import DynamicAxes, is_constant
from svodc.passes.lower import KernelLowerer, reshape_index
from svodc.passes.views import affine_view
from svodc.policy import OptimizationPolicy
from svodc.program import Buffer


def pack_a(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """[M, K] -> [ceil(M/A_PANEL), K, A_PANEL], zero-padded rows; into out (zeros, that shape) if given."""
    m, k = a.shape
    full, rest = divmod(m, A_PANEL)
    if out is None:
        out = np.zeros((full + (rest > 0), k, A_PANEL), a.dtype)
    if full:
        out[:full] = a[:full * A_PANEL].reshape(full, A_PANEL, k).transpose(0, 2, 1)
    if rest:
        out[full, :, :rest] = a[full * A_PANEL:].T
    return out


def pack_b(b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """[K, N] -> [ceil(N/B_PANEL), K, B_PANEL], zero-padded columns; into out (zeros, that shape) if given."""
    k, n = b.shape
    full, rest = divmod(n, B_PANEL)
    if out is None:
        out = np.zeros((full + (rest > 0), k, B_PANEL), b.dtype)
    if full:
        out[:full] = b[:, :full * B_PANEL].reshape(k, full, B_PANEL).transpose(1, 0, 2)
    if rest:
        out[full, :, :rest] = b[:, full * B_PANEL:]
    return out


def find_matmul(root: UOp, is_buffer: Callable[[UOp], bool]) -> UOp | None:
    """The MATMUL computed inside this kernel (not behind a realized buffer), if any."""
    return next((n for n in computed_nodes(root, is_buffer) if n.op is Ops.MATMUL), None)


class GemmLowerer(KernelLowerer):
    transposed = False
    weight_dtype = dtypes.float32  # of the packed constants

    def operand(self, x: UOp, role: str) -> tuple[UOp, GemmOperand]:
        nb = x.ndim - 2

        def is_base(n: UOp) -> bool:
            return n.op in (Ops.WEIGHT, Ops.CONST) or self.buffers.get(n) is not None

        if is_constant(x):
            # Constants are evaluated and packed now, whatever their view (a flipped ConvTranspose
            # weight is not affine after a reshape); broadcast batch axes are packed once.
            view = affine_view(x, is_base)
            return self.packed(x, role, view.strides[:nb] if view is not None else (1,) * nb)
        view = affine_view(x, is_base)
        if view is None:
            raise AssertionError(f"GEMM operand {role} is not an affine view (the scheduler should have realized it)")
        buf = self.buffers.get(view.base)
        assert buf is not None
        *bs, rs, cs = view.strides
        return self.param(buf), GemmOperand(tuple(bs), rs, cs, view.offset)

    def packed(self, x: UOp, role: str, batch_strides: tuple[int, ...]) -> tuple[UOp, GemmOperand]:
        data = evaluate([x])[0]
        nb = x.ndim - 2
        batch = x.shape[:nb]
        # Pack once per distinct batch index: axes with stride 0 in the view are broadcasts.
        live = [i for i in range(nb) if batch_strides[i] != 0 and batch[i] != 1]
        index = tuple(slice(None) if i in live else slice(0, 1) for i in range(nb))
        sub = data[index].reshape((-1,) + data.shape[-2:])
        # packed straight into the weight's float32 array: one copy of the data (np.stack of packed copies, then
        # two astype copies took 0.4 s of ResNet-50's 1.6 s of passes)
        if role == "b":
            pack, mats, panel, across = pack_b, list(sub), B_PANEL, 1
        elif self.transposed:  # A is the vector side: panels of B_PANEL consecutive rows of A
            pack, mats, panel, across = pack_b, [s.T for s in sub], B_PANEL, 1
        else:
            pack, mats, panel, across = pack_a, list(sub), A_PANEL, 0
        rows, cols = mats[0].shape
        k = cols if across == 0 else rows
        panels = np.zeros((len(mats), -(-mats[0].shape[across] // panel), k, panel), np.float32)
        for mat, out in zip(mats, panels, strict=True):
            pack(mat, out)
        per = panels[0].size
        strides, s = [0] * nb, per
        for i in reversed(live):
            strides[i] = s
            s *= batch[i]
        wd = self.weight_dtype
        weight = UOp(Ops.WEIGHT, wd, (), ConstData(panels.astype(wd.np, copy=False)))
        return self.param(self.buffers.weight(weight)), GemmOperand(tuple(strides), 0, 0, 0, packed=True)

    def lower_gemm(self, root: UOp, mm: UOp) -> UOp:
        out = self.params[0]
        a, b = mm.src
        batch, (m, n), k = mm.shape[:-2], mm.shape[-2:], a.shape[-1]
        # a run-time m, n or k: lanes along n (the run-time tile counts are those of GemmArg's *_var)
        runtime = bool(self.dyn) and any(x is not None for x in (*self.dyn.axes(mm)[-2:], self.dyn.axes(a)[-1]))
        self.transposed = (self.policy.gemm_transpose and not runtime
                           and _vectorize_along_m(m, n, k, is_constant(a), is_constant(b), self.policy))
        a_param, a_op = self.operand(a, "a")
        b_param, b_op = self.operand(b, "b")
        c_strides, s = [], m * n
        for d in reversed(batch):
            c_strides.append(s)
            s *= d
        c_op = GemmOperand(tuple(reversed(c_strides)), n, 1, 0)
        arg = GemmArg(tuple(batch), m, n, k, a_op, b_op, c_op, self.transposed, *self._dim_vars(mm))
        c_param = self.param(out)
        if root is mm:
            return UOp(Ops.GEMM, dtypes.void, (a_param, b_param, c_param), arg)
        # The epilogue: the root's value at (batch, m, n), reading the product back from C.
        ranges = [self.new_range(d, RangeKind.LOOP) for d in (*batch, m, n)]
        self.read_back[mm] = out
        idx = tuple(_simplify(i) for i in reshape_index(tuple(ranges), mm.shape, root.shape))
        value = self.lower(root, idx, top=True)
        store = UOp(Ops.STORE, dtypes.void, (c_param, self.linear(idx, root.shape), value))
        return UOp(Ops.GEMM, dtypes.void, (a_param, b_param, c_param, store, *ranges), arg)


    def _dim_vars(self, mm: UOp) -> tuple[VarArg | None, ...]:
        """The bounded dims sizing the GEMM's outermost batch axis, M, N and K (GemmArg's batch_var,
        m_var, n_var, k_var): the tile loop then covers only the run-time tiles. The pipeline sends
        products with another run-time axis to the generic path (pipeline.py), so none reaches here."""
        if not self.dyn:
            return None, None, None, None
        *batch, m_ax, n_ax = self.dyn.axes(mm)
        k_ax = self.dyn.axes(mm.src[0])[-1]
        assert not any(batch[1:]) and not (self.transposed and (m_ax or n_ax or k_ax)), "run-time GEMM axis"
        assert all(a is None or a.factor == 1 for a in (m_ax, n_ax, k_ax, *batch)), "a GEMM axis of dim * factor"
        lead = batch[0] if batch else None
        return tuple(None if a is None else self.dyn.var(a.dim).arg for a in (lead, m_ax, n_ax, k_ax))


def _vectorize_along_m(m: int, n: int, k: int, a_const: bool, b_const: bool, policy: OptimizationPolicy) -> bool:
    """Run C^T = B^T A^T when lanes along m waste clearly less than lanes along n (n = 49 uses 49 of
    64 lanes; m = 512 uses all) and K pays for what the transposed tile costs: C stored one lane at a
    time n apart (contiguous where n = 1), the epilogue as a second pass over C, and no k blocks (each
    would store C again), so a whole k x lanes vector panel is re-read per row tile. The thresholds are
    the policy's (transpose_*), from Zen 5 (AVX-512; C stored with vscatter, and measured again with the
    scalar stores of +prefer-no-scatter, svodc/arches.py: the same choices win), 1x1 convolutions
    transposed / not: n = 4 and 9 (over 40 % of the lanes wasted) 1.2-3x faster from K = 128 on;
    n = 25 and 49 1.04-1.25x faster at K = 960-1536, about even at K = 512 and 2048, 0.84-0.9x at K = 128-256,
    and 0.79x at K = 4608 (3x3 over 512 channels)."""
    if not a_const or b_const:
        return False
    waste_n = 1 - n / (-(-n // B_PANEL) * B_PANEL)
    waste_m = 1 - m / (-(-m // B_PANEL) * B_PANEL)
    gain = waste_n - waste_m
    if gain >= policy.transpose_free_gain:
        return k >= policy.transpose_free_min_k
    low, high = policy.transpose_k_range
    return gain > policy.transpose_min_gain and low <= k <= high


def _simplify(x: UOp) -> UOp:
    return graph_rewrite(x, pm_symbolic)


def lower_gemm_kernel(name: str, root: UOp, mm: UOp, out: Buffer, buffers: Buffers, policy: OptimizationPolicy,
                      dyn: DynamicAxes | None = None, weights: DType = dtypes.float32) -> tuple[UOp, list[Buffer]]:
    """weights: the type the packed constant operands are stored in (CompileOptions.precision)."""
    lowerer = GemmLowerer(name, out, buffers, policy, dyn)
    lowerer.weight_dtype = weights
    gemm = lowerer.lower_gemm(root, mm)
    sink = UOp(Ops.SINK, dtypes.void, (gemm,), KernelArg(name))
    return graph_rewrite(sink, pm_symbolic), lowerer.params
