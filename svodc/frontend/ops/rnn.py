"""Recurrent layers (RNN, GRU, LSTM) over the sequence length known at compile time.

Per direction: the input projection X W^T + biases is one matmul over all time steps; each step
adds H R^T and applies the cell. The steps are a step loop (ops.STEP_LOOP: the cell built once,
compiled once and run once per step by the entry, passes/steploop.py), or with
CompileOptions.step_loops off (GPU variants) unrolled: each step's states are then realized
(NodeContext.realize), so a step reads the previous step's stored states and its kernels stay the
same size. Sequence lengths (run
time) mask the state update and zero the output past each batch entry's end; the reverse direction
runs forward over each sequence reversed within its length (ReverseSequence), then reverses its
outputs back, as the ONNX reference does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import GatherArg, Ops, StepInArg, StepLoopArg
from svodc.ir.uop import UOp

Act = Callable[[UOp], UOp]


def _c(x: UOp, v: float) -> UOp:
    return T.const(v, x.dtype, x.shape)


def _sigmoid(x: UOp) -> UOp:
    return T.alu(Ops.RECIP, T.alu(Ops.ADD, _c(x, 1.0), UOp(Ops.EXP, x.dtype, (UOp(Ops.NEG, x.dtype, (x,)),))))


def _tanh(x: UOp) -> UOp:
    return UOp(Ops.TANH, x.dtype, (x,))


def activation(name: str, alpha: float | None, beta: float | None) -> Act:
    """The ONNX RNN activation functions (names are case-insensitive in practice)."""
    n = name.lower()
    if n == "sigmoid":
        return _sigmoid
    if n == "tanh":
        return _tanh
    if n == "relu":
        return lambda x: T.alu(Ops.MAX, x, _c(x, 0.0))
    if n == "affine":
        return lambda x: T.alu(Ops.ADD, T.alu(Ops.MUL, x, _c(x, alpha or 1.0)), _c(x, beta or 0.0))
    if n == "leakyrelu":
        a = 0.01 if alpha is None else alpha
        return lambda x: T.alu(Ops.WHERE, T.alu(Ops.CMPLT, x, _c(x, 0.0)), T.alu(Ops.MUL, x, _c(x, a)), x)
    if n == "thresholdedrelu":
        a = 1.0 if alpha is None else alpha
        return lambda x: T.alu(Ops.WHERE, T.alu(Ops.CMPLT, _c(x, a), x), x, _c(x, 0.0))
    if n == "scaledtanh":
        return lambda x: T.alu(Ops.MUL, _c(x, alpha or 1.0), _tanh(T.alu(Ops.MUL, x, _c(x, beta or 1.0))))
    if n == "hardsigmoid":
        a, b = (0.2 if alpha is None else alpha), (0.5 if beta is None else beta)
        return lambda x: T.alu(Ops.MIN, T.alu(Ops.MAX, T.alu(Ops.ADD, T.alu(Ops.MUL, x, _c(x, a)), _c(x, b)),
                                              _c(x, 0.0)), _c(x, 1.0))
    if n == "elu":
        a = 1.0 if alpha is None else alpha
        return lambda x: T.alu(Ops.WHERE, T.alu(Ops.CMPLT, x, _c(x, 0.0)),
                               T.alu(Ops.MUL, _c(x, a), T.alu(Ops.SUB, UOp(Ops.EXP, x.dtype, (x,)), _c(x, 1.0))), x)
    if n == "softsign":
        return lambda x: T.alu(Ops.DIV, x, T.alu(Ops.ADD, _c(x, 1.0), UOp(Ops.ABS, x.dtype, (x,))))
    if n == "softplus":
        return lambda x: UOp(Ops.LOG, x.dtype, (T.alu(Ops.ADD, UOp(Ops.EXP, x.dtype, (x,)), _c(x, 1.0)),))
    raise Unsupported(f"activation {name!r} is not supported")


class Layer:
    """What every recurrent op shares: inputs in [seq, batch, ...] layout, per-direction weights,
    activations, clipping and sequence lengths."""

    # The steps as a step loop (CompileOptions.step_loops) rather than unrolled; a subclass whose cell the
    # step loop does not take yet says False.
    step_loop = True

    def __init__(self, ctx: NodeContext, gates: int, defaults: list[str]):
        self.ctx = ctx
        x = ctx.input(0)
        if x.ndim != 3:
            raise Unsupported(f"input X must have rank 3, got shape {x.shape}")
        self.layout = int(ctx.attr("layout", 0))
        self.x = T.permute(x, (1, 0, 2)) if self.layout else x  # [seq, batch, input]
        self.seq, self.batch, _ = self.x.shape
        self.hidden = int(ctx.attr("hidden_size"))
        direction = ctx.attr("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise Unsupported(f"direction={direction!r} is not a valid value")
        self.directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
        self.gates = gates
        self.w, self.r = ctx.input(1), ctx.input(2)
        self.b = ctx.optional_input(3)
        lens = ctx.optional_input(4)
        self.lens = None if lens is None else lens.cast(dtypes.int64)
        self.clip = ctx.attr("clip")
        names = ctx.attr("activations") or defaults * len(self.directions)
        alphas, betas = list(ctx.attr("activation_alpha") or []), list(ctx.attr("activation_beta") or [])
        self.acts: list[Act] = []
        for name in names:
            takes = name.lower() in ("affine", "leakyrelu", "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu")
            two = name.lower() in ("affine", "scaledtanh", "hardsigmoid")
            a = alphas.pop(0) if takes and alphas else None
            b = betas.pop(0) if two and betas else None
            self.acts.append(activation(name, a, b))
        self.per_dir = len(defaults)

    def initial(self, i: int, d: int) -> UOp:
        v = self.ctx.optional_input(i)
        if v is None:
            return T.const(0.0, self.x.dtype, (self.batch, self.hidden))
        if self.layout:
            v = T.permute(v, (1, 0, 2))
        return T.reshape(T.shrink(v, [(d, d + 1), (0, self.batch), (0, self.hidden)]), (self.batch, self.hidden))

    def weights(self, d: int) -> tuple[UOp, UOp, UOp, UOp]:
        """W^T [input, G*h], R^T [h, G*h] and the biases Wb, Rb [G*h] of direction d."""
        g = self.gates * self.hidden
        w = T.reshape(T.shrink(self.w, [(d, d + 1), (0, g), (0, self.w.shape[2])]), (g, self.w.shape[2]))
        r = T.reshape(T.shrink(self.r, [(d, d + 1), (0, g), (0, self.hidden)]), (g, self.hidden))
        if self.b is None:
            wb = rb = T.const(0.0, self.x.dtype, (g,))
        else:
            bd = T.reshape(T.shrink(self.b, [(d, d + 1), (0, 2 * g)]), (2 * g,))
            wb, rb = T.shrink(bd, [(0, g)]), T.shrink(bd, [(g, 2 * g)])
        return T.permute(w, (1, 0)), T.permute(r, (1, 0)), wb, rb

    def project(self, a: UOp, weight) -> UOp:
        """a @ weight, for the input and recurrent projections (a quantized layer overrides it)."""
        return T.matmul(a, weight)

    def gate(self, z: UOp, k: int) -> UOp:
        """Gate k of a [batch, G*h] pre-activation, clipped when the op asks."""
        g = T.shrink(z, [(0, self.batch), (k * self.hidden, (k + 1) * self.hidden)])
        if self.clip is not None:
            g = T.alu(Ops.MIN, T.alu(Ops.MAX, g, _c(g, -self.clip)), _c(g, self.clip))
        return g

    def reversed_in_length(self, x: UOp) -> UOp:
        """x [seq, batch, ...] reversed along seq within each batch entry's length."""
        n = self.seq
        if self.lens is None:
            return T.slice_axes(x, [n - 1] + [0] * (x.ndim - 1), [-1] + [1] * (x.ndim - 1), x.shape)
        t = T.reshape(_iota(n), (n, 1))
        length = T.reshape(self.lens, (1, self.batch))
        rev = T.alu(Ops.SUB, T.alu(Ops.SUB, length, T.const(1, dtypes.int64)), t)
        idx = T.alu(Ops.WHERE, T.alu(Ops.CMPLT, t, length), rev, T.broadcast_to(t, rev.shape))
        idx = T.broadcast_to(T.reshape(idx, (n, self.batch) + (1,) * (x.ndim - 2)), x.shape)
        return UOp(Ops.GATHER, x.dtype, (x, idx), GatherArg(0))

    def run(self, cell, states: list[UOp], d: int, rb_in_cell: bool = False) -> tuple[UOp, list[UOp]]:
        """Run `cell(xw_t, states, R^T, Rb, acts) -> (h, new states)` over the sequence in direction d
        (h is new states[0]); each step's states are realized (a kernel boundary per step);
        returns Y [seq, batch, h] and the final states. xw_t holds X_t W^T + Wb, plus Rb unless the
        cell adds Rb itself (GRU with linear_before_reset)."""
        wt, rt, wb, rb = self.weights(d)
        x = self.reversed_in_length(self.x) if self.directions[d] == "reverse" else self.x
        g = self.gates * self.hidden
        xw = T.reshape(self.project(T.reshape(x, (self.seq * self.batch, x.shape[2])), wt), (self.seq, self.batch, g))
        bias = wb if rb_in_cell else T.alu(Ops.ADD, wb, rb)
        xw = T.alu(Ops.ADD, xw, T.reshape(bias, (1, 1, g)))
        acts = self.acts[d * self.per_dir:(d + 1) * self.per_dir]
        if self.step_loop and self.ctx.step_loops and not self.ctx.has_bounded_dims:
            y, states = self._loop(cell, states, xw, T.reshape(rb, (1, g)), rt, acts, d)
            return (self.reversed_in_length(y) if self.directions[d] == "reverse" else y), states
        ys = []
        for t in range(self.seq):
            xt = T.reshape(T.shrink(xw, [(t, t + 1), (0, self.batch), (0, g)]), xw.shape[1:])
            h, new = cell(xt, states, rt, T.reshape(rb, (1, g)), acts)
            if self.lens is not None:
                valid = T.broadcast_to(T.reshape(T.alu(Ops.CMPLT, T.const(t, dtypes.int64, (self.batch,)), self.lens),
                                                 (self.batch, 1)), h.shape)
                new = [T.alu(Ops.WHERE, valid, n, o) for n, o in zip(new, states, strict=True)]
                h = T.alu(Ops.WHERE, valid, new[0], _c(h, 0.0))  # the stored state, where the step is valid
            else:
                h = new[0]
            for st in new:  # every later step reads the states: stored, not recomputed from step 0 on
                self.ctx.realize(st)
            states = new
            ys.append(h)
        y = T.concat([T.reshape(h, (1, *h.shape)) for h in ys], 0)
        if self.directions[d] == "reverse":
            y = self.reversed_in_length(y)
        return y, states

    def _loop(self, cell, states: list[UOp], xw: UOp, rb: UOp, rt: UOp, acts: list[Act], d: int
              ) -> tuple[UOp, list[UOp]]:
        """The steps as one STEP_LOOP (ops.StepLoopArg): the cell is built once over STEP_IN leaves (x_t, the
        step's validity per batch entry, the previous states); Y and the final states are views of the
        loop's state history [seq + 1, states, batch, h], Y zeroed past each batch entry's length."""
        n, b, h, s = self.seq, self.batch, self.hidden, len(states)
        sources = [xw]
        valid = None
        if self.lens is not None:  # [seq, batch]: step t is valid for entry b while t < lens[b]
            t = T.broadcast_to(T.reshape(_iota(n), (n, 1)), (n, b))
            valid = T.alu(Ops.CMPLT, t, T.broadcast_to(T.reshape(self.lens, (1, b)), (n, b)))
            sources.append(valid)
        where = f"{','.join(self.ctx.node.output)}:{d}"
        xt = UOp(Ops.STEP_IN, xw.dtype, (), StepInArg("step", 0, xw.shape[1:], where))
        prev = [UOp(Ops.STEP_IN, xw.dtype, (), StepInArg("state", k, (b, h), where)) for k in range(s)]
        _, new = cell(xt, prev, rt, rb, acts)
        if valid is not None:
            valid_t = UOp(Ops.STEP_IN, dtypes.bool, (), StepInArg("step", 1, (b,), where))
            ok = T.broadcast_to(T.reshape(valid_t, (b, 1)), (b, h))
            new = [T.alu(Ops.WHERE, ok, v, o) for v, o in zip(new, prev, strict=True)]
        init = T.concat([T.reshape(v, (1, b, h)) for v in states], 0)
        hist = UOp(Ops.STEP_LOOP, xw.dtype, (init, *sources, *new), StepLoopArg(n, len(sources)))
        finals = [T.reshape(T.shrink(hist, [(n, n + 1), (k, k + 1), (0, b), (0, h)]), (b, h)) for k in range(s)]
        y = T.reshape(T.shrink(hist, [(1, n + 1), (0, 1), (0, b), (0, h)]), (n, b, h))
        if valid is not None:
            y = T.alu(Ops.WHERE, T.broadcast_to(T.reshape(valid, (n, b, 1)), y.shape), y, _c(y, 0.0))
        return y, finals

    def outputs(self, ys: list[UOp], finals: list[list[UOp]]) -> list[UOp | None]:
        """Y, then one [dirs, batch, h] output per state, in the op's layout."""
        y = T.concat([T.reshape(v, (self.seq, 1, self.batch, self.hidden)) for v in ys], 1)
        if self.layout:
            y = T.permute(y, (2, 0, 1, 3))
        outs: list[UOp | None] = [y]
        for k in range(len(finals[0])):
            s = T.concat([T.reshape(f[k], (1, self.batch, self.hidden)) for f in finals], 0)
            outs.append(T.permute(s, (1, 0, 2)) if self.layout else s)
        return outs


