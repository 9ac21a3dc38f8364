"""Synthetic models of the families issue 13 names and the shared models lack, built here with seeded random
weights (latency does not depend on the values): two transformer encoders (BERT-base-sized layers at 128 tokens,
Whisper-tiny-sized layers at 1,500 frames: softmax over long rows) and a YOLOv8n-like detector at 320 x 320
(Conv + SiLU, C2f blocks with Split and Concat, SPPF pooling, nearest upsampling, a DFL head with a softmax)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SYNTHETIC = ["encoder_bert4", "encoder_whisper4", "yolo_like_320"]


class _Graph:
    """Nodes and seeded initializers; every value gets a fresh name."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def weight(self, shape: list[int], scale: float | None = None) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        a = self.rng.standard_normal(shape) * (scale if scale is not None else 1 / np.sqrt(fan_in))
        return self.const(a.astype(np.float32))

    def const(self, a: np.ndarray) -> str:
        n = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(a), n))
        return n

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs) -> str | list[str]:
        outs = [self.name(op_type) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, **attrs))
        return outs if outputs > 1 else outs[0]

    def model(self, name: str, inputs: list[onnx.ValueInfoProto], output: str, shape: list) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, [helper.make_tensor_value_info(output, TensorProto.FLOAT,
                                                                                          shape)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def encoder(seq: int, width: int, heads: int, ffn: int, layers: int, mask: bool, seed: int = 0
            ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Pre-LayerNorm transformer encoder layers as PyTorch exports them (MatMul + Add projections, Reshape and
    Transpose into heads, scaled QK^T, an additive mask, Softmax, erf GELU, residual adds)."""
    g = _Graph(seed)
    dh = width // heads
    split, merge = g.const(np.array([1, seq, heads, dh], np.int64)), g.const(np.array([1, seq, width], np.int64))
    scale, half, one, rsqrt2 = (g.const(np.array(v, np.float32)) for v in (1 / np.sqrt(dh), 0.5, 1.0, 1 / np.sqrt(2)))

    def norm(x: str) -> str:
        return g.op("LayerNormalization", [x, g.weight([width], 0.1), g.weight([width], 0.1)], axis=-1, epsilon=1e-5)

    def dense(x: str, n_in: int, n_out: int) -> str:
        return g.op("Add", [g.op("MatMul", [x, g.weight([n_in, n_out])]), g.weight([n_out], 0.02)])

    x = "x"
    for _ in range(layers):
        h = norm(x)
        q, k, v = (g.op("Reshape", [dense(h, width, width), split]) for _ in range(3))
        scores = g.op("Mul", [g.op("MatMul", [g.op("Transpose", [q], perm=[0, 2, 1, 3]),
                                              g.op("Transpose", [k], perm=[0, 2, 3, 1])]), scale])
        if mask:
            scores = g.op("Add", [scores, "mask"])
        att = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), g.op("Transpose", [v], perm=[0, 2, 1, 3])])
        att = g.op("Reshape", [g.op("Transpose", [att], perm=[0, 2, 1, 3]), merge])
        x = g.op("Add", [x, dense(att, width, width)])
        f = dense(norm(x), width, ffn)
        gelu = g.op("Mul", [g.op("Mul", [f, g.op("Add", [g.op("Erf", [g.op("Mul", [f, rsqrt2])]), one])]), half])
        x = g.op("Add", [x, dense(gelu, ffn, width)])
    y = norm(x)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, width])]
    feeds = {"x": g.rng.standard_normal((1, seq, width)).astype(np.float32)}
    if mask:  # the last tokens are padding
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, 1, seq]))
        feeds["mask"] = np.where(np.arange(seq) < seq - seq // 8, 0, -1e4).astype(np.float32).reshape(1, 1, 1, seq)
    return g.model("encoder", inputs, y, [1, seq, width]), feeds


def yolo_like(size: int, seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """YOLOv8n's layer structure (widths 16-256, 80 classes) at size x size."""
    g = _Graph(seed)

    def conv(x: str, c_in: int, c_out: int, k: int = 1, s: int = 1, act: bool = True) -> str:
        y = g.op("Conv", [x, g.weight([c_out, c_in, k, k]), g.weight([c_out], 0.1)], kernel_shape=[k, k],
                 strides=[s, s], pads=[k // 2] * 4)
        return g.op("Mul", [y, g.op("Sigmoid", [y])]) if act else y

    def c2f(x: str, c_in: int, c_out: int, n: int, shortcut: bool = True) -> str:
        half = c_out // 2
        parts = list(g.op("Split", [conv(x, c_in, c_out), g.const(np.array([half, half], np.int64))], 2, axis=1))
        for _ in range(n):
            t = conv(conv(parts[-1], half, half, 3), half, half, 3)
            parts.append(g.op("Add", [parts[-1], t]) if shortcut else t)
        return conv(g.op("Concat", parts, axis=1), half * (2 + n), c_out)

    def sppf(x: str, c_in: int, c_out: int) -> str:
        pools = [conv(x, c_in, c_in // 2)]
        for _ in range(3):
            pools.append(g.op("MaxPool", [pools[-1]], kernel_shape=[5, 5], strides=[1, 1], pads=[2] * 4))
        return conv(g.op("Concat", pools, axis=1), c_in * 2, c_out)

    def up(x: str) -> str:
        return g.op("Resize", [x, "", g.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest")

    x = conv(conv("images", 3, 16, 3, 2), 16, 32, 3, 2)
    x = conv(c2f(x, 32, 32, 1), 32, 64, 3, 2)
    p3 = c2f(x, 64, 64, 2)
    p4 = c2f(conv(p3, 64, 128, 3, 2), 128, 128, 2)
    p5 = sppf(c2f(conv(p4, 128, 256, 3, 2), 256, 256, 1), 256, 256)
    n4 = c2f(g.op("Concat", [up(p5), p4], axis=1), 384, 128, 1, False)
    o3 = c2f(g.op("Concat", [up(n4), p3], axis=1), 192, 64, 1, False)
    o4 = c2f(g.op("Concat", [conv(o3, 64, 64, 3, 2), n4], axis=1), 192, 128, 1, False)
    o5 = c2f(g.op("Concat", [conv(o4, 128, 128, 3, 2), p5], axis=1), 384, 256, 1, False)
    classes, heads = 80, []
    for f, ch in ((o3, 64), (o4, 128), (o5, 256)):
        box = conv(conv(conv(f, ch, 64, 3), 64, 64, 3), 64, 64, 1, act=False)
        cls = conv(conv(conv(f, ch, 80, 3), 80, 80, 3), 80, classes, 1, act=False)
        heads.append(g.op("Reshape", [g.op("Concat", [box, cls], axis=1),
                                      g.const(np.array([1, 64 + classes, -1], np.int64))]))
    box, cls = g.op("Split", [g.op("Concat", heads, axis=2), g.const(np.array([64, classes], np.int64))], 2, axis=1)
    anchors = sum((size // s) ** 2 for s in (8, 16, 32))
    dist = g.op("Reshape", [box, g.const(np.array([1, 4, 16, anchors], np.int64))])
    dist = g.op("Softmax", [g.op("Transpose", [dist], perm=[0, 2, 1, 3])], axis=1)
    dist = g.op("Conv", [dist, g.const(np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1))])
    dist = g.op("Reshape", [dist, g.const(np.array([1, 4, anchors], np.int64))])
    y = g.op("Concat", [dist, g.op("Sigmoid", [cls])], axis=1)
    inputs = [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])]
    feeds = {"images": g.rng.random((1, 3, size, size)).astype(np.float32)}
    return g.model("yolo_like", inputs, y, [1, 4 + classes, anchors]), feeds


def build(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray], str]:
    """(model, feeds, note) of one SYNTHETIC model."""
    if name == "encoder_bert4":
        return (*encoder(128, 768, 12, 3072, 4, mask=True), "4 BERT-base encoder layers, 128 tokens, random weights")
    if name == "encoder_whisper4":
        return (*encoder(1500, 384, 6, 1536, 4, mask=False),
                "4 Whisper-tiny encoder layers, 1500 frames, random weights")
    if name == "yolo_like_320":
        return (*yolo_like(320), "YOLOv8n-like detector, 320 x 320, random weights")
    raise KeyError(name)
