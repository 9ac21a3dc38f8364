"""Winograd convolution F(m x m, 3 x 3) for 3x3, stride 1, dilation 1, ungrouped float32 convolutions with a
constant filter (the `winograd` step of svodc/policy.py).

An output tile of m x m pixels needs the (m+2) x (m+2) input tile d that covers it: Y = A^T [(G g G^T) * (B^T d B)] A,
with * elementwise over the t x t = (m+2)^2 transformed positions. Summed over input channels that is, per
transformed position (xi, nu), one matrix product: M[xi nu] = U[xi nu] @ V[xi nu], U = G g G^T as [t*t, O, C]
(computed here, at compile time: a constant operand the GEMM packs) and V = B^T d B as [t*t, C, tiles]. So the
convolution becomes
  input transform  V: t*t loop nests (one per (xi, nu), split.py cuts the concatenation), each a sum of the few
                   input taps its row of B^T (x) B^T does not zero, over a window view of the padded input;
  one batched MATMUL (a contraction kernel of t*t GEMMs, K = C, N = tiles);
  output transform Y = A^T M A: m*m loop nests, each a sum of M planes, written into the output's tile layout
                   [N, O, TH, m, TW, m] (a reshape of [N, O, TH*m, TW*m], so the kernel iterates it without
                   div/mod; an odd OH or OW is a last row or column of tiles cut off by a slice view).
The elementwise chain the convolution alone feeds (bias, BatchNormalization's shift, activation, residual add) is
moved below that reshape (`rewrite_graph`), so it runs in the output transform's loops, and the chain's top is
realized in tile layout: the output is written once, by the kernel that computes it, and read through views.

Multiplies per output pixel and channel pair: 9 direct, t*t / (m*m) = 4 with F(2x2, 3x3). The transforms cost
O(C) and O(O) per tile, not O(C * O), so they pay where C and O are large (the policy's thresholds).
Only F(2x2, 3x3) is built: its transforms have coefficients 0 and +-1 (exact in float32; the error is that of
a different summation order), while F(4x4, 3x3)'s coefficients up to 8 raise the error about 15x (one 128-channel
layer in float32 against float64: 4e-6 of max|y|, F(2x2) 2.4e-7, the direct sum 3e-7), and its 36 transformed
positions would be 36 loop nests, past split.py's MAX_PIECES.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.interpret import evaluate
from svodc.ir.ops import ALU, ConvArg, Ops
from svodc.ir.provenance import Provenance
from svodc.ir.uop import UOp
from svodc.passes.fold import broadcast_weight, is_folded_constant, splat_value
from svodc.policy import OptimizationPolicy

# F(2x2, 3x3) (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2015).
TILE = 2  # output pixels per tile side (m)
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)  # t x t
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)  # t x 3
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)  # m x t


def applies(n: UOp, policy: OptimizationPolicy) -> bool:
    """The gate: a 3x3 stride-1 dense float32 convolution of a constant, non-splat filter with at least the
    policy's input and output channels, output tiles and multiply-adds (a product the GEMM kernels take)."""
    if n.op is not Ops.CONV or n.dtype is not dtypes.float32 or n.ndim != 4:
        return False
    x, w = n.src
    arg: ConvArg = n.arg
    if (arg.groups != 1 or w.shape[2:] != (3, 3) or arg.strides != (1, 1) or arg.dilations != (1, 1)
            or not is_folded_constant(w) or splat_value(w) is not None):
        return False  # a splat filter is cheaper still as a collapsed MATMUL (contraction.py)
    oh, ow = n.shape[2:]
    c, o = x.shape[1], w.shape[0]
    tiles = x.shape[0] * -(-oh // TILE) * -(-ow // TILE)
    macs = BT.size * c * o * tiles  # the batched GEMM's, which must be a GEMM kernel (decompose.gemm_eligible)
    # C >= parallel_min: the input transform's parallel loop is then over channels alone, and split.py can cut
    # its position axis into 16 loop nests (a parallel loop merged with it would hide the concatenation).
    return (c >= max(policy.winograd_min_in_channels, policy.parallel_min) and o >= policy.winograd_min_out_channels
            and tiles >= policy.winograd_tiles and macs >= max(policy.winograd_min_macs, policy.gemm_min_macs))


def filter_transform(w: np.ndarray) -> np.ndarray:
    """U = G g G^T per (output, input) channel, as [t*t, O, C] float32 (computed in float64)."""
    if not np.isfinite(w).all():  # 0 * inf is NaN in einsum's sums: see filter_transform64
        return _filter_transform_einsum(w).astype(np.float32)
    return filter_transform64(w, np.float32)


def filter_transform64(w: np.ndarray, out_dtype: type = np.float64) -> np.ndarray:
    """The float64 bits of np.einsum("ak,ockl,bl->aboc", G, w, G) for a finite float32 filter, 7x faster (0.1 s
    for a 512 x 512 filter by einsum), rounded to out_dtype. G's entries are 0, +-1/2 and 1, so every product
    G[a,k] * w[k,l] * G[b,l] is exact in float64 and only the order of the sums decides the result: einsum adds
    the nine products into one accumulator from +0, k outer and l inner, and so does this loop. A zero
    coefficient's product adds +-0, which changes no sum of finite numbers (an accumulator that starts at +0
    is never -0), so it is skipped."""
    t = G.shape[0]
    o, c = w.shape[:2]
    taps = np.ascontiguousarray(w.reshape(o * c, 9).T, dtype=np.float64)  # [3*k + l, O*C]
    out = np.empty((t * t, o * c), out_dtype)
    acc, term = np.empty(o * c), np.empty(o * c)
    for a in range(t):
        for b in range(t):
            acc.fill(0.0)
            for k in range(3):
                for j in range(3):
                    if coef := G[a, k] * G[b, j]:
                        np.multiply(taps[3 * k + j], coef, out=term)
                        acc += term
            out[a * t + b] = acc
    return out.reshape(t * t, o, c)


def _filter_transform_einsum(w: np.ndarray) -> np.ndarray:
    """[t*t, O, C] float64."""
    u = np.einsum("ak,ockl,bl->aboc", G, w.astype(np.float64), G)
    t = G.shape[0]
    return u.reshape(t * t, *w.shape[:2])


def _combination(terms: list[tuple[float, UOp]]) -> UOp:
    """sum of coefficient * term, coefficients +-1 as adds and subtracts."""
    out: UOp | None = None
    for coef, x in terms:
        if coef not in (1.0, -1.0):
            x = T.alu(Ops.MUL, x, T.const(float(abs(coef)), x.dtype, x.shape))
        if out is None:
            out = x if coef > 0 else T.alu(Ops.NEG, x)
        else:
            out = T.alu(Ops.ADD if coef > 0 else Ops.SUB, out, x)
    assert out is not None
    return out


def winograd_conv(n: UOp) -> tuple[UOp, UOp]:
    """(Y, E): the convolution as input transform -> batched MATMUL -> output transform. E is the output in tile
    layout [N, O, TH, m, TW, m]; Y = from_tiles(E) has the convolution's shape."""
    x, w = n.src
    arg: ConvArg = n.arg
    N, C = x.shape[:2]
    O = w.shape[0]
    oh, ow = n.shape[2:]
    m, t = TILE, BT.shape[0]
    th, tw = -(-oh // m), -(-ow // m)
    (top, bottom), (left, right) = arg.pads  # zeros past the end complete the last row and column of tiles
    xp = T.pad(x, [(0, 0), (0, 0), (top, bottom + th * m - oh), (left, right + tw * m - ow)])
    win = T.window(xp, (2, 3), (t, t), (m, m), (1, 1))  # [N, C, th, tw, t, t]

    def tap(i: int, j: int) -> UOp:  # input pixel (i, j) of every tile, as [C, N, th, tw]
        one = T.shrink(win, [(0, N), (0, C), (0, th), (0, tw), (i, i + 1), (j, j + 1)])
        return T.permute(T.reshape(one, (N, C, th, tw)), (1, 0, 2, 3))

    # One concatenation along one axis (a nested one would realize its inner pieces: a PAD consumer counts as
    # reuse in schedule.py), laid out [C, t*t, tiles] so the kernel's parallel loop is over channels and the
    # position axis stays a loop that split.py cuts into t*t nests.
    pieces = [T.reshape(_combination([(BT[xi, i] * BT[nu, j], tap(i, j)) for i in range(t) for j in range(t)
                                      if BT[xi, i] * BT[nu, j]]), (C, 1, N, th, tw))
              for xi in range(t) for nu in range(t)]
    # [t*t, C, tiles]: a strided view, columns contiguous
    v = T.permute(T.reshape(T.concat(pieces, 1), (C, t * t, N * th * tw)), (1, 0, 2))
    u = broadcast_weight(dtypes.float32, filter_transform(evaluate([w])[0]))
    prod = T.reshape(UOp(Ops.MATMUL, dtypes.float32, (u, v)), (t, t, O, N, th, tw))

    def plane(xi: int, nu: int) -> UOp:  # M[xi nu] as [N, O, th, tw]
        one = T.shrink(prod, [(xi, xi + 1), (nu, nu + 1), (0, O), (0, N), (0, th), (0, tw)])
        return T.permute(T.reshape(one, (O, N, th, tw)), (1, 0, 2, 3))

    out_rows = []
    for a in range(m):
        out_cols = []
        for b in range(m):
            terms = [(AT[a, xi] * AT[b, nu], plane(xi, nu)) for xi in range(t) for nu in range(t)
                     if AT[a, xi] * AT[b, nu]]
            out_cols.append(T.reshape(_combination(terms), (N, O, th, 1, tw, 1)))
        out_rows.append(T.concat(out_cols, 5))
    e = T.concat(out_rows, 3)  # [N, O, th, m, tw, m]
    return from_tiles(e, n.shape), e


def from_tiles(e: UOp, shape: tuple[int, ...]) -> UOp:
    """A tensor of `shape` [N, O, OH, OW] from its tile layout [N, O, TH, m, TW, m] (whole tiles: OH <= TH * m)."""
    n, o, th, m, tw, _ = e.shape
    return T.shrink(T.reshape(e, (n, o, th * m, tw * m)), [(0, n), (0, o), (0, shape[2]), (0, shape[3])])


def to_tiles(x: UOp, tile_shape: tuple[int, ...]) -> UOp:
    """x [N, O, OH, OW] in tile layout (zeros past its end), the inverse of from_tiles on the valid pixels."""
    _, _, th, m, tw, _ = tile_shape
    padded = T.pad(x, [(0, 0), (0, 0), (0, th * m - x.shape[2]), (0, tw * m - x.shape[3])])
    return T.reshape(padded, tile_shape)


def _elementwise_over(n: UOp, shape: tuple[int, ...]) -> bool:
    return (n.op in ALU and n.dtype is dtypes.float32 and n.shape == shape
            and all(s.shape == shape for s in n.src))


def rewrite_graph(sink: UOp, policy: OptimizationPolicy, prov: Provenance) -> UOp:
    """Every convolution the gate admits as Winograd, with the elementwise chain it alone feeds sunk into the
    output transform's tile layout. One walk in topological order, rebuilding the graph (`new`)."""
    consumers: dict[UOp, int] = defaultdict(int)
    nodes = sink.toposort()
    for nd in nodes:
        for s in nd.src:
            consumers[s] += 1
    new: dict[UOp, UOp] = {}
    tiled: dict[UOp, UOp] = {}  # original node -> its value in tile layout (new[node] is from_tiles of it)
    sunk: set[UOp] = set()  # those of tiled that a sunk consumer took over
    for nd in nodes:
        if applies(nd, policy):
            y, e = winograd_conv(nd.replace(src=tuple(new[s] for s in nd.src)))
            _tag_new(prov, nd, y)
            new[nd], tiled[nd] = y, e
            continue
        if _elementwise_over(nd, nd.shape) and any(s in tiled and consumers[s] == 1 for s in nd.src):
            tile_shape = next(tiled[s].shape for s in nd.src if s in tiled and consumers[s] == 1)
            srcs = tuple(tiled[s] if s in tiled and consumers[s] == 1 else to_tiles(new[s], tile_shape)
                         for s in nd.src)
            e = nd.replace(src=srcs)
            prov.inherit(e, nd)
            tiled[nd], new[nd] = e, from_tiles(e, nd.shape)
            prov.inherit(new[nd], nd)
            sunk.update(s for s in nd.src if s in tiled and consumers[s] == 1)
            continue
        srcs = tuple(new[s] for s in nd.src)
        new[nd] = nd if all(a is b for a, b in zip(srcs, nd.src, strict=True)) else nd.replace(src=srcs)
        if new[nd] is not nd:
            prov.inherit(new[nd], nd)
    # The top of each chain is realized in tile layout: its consumers then read it through a reshape and a slice
    # (an affine view) instead of evaluating the output transform's selects per element, with div/mod.
    for nd, e in tiled.items():
        if nd not in sunk:
            prov.ask_realize(e)
    return new[sink]


def _tag_new(prov: Provenance, conv: UOp, y: UOp) -> None:
    """The nodes of the Winograd form are named after the convolution (and what was folded into it)."""
    prov.tag_new([y], conv.src, prov.get(conv))
    prov.inherit(y, conv)