def _iota(n: int) -> UOp:
    from svodc.frontend.ops.shape_ops import weight

    return weight(np.arange(n, dtype=np.int64))


@onnx_op("RNN", 1, 7, 14, 22)
def rnn(ctx: NodeContext) -> list[UOp | None]:
    layer = Layer(ctx, 1, ["Tanh"])

    def cell(xt, states, rt, _rb, acts):
        h = acts[0](layer.gate(T.alu(Ops.ADD, xt, T.matmul(states[0], rt)), 0))
        return h, [h]

    ys, finals = [], []
    for d in range(len(layer.directions)):
        y, st = layer.run(cell, [layer.initial(5, d)], d)
        ys.append(y)
        finals.append(st)
    return layer.outputs(ys, finals)


@onnx_op("GRU", 1, 3, 7, 14, 22)
def gru(ctx: NodeContext) -> list[UOp | None]:
    layer = Layer(ctx, 3, ["Sigmoid", "Tanh"])
    before_reset = bool(ctx.attr("linear_before_reset", 0))

    def cell(xt, states, rt, rb, acts):
        f, g = acts
        (h_prev,) = states
        h, b = layer.hidden, layer.batch
        rz = T.shrink(rt, [(0, h), (0, 2 * h)])
        rh = T.shrink(rt, [(0, h), (2 * h, 3 * h)])
        pre_zr = T.alu(Ops.ADD, T.shrink(xt, [(0, b), (0, 2 * h)]), T.matmul(h_prev, rz))
        if before_reset:  # Rb is not in xt: z and r add theirs here, h inside the reset product
            pre_zr = T.alu(Ops.ADD, pre_zr, T.shrink(rb, [(0, 1), (0, 2 * h)]))
        z, r = f(layer.gate(pre_zr, 0)), f(layer.gate(pre_zr, 1))
        xh = T.shrink(xt, [(0, b), (2 * h, 3 * h)])
        if before_reset:
            rbh = T.shrink(rb, [(0, 1), (2 * h, 3 * h)])
            hh = T.alu(Ops.ADD, xh, T.alu(Ops.MUL, r, T.alu(Ops.ADD, T.matmul(h_prev, rh), rbh)))
        else:
            hh = T.alu(Ops.ADD, xh, T.matmul(T.alu(Ops.MUL, r, h_prev), rh))
        cand = g(layer.gate(hh, 0))
        new = T.alu(Ops.ADD, T.alu(Ops.MUL, T.alu(Ops.SUB, _c(z, 1.0), z), cand), T.alu(Ops.MUL, z, h_prev))
        return new, [new]

    ys, finals = [], []
    for d in range(len(layer.directions)):
        y, st = layer.run(cell, [layer.initial(5, d)], d, rb_in_cell=before_reset)
        ys.append(y)
        finals.append(st)
    return layer.outputs(ys, finals)


