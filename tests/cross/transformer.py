"""A small GPT-style decoder built from the ops svodc supports today (MatMul, Add, Sub, Mul, Div, Sqrt,
Softmax, Reshape, Transpose, Tanh), with seeded random weights: a second, smaller transformer for the
cross tier besides ../shared/models/gpt2_small_random (it came first, when gpt2's LayerNormalization,
Split, Range and Gather were not supported yet, and stays because it runs in seconds).

Per layer: pre-LayerNorm (mean and variance as a MatMul with a constant 1/d matrix: no ReduceMean
needed), causal multi-head self-attention (QK^T, scale, additive mask, Softmax, V), output
projection, residual; pre-LayerNorm MLP with tanh-GELU, residual. A final LayerNorm and a vocabulary
projection give the logits.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tests.onnx_util import make_model

SEQ, D, HEADS, FF, VOCAB, LAYERS = 16, 64, 4, 128, 256, 2


def transformer_model(seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model and its input `x` [1, SEQ, D] (token embeddings)."""
    rng = np.random.default_rng(seed)
    inits: dict[str, np.ndarray] = {}
    nodes: list[onnx.NodeProto] = []
    hd = D // HEADS

    def const(name: str, value: np.ndarray) -> str:
        inits[name] = value.astype(np.float32)
        return name

    def weight(name: str, *shape: int) -> str:
        return const(name, rng.standard_normal(shape) / np.sqrt(shape[0]))

    def node(op: str, ins: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    avg = const("avg", np.full((D, D), 1.0 / D))
    eps = const("eps", np.array(1e-5))
    const("scale", np.array(1.0 / np.sqrt(hd)))
    const("mask", np.triu(np.full((SEQ, SEQ), -1e4), 1))
    const("c0.5", np.array(0.5))
    const("c1", np.array(1.0))
    const("gelu_a", np.array(0.044715))
    const("gelu_b", np.array(np.sqrt(2 / np.pi)))
    inits["heads_shape"] = np.array([1, SEQ, HEADS, hd], np.int64)
    inits["model_shape"] = np.array([1, SEQ, D], np.int64)

    def layer_norm(x: str, p: str) -> str:
        mean = node("MatMul", [x, avg], f"{p}.mean")
        xc = node("Sub", [x, mean], f"{p}.xc")
        var = node("MatMul", [node("Mul", [xc, xc], f"{p}.sq"), avg], f"{p}.var")
        std = node("Sqrt", [node("Add", [var, eps], f"{p}.vareps")], f"{p}.std")
        y = node("Div", [xc, std], f"{p}.norm")
        g = const(f"{p}.g", 1 + 0.1 * rng.standard_normal(D))
        return node("Add", [node("Mul", [y, g], f"{p}.scaled"), const(f"{p}.b", 0.1 * rng.standard_normal(D))], f"{p}.out")

    def heads(x: str, p: str) -> str:
        r = node("Reshape", [x, "heads_shape"], f"{p}.split")
        return node("Transpose", [r], f"{p}.heads", perm=[0, 2, 1, 3])

    x = "x"
    for i in range(LAYERS):
        p = f"l{i}"
        h = layer_norm(x, f"{p}.ln1")
        q, k, v = (heads(node("MatMul", [h, weight(f"{p}.w{n}", D, D)], f"{p}.{n}"), f"{p}.{n}") for n in "qkv")
        kt = node("Transpose", [k], f"{p}.kt", perm=[0, 1, 3, 2])
        s = node("Mul", [node("MatMul", [q, kt], f"{p}.qk"), "scale"], f"{p}.scores")
        a = node("Softmax", [node("Add", [s, "mask"], f"{p}.masked")], f"{p}.attn", axis=-1)
        ctx = node("Transpose", [node("MatMul", [a, v], f"{p}.ctx")], f"{p}.ctx_t", perm=[0, 2, 1, 3])
        merged = node("Reshape", [ctx, "model_shape"], f"{p}.merged")
        x = node("Add", [x, node("MatMul", [merged, weight(f"{p}.wo", D, D)], f"{p}.proj")], f"{p}.res1")
        h = layer_norm(x, f"{p}.ln2")
        u = node("Add", [node("MatMul", [h, weight(f"{p}.w1", D, FF)], f"{p}.up0"), const(f"{p}.b1", 0.1 * rng.standard_normal(FF))],
                 f"{p}.up")
        cube = node("Mul", [node("Mul", [u, u], f"{p}.u2"), u], f"{p}.u3")
        inner = node("Mul", [node("Add", [u, node("Mul", [cube, "gelu_a"], f"{p}.au3")], f"{p}.poly"), "gelu_b"], f"{p}.inner")
        gelu = node("Mul", [node("Mul", [u, "c0.5"], f"{p}.half"), node("Add", [node("Tanh", [inner], f"{p}.tanh"), "c1"],
                                                                         f"{p}.tanh1")], f"{p}.gelu")
        x = node("Add", [x, node("MatMul", [gelu, weight(f"{p}.w2", FF, D)], f"{p}.down")], f"{p}.res2")
    node("MatMul", [layer_norm(x, "lnf"), weight("lm_head", D, VOCAB)], "logits")
    model = make_model(nodes, {"x": (np.float32, [1, SEQ, D])}, ["logits"], inits)
    return model, {"x": rng.standard_normal((1, SEQ, D)).astype(np.float32)}
