"""Contractions at tensor level: fold per-channel scales into convolution weights, and turn
convolutions into matrix products the GEMM kernels run.

- `pm_fold_into_conv`: CONV(x, W) * a -> CONV(x, W * a) and (CONV(x, W) + b) * a -> CONV(x, W*a) + b*a
  when a and b are per-output-channel constants (inference BatchNormalization after a convolution).
  The weights change at compile time; rounding differs from the unfused order by an ulp or so. Not for
  a float32 convolution of integers (exact_integer_conv), whose exactness its requantization needs.
- `pm_conv_to_matmul`: CONV -> MATMUL(W as [g, O/g, K], im2col(x) as [N, g, K, OH*OW]). The im2col view
  is only materialized when it is not a plain strided view of x (a 1x1 convolution with stride 1 and
  no padding reads x in place). Depthwise convolutions (one input channel per group) stay on the
  generic path, which vectorizes them directly. A 1-D convolution over channels-last memory is
  MATMUL(patches [N, P, K], W^T) instead, its patches read in place (`channels_last_conv_to_matmul`).
- `collapse_splat_operand` (in `pm_conv_to_matmul`): a splat operand (one scalar, e.g. a
  ConstantOfShape weight) makes every row (A) or column (B) of the product the same, so the MATMUL
  computes one row or column and broadcasts it: M (or N) times less work, and the packed operand is
  K values instead of M x K.
"""

from __future__ import annotations

import math

import numpy as np

from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.interpret import evaluate
from svodc.ir.ops import MOVEMENT, ConvArg, Ops
from svodc.ir.pattern import PatternMatcher, UPat
from svodc.ir.uop import UOp
from svodc.passes.fold import broadcast_weight, is_folded_constant, splat_value
from svodc.passes.lower_gemm_int8 import int8_activation, int8_values
from svodc.passes.views import affine_view
from svodc.policy import OptimizationPolicy


def channel_vector(c: UOp, channels: int, axis: int = 1) -> np.ndarray | None:
    """The per-channel values of a constant that only varies along `axis` (length `channels`)."""
    if not is_folded_constant(c) or c.shape[axis] not in (1, channels):
        return None
    view = affine_view(c, lambda n: n.op in (Ops.WEIGHT, Ops.CONST))
    if view is None or any(s != 0 for i, s in enumerate(view.strides) if i != axis):
        return None
    base = evaluate([view.base])[0].reshape(-1)
    stride = view.strides[axis] if c.shape[axis] == channels else 0
    return np.asarray([base[view.offset + o * stride] for o in range(channels)], dtype=base.dtype)


def _scaled_conv(conv: UOp, scale: np.ndarray) -> UOp:
    x, w = conv.src
    data = evaluate([w])[0] * scale.reshape((-1,) + (1,) * (w.ndim - 1))
    # stored without its constant axes: a splat weight scaled by a uniform scale stays a splat
    return conv.replace(src=(x, broadcast_weight(w.dtype, data.astype(w.dtype.np, copy=False))))


def exact_integer_conv(conv: UOp) -> bool:
    """A float32 CONV of integers (x an integer CAST, less a constant): a quantized convolution the
    frontend computes in float32 because every sum is an integer below 2^24 (frontend/ops/quantize.py).
    A scale folded into its weights would round the sums that its requantization rounds later."""
    x = conv.src[0]
    if x.op is Ops.SUB and is_folded_constant(x.src[1]):
        x = x.src[0]
    return x.op is Ops.CAST and x.src[0].dtype.is_int


def _foldable(conv: UOp) -> bool:
    return conv.dtype is dtypes.float32 and is_folded_constant(conv.src[1]) and not exact_integer_conv(conv)


def fold_scale(conv: UOp, a: UOp) -> UOp | None:
    if not _foldable(conv):
        return None
    scale = channel_vector(a, conv.shape[1])
    return None if scale is None else _scaled_conv(conv, scale)


