"""QDQ fusion: the quantized ops a QDQ graph spells out in float, as onnxruntime's QDQ transformer
builds them, before the graph is imported.

quantize_static's default format (QuantFormat.QDQ) keeps every op float and brackets it with
DequantizeLinear on its inputs and QuantizeLinear on its output. Imported literally, DQ of a constant
weight folds into a float weight and each activation's Q -> DQ pair is float rounding work: the int8
kernels never run. This pass rewrites, on the main graph's NodeProtos:

  DQ(x) + DQ(w const) [+ DQ(bias int32 const)] -> Conv -> Q     ==> QLinearConv
  DQ(a) + DQ(b)                                -> MatMul -> Q   ==> QLinearMatMul
  DQ(a) + DQ(b const) [+ DQ(c int32 const)]    -> Gemm -> Q     ==> com.microsoft.QGemm
  DQ(a) + DQ(b)                                -> Add / Mul -> Q ==> com.microsoft.QLinearAdd / QLinearMul
  DQ(x)                       -> GlobalAveragePool -> Q         ==> com.microsoft.QLinearGlobalAveragePool
  DQ(x) -> Reshape / Flatten / Transpose / Squeeze / Unsqueeze / MaxPool -> Q (same scale and zero
  point)                                                        ==> the op on the 8-bit x itself

only where the fused op means the same computation: scales and zero points constant (initializers or
Constant nodes the model itself holds), activations per tensor, weights per tensor or per output
channel (per column for MatMul / Gemm), 8-bit types, a bias on the scale x_scale * w_scale with zero
point 0, and the float op's output read by the Q alone (a float output used elsewhere keeps the float
op). The fused op computes in integers what the QDQ graph computes in float: its result may differ by
a quantization step per layer from the float semantics, exactly as onnxruntime's optimized session
does. A shape-only op is exact: Q(DQ(q)) == q for the same scale and zero point (|q - zp| <= 255, so
the float32 product and quotient round back to the integer), and max commutes with the monotone DQ.
The DQ nodes a fusion leaves unread are dropped; the rest of the graph is untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"
BYTE_TYPES = (TensorProto.INT8, TensorProto.UINT8)
# |bias_scale - x_scale * w_scale| within this fraction of the product: the quantizer stores the float32
# rounding of the float64 product (a relative error under 2^-24), a float32 product differs by another
BIAS_SCALE_RTOL = 2.0 ** -20
SHAPE_OPS = ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool")


@dataclasses.dataclass(frozen=True)
class Dq:
    """A DequantizeLinear whose scale and zero point are known constants."""

    node: onnx.NodeProto
    value: str  # the quantized input
    scale: np.ndarray
    zero: np.ndarray
    axis: int  # as written (DequantizeLinear's default 1)

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1 and self.zero.size == 1

    @property
    def byte_type(self) -> int | None:
        """The ONNX type of the quantized value (its zero point's), where it is 8-bit."""
        t = helper.np_dtype_to_tensor_dtype(self.zero.dtype)
        return t if t in BYTE_TYPES else None


class _Graph:
    """The main graph's producers, readers and known constants."""

    def __init__(self, graph: onnx.GraphProto, unknown: set[str]):
        self.graph = graph
        self.inits = {i.name: i for i in graph.initializer if i.name not in unknown}
        self.inputs = {vi.name for vi in graph.input} - set(self.inits)
        self.outputs = {vo.name for vo in graph.output}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        self.constants: dict[str, np.ndarray] = {}
        for node in graph.node:
            for o in node.output:
                self.producer[o] = node
            for name in [*node.input, *_subgraph_reads(node)]:
                self.readers.setdefault(name, []).append(node)
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1 \
                    and node.attribute[0].name == "value":
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer or Constant output held in the model itself (external data is
        not read: a scale or zero point so stored simply does not fuse)."""
        if name in self.constants:
            return self.constants[name]
        init = self.inits.get(name)
        if init is None or init.data_location == TensorProto.EXTERNAL or name in self.inputs:
            return None
        return numpy_helper.to_array(init)

    def is_weight(self, name: str) -> bool:
        """A constant tensor (its data need not be read: the fused op reads it by name)."""
        return name in self.inits or name in self.constants

    def byte_constant_type(self, name: str) -> int | None:
        if name in self.inits:
            return self.inits[name].data_type
        return helper.np_dtype_to_tensor_dtype(self.constants[name].dtype) if name in self.constants else None

    def dq(self, name: str) -> Dq | None:
        node = self.producer.get(name)
        if node is None or node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx") \
                or len(node.input) < 3 or not node.input[2] or _attr(node, "block_size", 0):
            return None
        scale, zero = self.constant(node.input[1]), self.constant(node.input[2])
        # the quantizer writes a bias's scale as [1] and its zero point as a scalar: sizes, not shapes
        if scale is None or zero is None or scale.dtype != np.float32 or scale.size != zero.size:
            return None
        return Dq(node, node.input[0], scale, zero, _attr(node, "axis", 1))

    def only_q(self, name: str) -> onnx.NodeProto | None:
        """The QuantizeLinear that is the one reader of `name` (not a graph output), with a constant
        per-tensor float32 scale and 8-bit zero point."""
        readers = self.readers.get(name, [])
        if name in self.outputs or len(readers) != 1:
            return None
        q = readers[0]
        if q.op_type != "QuantizeLinear" or q.domain not in ("", "ai.onnx") or len(q.input) < 3 or not q.input[2] \
                or q.input[0] != name:
            return None
        scale, zero = self.constant(q.input[1]), self.constant(q.input[2])
        if scale is None or zero is None or scale.size != 1 or zero.size != 1 or scale.dtype != np.float32:
            return None
        to = _attr(q, "output_dtype", 0)
        ztype = helper.np_dtype_to_tensor_dtype(zero.dtype)
        return q if ztype in BYTE_TYPES and to in (0, ztype) else None


def fuse_qdq(graph: onnx.GraphProto, unknown: set[str]) -> tuple[list[onnx.NodeProto], bool]:
    """The main graph's nodes with the QDQ patterns fused (the module docstring), and whether any fused
    op is a com.microsoft one. `unknown`: initializers whose values are supplied at compile time from
    elsewhere (--weights), which are no constants to this pass."""
    g = _Graph(graph, unknown)
    replaced: dict[int, onnx.NodeProto] = {}  # id(float op) -> its fused op
    removed: set[int] = set()  # ids of the Q nodes the fused ops replace
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            continue
        q = g.only_q(node.output[0])
        fuse = _FUSERS.get(node.op_type)
        if q is None or fuse is None or id(q) in removed:
            continue
        fused = fuse(g, node, q)
        if fused is not None:
            fused.name = node.name or q.name
            replaced[id(node)] = fused
            removed.add(id(q))
    if not replaced:
        return list(graph.node), False
    nodes = [replaced.get(id(n), n) for n in graph.node if id(n) not in removed]
    return _drop_unread_dq(nodes, g.outputs), any(n.domain == MS for n in replaced.values())


def _conv(g: _Graph, node: onnx.NodeProto, q: onnx.NodeProto) -> onnx.NodeProto | None:
    x, w = g.dq(node.input[0]), g.dq(node.input[1])
    if not _activation(x) or w is None or not g.is_weight(w.value) or w.byte_type is None:
        return None
    out_channels = _weight_channels(g, w.value, 0)
    if not (w.per_tensor or (w.scale.shape == (out_channels,) and w.axis % _weight_rank(g, w.value) == 0)):
        return None
    inputs = [x.value, x.node.input[1], x.node.input[2], w.value, w.node.input[1], w.node.input[2], *q.input[1:3]]
    if len(node.input) > 2 and node.input[2]:
        bias = _bias(g, node.input[2], x, w)
        if bias is None:
            return None
        inputs.append(bias)
    return helper.make_node("QLinearConv", inputs, [q.output[0]], **_attrs(node))


def _matmul(g: _Graph, node: onnx.NodeProto, q: onnx.NodeProto) -> onnx.NodeProto | None:
    a, b = g.dq(node.input[0]), g.dq(node.input[1])
    if not _activation(a) or b is None or b.byte_type is None:
        return None
    per_column = g.is_weight(b.value) and _weight_rank(g, b.value) == 2 and b.axis % 2 == 1 \
        and b.scale.shape == (_weight_channels(g, b.value, 1),)  # of a constant 2-D B
    if not (b.per_tensor or per_column):
        return None
    inputs = [a.value, *a.node.input[1:3], b.value, *b.node.input[1:3], *q.input[1:3]]
    return helper.make_node("QLinearMatMul", inputs, [q.output[0]])


def _gemm(g: _Graph, node: onnx.NodeProto, q: onnx.NodeProto) -> onnx.NodeProto | None:
    a, b = g.dq(node.input[0]), g.dq(node.input[1])
    trans_b = _attr(node, "transB", 0)
    if not _activation(a) or b is None or not g.is_weight(b.value) or b.byte_type is None \
            or _weight_rank(g, b.value) != 2:
        return None
    col_axis = 0 if trans_b else 1
    if not (b.per_tensor or (b.scale.shape == (_weight_channels(g, b.value, col_axis),)
                             and b.axis % 2 == col_axis)):
        return None
    c = ""
    if len(node.input) > 2 and node.input[2]:
        # QGemm's C is on the scale alpha * a_scale * b_scale, Gemm's on beta's: fuse where both are 1
        if _attr(node, "alpha", 1.0) != 1.0 or _attr(node, "beta", 1.0) != 1.0:
            return None
        c = _bias(g, node.input[2], a, b)
        if c is None:
            return None
    inputs = [a.value, *a.node.input[1:3], b.value, *b.node.input[1:3], c, *q.input[1:3]]
    return helper.make_node("QGemm", inputs, [q.output[0]], domain=MS, alpha=float(_attr(node, "alpha", 1.0)),
                            transA=_attr(node, "transA", 0), transB=trans_b)


def _binary(op: str):
    def fuse(g: _Graph, node: onnx.NodeProto, q: onnx.NodeProto) -> onnx.NodeProto | None:
        a, b = g.dq(node.input[0]), g.dq(node.input[1])
        if not _activation(a) or not _activation(b) or not a.byte_type == b.byte_type == _q_type(g, q):
            return None
        inputs = [a.value, *a.node.input[1:3], b.value, *b.node.input[1:3], *q.input[1:3]]
        return helper.make_node(op, inputs, [q.output[0]], domain=MS)
    return fuse


def _global_average_pool(g: _Graph, node: onnx.NodeProto, q: onnx.NodeProto) -> onnx.NodeProto | None:
    x = g.dq(node.input[0])
    if not _activation(x) or x.byte_type != _q_type(g, q):
        return None
    return helper.make_node("QLinearGlobalAveragePool", [x.value, *x.node.input[1:3], *q.input[1:3]], [q.output[0]],
                            domain=MS, channels_last=0)


def _shape_op(g: _Graph, node: onnx.NodeProto, q: onnx.NodeProto) -> onnx.NodeProto | None:
    """The op on the quantized values themselves where the Q undoes the DQ exactly."""
    x = g.dq(node.input[0])
    if not _activation(x) or x.byte_type != _q_type(g, q):
        return None
    q_scale, q_zero = g.constant(q.input[1]), g.constant(q.input[2])
    if not (np.array_equal(x.scale.ravel(), q_scale.ravel()) and np.array_equal(x.zero.ravel(), q_zero.ravel())
            and float(x.scale.ravel()[0]) > 0):
        return None
    fused = onnx.NodeProto()
    fused.CopyFrom(node)
    fused.input[0] = x.value
    fused.output[0] = q.output[0]
    return fused


_FUSERS = {"Conv": _conv, "MatMul": _matmul, "Gemm": _gemm, "Add": _binary("QLinearAdd"),
           "Mul": _binary("QLinearMul"), "GlobalAveragePool": _global_average_pool,
           **{op: _shape_op for op in SHAPE_OPS}}


def _activation(d: Dq | None) -> bool:
    return d is not None and d.per_tensor and d.byte_type is not None and float(d.scale.ravel()[0]) > 0


def _q_type(g: _Graph, q: onnx.NodeProto) -> int:
    return helper.np_dtype_to_tensor_dtype(g.constant(q.input[2]).dtype)


def _bias(g: _Graph, name: str, x: Dq, w: Dq) -> str | None:
    """The int32 constant under a bias's DQ where its scale is x_scale * w_scale and zero point 0."""
    b = g.dq(name)
    if b is None or not g.is_weight(b.value) or g.byte_constant_type(b.value) != TensorProto.INT32 \
            or np.any(b.zero != 0):
        return None
    want = np.float64(x.scale.ravel()[0]) * w.scale.astype(np.float64).ravel()
    have = b.scale.astype(np.float64).ravel()
    if have.size not in (1, want.size) or want.size not in (1, _weight_channels(g, b.value, 0)):
        return None
    return b.value if np.all(np.abs(have - want) <= BIAS_SCALE_RTOL * np.abs(want)) else None


def _weight_dims(g: _Graph, name: str) -> tuple[int, ...]:
    return tuple(g.inits[name].dims) if name in g.inits else g.constants[name].shape


def _weight_rank(g: _Graph, name: str) -> int:
    return len(_weight_dims(g, name))


def _weight_channels(g: _Graph, name: str, axis: int) -> int:
    dims = _weight_dims(g, name)
    return dims[axis] if len(dims) > axis else -1


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _subgraph_reads(node: onnx.NodeProto) -> Iterable[str]:
    """Names a node's subgraphs read from the enclosing graph (any name they use: a superset is safe,
    it only keeps a value counted as read)."""
    for a in node.attribute:
        for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            for n in sub.node:
                yield from n.input
                yield from _subgraph_reads(n)


def _drop_unread_dq(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """Without the DequantizeLinear nodes nothing reads any more (the fused ops read their inputs)."""
    read = set(outputs)
    for n in nodes:
        read.update(n.input)
        read.update(_subgraph_reads(n))
    return [n for n in nodes if n.op_type != "DequantizeLinear" or any(o in read for o in n.output)]