LSTM_ACTIVATIONS = ["Sigmoid", "Tanh", "Tanh"]


@onnx_op("LSTM", 1, 7, 14, 22)
def lstm(ctx: NodeContext) -> list[UOp | None]:
    return lstm_layers(ctx, Layer(ctx, 4, LSTM_ACTIVATIONS))


def lstm_layers(ctx: NodeContext, layer: Layer) -> list[UOp | None]:
    """LSTM over `layer`'s directions: Y, Y_h, Y_c."""
    peep = ctx.optional_input(7)
    couple = bool(ctx.attr("input_forget", 0))

    def cell_for(d: int):
        h = layer.hidden
        p = None if peep is None else T.reshape(T.shrink(peep, [(d, d + 1), (0, 3 * h)]), (3 * h,))

        def peephole(k: int, c: UOp) -> UOp | None:
            if p is None:
                return None
            return T.alu(Ops.MUL, T.reshape(T.shrink(p, [(k * h, (k + 1) * h)]), (1, h)), c)

        def cell(xt, states, rt, _rb, acts):
            f, g, hact = acts
            h_prev, c_prev = states
            z = T.alu(Ops.ADD, xt, layer.project(h_prev, rt))
            zi, zo, zf, zc = (layer.gate(z, k) for k in range(4))
            if p is not None:
                zi = T.alu(Ops.ADD, zi, peephole(0, c_prev))
                zf = T.alu(Ops.ADD, zf, peephole(2, c_prev))
            i = f(zi)
            fg = T.alu(Ops.SUB, _c(i, 1.0), i) if couple else f(zf)
            c = T.alu(Ops.ADD, T.alu(Ops.MUL, fg, c_prev), T.alu(Ops.MUL, i, g(zc)))
            if p is not None:
                zo = T.alu(Ops.ADD, zo, peephole(1, c))
            o = f(zo)
            new_h = T.alu(Ops.MUL, o, hact(c))
            return new_h, [new_h, c]
        return cell

    ys, finals = [], []
    for d in range(len(layer.directions)):
        y, st = layer.run(cell_for(d), [layer.initial(5, d), layer.initial(6, d)], d)
        ys.append(y)
        finals.append(st)
    return layer.outputs(ys, finals)