def fold_scale_bias(conv: UOp, b: UOp, a: UOp) -> UOp | None:
    if not _foldable(conv):
        return None
    channels = conv.shape[1]
    scale, bias = channel_vector(a, channels), channel_vector(b, channels)
    if scale is None or bias is None:
        return None
    new_bias = broadcast_weight(conv.dtype, (bias * scale).astype(np.float32))
    shape = (1, channels) + (1,) * (conv.ndim - 2)
    return T.alu(Ops.ADD, _scaled_conv(conv, scale), T.broadcast_to(T.reshape(new_bias, shape), conv.shape))


def merge_biases(x: UOp, b1: UOp, b2: UOp) -> UOp | None:
    """(x + b1) + b2 -> x + (b1 + b2) for constants: one add per element instead of two."""
    if x.dtype is not dtypes.float32 or not (is_folded_constant(b1) and is_folded_constant(b2)):
        return None
    return T.alu(Ops.ADD, x, T.alu(Ops.ADD, b1, b2))


_conv = UPat(Ops.CONV, name="conv")
pm_fold_into_conv = PatternMatcher([
    (UPat(Ops.MUL, src=(_conv, UPat.var("a"))), fold_scale),
    (UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(_conv, UPat.var("b"))), UPat.var("a"))), fold_scale_bias),
    (UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(UPat(Ops.CONV, name="x"), UPat.var("b1"))), UPat.var("b2"))),
     merge_biases),
], name="fold_into_conv")


def conv_to_matmul(n: UOp, min_macs: int, int8: bool = False) -> UOp | None:
    """int8: an int32 CONV(x - x_zero, W') of an 8-bit x and a constant int8-range W' (QLinearConv,
    ConvInteger) becomes the integer GEMM's MATMUL (passes/lower_gemm_int8.py): im2col of the 8-bit x
    itself, padded with x_zero (a padded tap is then x_zero - x_zero = 0, as ONNX pads x - x_zero)."""
    x, w = n.src
    arg: ConvArg = n.arg
    act = int8_activation(x) if int8 and n.dtype is dtypes.int32 else None
    if act is not None and int8_values(w) is not None:
        x = act.value
    elif n.dtype is not dtypes.float32:
        return None
    N, C = x.shape[:2]
    O = w.shape[0]
    g = arg.groups
    cg, og = C // g, O // g
    nsp = x.ndim - 2
    kernel = w.shape[2:]
    K = cg * math.prod(kernel)
    if cg == 1 or og * K * math.prod(n.shape[2:]) < min_macs:
        return None  # depthwise or tiny: the generic path does better
    xp = T.pad(x, [(0, 0), (0, 0), *arg.pads], act.zero if act else 0)
    win = T.window(xp, range(2, 2 + nsp), kernel, arg.strides, arg.dilations)  # [N, C, *OS, *K]
    out_sp = win.shape[2:2 + nsp]
    P = math.prod(out_sp)
    win = T.reshape(win, (N, g, cg, *out_sp, *kernel))
    order = (0, 1, 2, *range(3 + nsp, 3 + 2 * nsp), *range(3, 3 + nsp))  # [N, g, cg, *K, *OS]
    col = T.reshape(T.permute(win, order), (N, g, K, P))
    if act is not None:
        col = minus_zero(col, act.zero)
    w2 = T.expand(T.reshape(w, (1, g, og, K)), (N, g, og, K))
    return T.reshape(UOp(Ops.MATMUL, n.dtype, (w2, col)), (N, O, *out_sp))


