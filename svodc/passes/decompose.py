"""Decompose contractions into primitives for the generic kernel path.

CONV becomes PAD -> WINDOW (the im2col view, never materialized) -> MUL with the broadcast weight ->
REDUCE(ADD); MATMUL becomes MUL of broadcast operands -> REDUCE(ADD) over K. The generic kernels are
correct for every shape and dtype; specialized contraction kernels claim these ops before this pass
where they apply.
"""

from __future__ import annotations

from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConvArg, Ops
from svodc.ir.pattern import PatternMatcher, UPat
from svodc.ir.uop import UOp
from svodc.policy import OptimizationPolicy

BYTE_ROWS_MIN = 16  # output row length from which a strided 8-bit convolution reads its bytes in place


def decompose_conv(n: UOp) -> UOp:
    """An 8-bit input less its zero point (a quantized convolution) is padded as bytes with the zero
    point, and the windows are taken before CAST - zero (and the CAST to float32 of an exact float
    convolution of them): the same integers, and the padded copy the scheduler realizes for the
    windows holds bytes."""
    from svodc.passes.contraction import minus_zero
    from svodc.passes.lower_gemm_int8 import int8_activation

    x, w = n.src
    arg: ConvArg = n.arg
    nsp = x.ndim - 2
    N, C = x.shape[:2]
    O = w.shape[0]
    g = arg.groups
    cg, og = C // g, O // g
    kernel = w.shape[2:]
    act = int8_activation(x) if n.dtype is dtypes.int32 else None
    # A float32 convolution of such integers (an exact depthwise QLinearConv, frontend/ops/quantize.py):
    # strided with output rows of at least BYTE_ROWS_MIN, its bytes padded in place (fuse_window_pads) beat
    # a float padded copy (mobilenetv2's 3x3 stride-2 layers, Zen 3: to 56 wide 0.76 -> 0.66 ms, to 28
    # 0.25 -> 0.22 ms); shorter rows of byte loads LLVM leaves scalar (to 14 wide 0.15 -> 0.23 ms), and at
    # stride 1 the float copy is about the output's size.
    if (n.dtype is dtypes.float32 and x.op is Ops.CAST and x.src[0].dtype is dtypes.int32 and max(arg.strides) > 1
            and nsp and n.shape[-1] >= BYTE_ROWS_MIN):
        act = int8_activation(x.src[0])
    xp = T.pad(x if act is None else act.value, [(0, 0), (0, 0), *arg.pads], 0 if act is None else act.zero)
    win = T.window(xp, range(2, 2 + nsp), kernel, arg.strides, arg.dilations)  # [N, C, *OS, *K]
    if act is not None:
        win = minus_zero(win, act.zero).cast(n.dtype)
    out_sp = win.shape[2:2 + nsp]
    full = (N, g, og, cg, *out_sp, *kernel)
    xw = T.expand(T.reshape(win, (N, g, 1, cg, *out_sp, *kernel)), full)
    ww = T.expand(T.reshape(w, (1, g, og, cg, *(1,) * nsp, *kernel)), full)
    prod = T.alu(Ops.MUL, xw, ww)
    red = T.reduce(prod, Ops.ADD, [3, *range(4 + nsp, 4 + 2 * nsp)])
    return T.reshape(red, (N, O, *out_sp))


def gemm_eligible(n: UOp, policy: OptimizationPolicy) -> bool:
    """MATMULs the GEMM kernels run (the gemm step): float32, or int32 of 8-bit operands that the integer
    GEMM takes (the int8_gemm step), and at least policy.gemm_min_macs. (A splat
    operand was collapsed to one row or column by contraction.collapse_splat_operand, so packing it
    costs K values.)"""
    if not policy.gemm:
        return False
    a, _ = n.src
    macs = a.shape[-1]
    for d in n.shape:
        macs *= d
    if macs < policy.gemm_min_macs:
        return False
    if n.dtype is dtypes.int32:
        from svodc.passes.lower_gemm_int8 import is_int8_gemm

        return policy.int8_gemm and is_int8_gemm(n)
    return n.dtype is dtypes.float32


def decompose_matmul(n: UOp, policy: OptimizationPolicy, force: bool = False) -> UOp | None:
    if not force and gemm_eligible(n, policy):
        return None
    a, b = n.src
    *batch, M, K = a.shape
    N = b.shape[-1]
    nb = len(batch)
    full = (*batch, M, N, K)
    aa = T.expand(T.reshape(a, (*batch, M, 1, K)), full)
    bt = T.permute(b, (*range(nb), nb + 1, nb))
    bb = T.expand(T.reshape(bt, (*batch, 1, N, K)), full)
    red = T.reduce(T.alu(Ops.MUL, aa, bb), Ops.ADD, [nb + 2])
    return T.reshape(red, (*batch, M, N))


def pm_decompose(policy: OptimizationPolicy) -> PatternMatcher:
    return PatternMatcher([
        (UPat(Ops.CONV, name="n"), decompose_conv),
        (UPat(Ops.MATMUL, name="n"), lambda n: decompose_matmul(n, policy)),
    ], name="decompose")