def channels_last_conv_to_matmul(n: UOp, min_macs: int) -> UOp | None:
    """A float32 convolution whose input views memory with channels innermost (a TF/JAX export's 1-D
    convolution: Transpose of [N, L, C] to [N, C, L, 1]) as MATMUL(patches [N, P, K], W^T [K, O]) -> [N, P, O],
    viewed as [N, O, *OS], with K ordered (*kernel, C): each patch row is then a run of that memory read in
    place, where conv_to_matmul's im2col [K, P] has its columns s*C apart and is copied (a transposing gather:
    magika's 1280 x 508 im2col took 1.2 ms next to its 12 ms GEMM; this way its product takes 9.7 ms in all, and
    the activation and max over the length that read it transposed 0.9 -> 1.3 ms; one Zen 3 core, same process,
    loaded machine). Only where the patches are an affine
    view: one group, no padding, taps that merge with the channels (a 1-D window: the other axis and its
    kernel of size 1); else None (conv_to_matmul's path)."""
    x, w = n.src
    arg: ConvArg = n.arg
    if (n.dtype is not dtypes.float32 or arg.groups != 1 or any(p for side in arg.pads for p in side)
            or not all(isinstance(d, int) for d in (*x.shape, *n.shape))):
        return None
    N, C = x.shape[:2]
    O, kernel, nsp = w.shape[0], w.shape[2:], x.ndim - 2
    K, P = C * math.prod(kernel), math.prod(n.shape[2:])
    memory = affine_view(x, lambda m: m.op not in MOVEMENT)
    macs = O * K * P
    # A run-time filter would be a B with strided columns (a copy); P = 1 (a 1x1 image) is an im2col [K, 1]
    # that conv_to_matmul reads in place already.
    if (C == 1 or P == 1 or macs < min_macs or not is_folded_constant(w) or memory is None
            or memory.strides[1] != 1):
        return None
    last = T.permute(x, (0, *range(2, 2 + nsp), 1))  # [N, *S, C]
    win = T.window(last, range(1, 1 + nsp), kernel, arg.strides, arg.dilations)  # [N, *OS, C, *K]
    patches = T.reshape(T.permute(win, (0, *range(1, 1 + nsp), *range(2 + nsp, 2 + 2 * nsp), 1 + nsp)), (N, P, K))
    if affine_view(patches, lambda m: m is memory.base) is None:
        return None
    wt = T.permute(T.reshape(T.permute(w, (0, *range(2, 2 + nsp), 1)), (O, K)), (1, 0))  # [K, O], K as (*kernel, C)
    mm = UOp(Ops.MATMUL, n.dtype, (patches, T.expand(T.reshape(wt, (1, K, O)), (N, K, O))))
    return T.reshape(T.permute(mm, (0, 2, 1)), n.shape)


def conv_to_row_matmuls(n: UOp, min_macs: int) -> UOp | None:
    """A convolution of one image (N = 1, one group) over run-time spatial sizes (passes/dynamic.py) as one
    GEMM per output row: MATMUL(W [OH, O, K] (one matrix, broadcast), im2col(x) [OH, K, OW]) -> [OH, O, OW],
    permuted to [1, O, OH, OW]. Its run-time OH is the GEMM's outermost batch axis and OW its N, the
    run-time sizes the GEMM kernels take (lower_gemm.py); the im2col of conv_to_matmul would merge them.
    A 1D convolution is one of height 1: a single GEMM whose N is the run-time length (not a GEMV per position)."""
    x, w = n.src
    arg: ConvArg = n.arg
    if n.dtype is dtypes.float32 and x.ndim == 3 and x.shape[0] == 1 and arg.groups == 1:
        arg2 = ConvArg((1, *arg.strides), (1, *arg.dilations), ((0, 0), *arg.pads), 1)
        x2, w2 = T.reshape(x, (1, x.shape[1], 1, x.shape[2])), T.reshape(w, (*w.shape[:2], 1, w.shape[2]))
        rows = conv_to_row_matmuls(UOp(Ops.CONV, n.dtype, (x2, w2), arg2), min_macs)
        return None if rows is None else T.reshape(rows, n.shape)
    if n.dtype is not dtypes.float32 or x.ndim != 4 or x.shape[0] != 1 or arg.groups != 1:
        return None
    C, O, kernel = x.shape[1], w.shape[0], w.shape[2:]
    K = C * math.prod(kernel)
    oh, ow = n.shape[2:]
    if O * K * oh * ow < min_macs:
        return None
    xp = T.pad(x, [(0, 0), (0, 0), *arg.pads])
    win = T.window(xp, range(2, 4), kernel, arg.strides, arg.dilations)  # [1, C, OH, OW, KH, KW]
    col = T.reshape(T.permute(T.reshape(win, win.shape[1:]), (1, 0, 3, 4, 2)), (oh, K, ow))  # [OH, C, KH, KW, OW]
    w2 = T.expand(T.reshape(w, (1, O, K)), (oh, O, K))
    rows = UOp(Ops.MATMUL, n.dtype, (w2, col))  # [OH, O, OW]
    return T.reshape(T.permute(rows, (1, 0, 2)), n.shape)


def collapse_splat_operand(n: UOp) -> UOp | None:
    """MATMUL(splat a, b) = every row equal to MATMUL(a's first row, b), broadcast over M (and the
    same for a splat b over N). The collapsed splat is a [1, K] (or [K, 1]) constant the GEMM packs."""
    a, b = n.src
    *batch, m, k = a.shape
    sa, sb = splat_value(a), splat_value(b)
    if sa is not None and m > 1:
        row = T.const(sa.arg, a.dtype, (*batch, 1, k))
        return T.expand(UOp(Ops.MATMUL, n.dtype, (row, b)), n.shape)
    if sb is not None and b.shape[-1] > 1:
        column = T.const(sb.arg, b.dtype, (*batch, k, 1))
        return T.expand(UOp(Ops.MATMUL, n.dtype, (a, column)), n.shape)
    return None


def minus_zero(x: UOp, zero: int) -> UOp:
    """CAST(x, int32) - zero (the form passes/lower_gemm_int8.int8_activation recognizes)."""
    xi = x.cast(dtypes.int32)
    return T.alu(Ops.SUB, xi, T.scalar_like(xi, zero)) if zero else xi


def transpose_int8_matmul(n: UOp) -> UOp | None:
    """An int32 MATMUL(x - x_zero, W') of 8-bit activations and a constant W' (MatMulInteger,
    QLinearMatMul, QGemm) as (W'^T (x - x_zero)^T)^T: the integer GEMM's rows are its constant."""
    a, b = n.src
    act = int8_activation(a)
    if n.dtype is not dtypes.int32 or act is None or a.ndim != b.ndim or is_folded_constant(a):
        return None
    if int8_values(b) is None:  # evaluates b: last
        return None
    perm = (*range(a.ndim - 2), a.ndim - 1, a.ndim - 2)
    at = minus_zero(T.permute(act.value, perm), act.zero)
    return T.permute(UOp(Ops.MATMUL, n.dtype, (T.permute(b, perm), at)), perm)


def pm_conv_to_matmul(policy: OptimizationPolicy) -> PatternMatcher:
    """Splat operands of MATMULs collapsed, and with the conv_to_matmul step, convolutions as MATMULs
    (those under policy.gemm_min_macs stay on the generic path); with the int8_gemm step, integer
    products of 8-bit operands in the integer GEMM's orientation (passes/lower_gemm_int8.py)."""
    rules = [(UPat(Ops.MATMUL, name="n"), collapse_splat_operand)]
    int8 = policy.int8_gemm and policy.gemm
    if int8:
        rules.append((UPat(Ops.MATMUL, name="n"), transpose_int8_matmul))
    if policy.conv_to_matmul:
        rules.append((UPat(Ops.CONV, name="n"), lambda n: channels_last_conv_to_matmul(n, policy.gemm_min_macs)))
        rules.append((UPat(Ops.CONV, name="n"), lambda n: conv_to_matmul(n, policy.gemm_min_macs, int8)))
    return PatternMatcher(rules, name="conv_to_matmul")
