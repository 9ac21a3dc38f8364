"""ONNX model -> tensor-level UOp graph.

The importer reads the model with the `onnx` package, resolves every graph input's shape (symbolic
dims must be fixed by the options for now), turns initializers into WEIGHTs by reference to their
data, and calls one registered handler per node in dependency order. Every node that cannot be
handled is collected, and all of them are reported at once.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

# Importing the op families registers their handlers.
import svodc.frontend.ops  # noqa: F401
from svodc.errors import (
    InputShapeError,
    InvalidModelError,
    ModelLoadError,
    UnsupportedModelError,
    UnsupportedNode,
    WeightsError,
)
from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.dtypes import UnsupportedDType, onnx_to_dtype
from svodc.frontend.registry import NoHandler, lookup
from svodc.frontend.weights import ExternalData, weight_files
from svodc.ir.ops import ConstData, InputArg, Ops
from svodc.ir.provenance import Provenance
from svodc.ir.shapes import ShapeError
from svodc.ir.uop import UOp
from svodc.options import CompileOptions

ModelSource = str | os.PathLike | bytes | onnx.ModelProto


@dataclass
class ImportedGraph:
    inputs: list[tuple[str, UOp]]  # graph inputs in declaration order (INPUT nodes)
    outputs: list[tuple[str, UOp]]  # graph outputs in declaration order
    provenance: Provenance
    producer: str  # "name version" of the tool that made the model, for the manifest


def load_model(source: ModelSource) -> onnx.ModelProto:
    if isinstance(source, onnx.ModelProto):
        return source
    try:
        if isinstance(source, bytes):
            return onnx.load_from_string(source)
        path = Path(source)
        if not path.is_file():
            raise ModelLoadError(f"model file {str(path)!r} does not exist")
        # external data stays where it is: frontend/weights.py maps it relative to the model's folder
        return onnx.load(str(path), load_external_data=False)
    except ModelLoadError:
        raise
    except Exception as e:  # protobuf raises DecodeError, RuntimeWarning-derived errors, OSError...
        where = "model bytes" if isinstance(source, bytes) else repr(str(source))
        raise ModelLoadError(f"cannot parse {where} as an ONNX model: {type(e).__name__}: {e}") from e


def import_model(source: ModelSource, options: CompileOptions | None = None,
                 base_dir: str | os.PathLike | None = None) -> ImportedGraph:
    """base_dir: where the model's external data files are (default: the model file's folder)."""
    options = options or CompileOptions()
    if base_dir is None and isinstance(source, (str, os.PathLike)):
        base_dir = Path(source).parent
    external = ExternalData(Path(base_dir) if base_dir is not None else None)
    model = load_model(source)
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    opsets = {o.domain if o.domain != "ai.onnx" else "": o.version for o in model.opset_import}
    if not opsets:  # (a model may import only other domains: ai.onnx.ml alone, say)
        raise InvalidModelError("the model imports no opset")
    graph = model.graph
    prov = Provenance()
    env: dict[str, UOp | None] = {"": None}

    for init in graph.initializer:
        env[init.name] = _weight(init, external)
    for name, (dtype, array) in weight_files(options.weights, graph).items():  # --weights: supply or override
        env[name] = UOp(Ops.WEIGHT, dtype, (), ConstData(array))
    for init in graph.sparse_initializer:
        raise UnsupportedModelError([UnsupportedNode(init.values.name, "sparse_initializer", "", opsets.get("", 0),
                                                     "sparse initializers are not supported")])
    inputs = []
    for vi in graph.input:
        if vi.name in env:  # an initializer listed as an input (IR < 4): a constant
            continue
        x = _graph_input(vi, options)
        env[vi.name] = x
        inputs.append((vi.name, x))

    nodes = _dependency_order(graph, set(env))
    problems: list[UnsupportedNode] = []
    for node in nodes:
        domain = "" if node.domain == "ai.onnx" else node.domain
        opset = opsets.get(domain)
        label = UnsupportedNode(node.name, node.op_type, domain, opset or 0, "")
        if opset is None:
            problems.append(_with(label, f"the model imports no opset for domain {domain!r}"))
            continue
        try:
            handler, version = lookup(domain, node.op_type, opset)
        except NoHandler as e:
            problems.append(_with(label, str(e)))
            _poison(node, env)
            continue
        srcs = [env.get(name) for name in node.input]
        if any(name != "" and env.get(name, _MISSING) is None for name in node.input):
            _poison(node, env)  # an input comes from a node that already failed
            continue
        ctx = NodeContext(node, srcs, version, opset)
        try:
            result = handler.fn(ctx)
            outs = [result] if isinstance(result, UOp) else list(result)
            for o in outs:
                if o is not None:
                    _ = o.shape  # shape errors belong to this node
        except (Unsupported, UnsupportedDType, ShapeError) as e:
            problems.append(_with(label, str(e)))
            _poison(node, env)
            continue
        if len(outs) < len(node.output):
            outs += [None] * (len(node.output) - len(outs))
        for name, o in zip(node.output, outs, strict=False):
            if name:
                if o is None:
                    problems.append(_with(label, f"output {name!r} is not produced by this implementation"))
                env[name] = o
        prov.tag_new([o for o in outs if o is not None], [s for s in srcs if s is not None],
                     [node.name or node.output[0]])
    if problems:
        raise UnsupportedModelError(problems)

    outputs = []
    for vi in graph.output:
        if env.get(vi.name) is None:
            raise InvalidModelError(f"graph output {vi.name!r} is not produced by any node")
        outputs.append((vi.name, env[vi.name]))
    producer = f"{model.producer_name} {model.producer_version}".strip()
    return ImportedGraph(inputs, outputs, prov, producer)


_MISSING = object()


def _with(label: UnsupportedNode, reason: str) -> UnsupportedNode:
    return UnsupportedNode(label.name, label.op_type, label.domain, label.opset, reason)


def _poison(node: onnx.NodeProto, env: dict[str, UOp | None]) -> None:
    for name in node.output:
        if name:
            env[name] = None


def _weight(init: onnx.TensorProto, external: ExternalData) -> UOp:
    try:
        dtype = onnx_to_dtype(init.data_type, where=f"initializer {init.name!r}")
        array = external.array(init, dtype)
    except UnsupportedDType as e:
        raise UnsupportedModelError([UnsupportedNode(init.name, "initializer", "", 0, str(e))]) from None
    except WeightsError:
        raise
    except Exception as e:
        raise InvalidModelError(f"initializer {init.name!r} cannot be read: {e}") from e
    return UOp(Ops.WEIGHT, dtype, (), ConstData(np.asarray(array, dtype=dtype.np)))


def _graph_input(vi: onnx.ValueInfoProto, options: CompileOptions) -> UOp:
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedModelError([UnsupportedNode(vi.name, "graph input", "", 0,
                                                     "only tensor inputs are supported")])
    tt = vi.type.tensor_type
    try:
        dtype = onnx_to_dtype(tt.elem_type, where=f"input {vi.name!r}")
    except UnsupportedDType as e:
        raise UnsupportedModelError([UnsupportedNode(vi.name, "graph input", "", 0, str(e))]) from None
    if vi.name in options.input_shapes:
        shape = tuple(options.input_shapes[vi.name])
        if tt.HasField("shape") and len(tt.shape.dim) != len(shape):
            raise InputShapeError(f"input {vi.name!r}: --input-shape gives rank {len(shape)}, "
                                  f"the model declares rank {len(tt.shape.dim)}")
        return UOp(Ops.INPUT, dtype, (), InputArg(vi.name, shape))
    if not tt.HasField("shape"):
        raise InputShapeError(f"input {vi.name!r} has no declared shape: pass --input-shape {vi.name}=DxDx...")
    shape = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            shape.append(d.dim_value)
        elif d.HasField("dim_value") and d.dim_value == 0:
            shape.append(0)
        elif d.HasField("dim_param") and d.dim_param in options.dims:
            shape.append(options.dims[d.dim_param])
        else:
            what = f"symbolic {d.dim_param!r}" if d.HasField("dim_param") else "unknown"
            fix = f"--dim {d.dim_param}=VALUE or " if d.HasField("dim_param") else ""
            raise InputShapeError(f"input {vi.name!r} dim {i} is {what}: fix it at compile time with "
                                  f"{fix}--input-shape {vi.name}=DxDx...")
    return UOp(Ops.INPUT, dtype, (), InputArg(vi.name, tuple(shape)))


def _dependency_order(graph: onnx.GraphProto, available: set[str]) -> list[onnx.NodeProto]:
    """Nodes in an order where every input is produced before use (Kahn's algorithm). Raises on a
    cycle or on an input that nothing produces."""
    producers: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for o in node.output:
            if o:
                if o in producers or o in available:
                    raise InvalidModelError(f"value {o!r} is produced twice (node {node.name!r})")
                producers[o] = i
    deps: list[set[int]] = []
    for node in graph.node:
        d = set()
        for name in node.input:
            if name == "" or name in available:
                continue
            if name not in producers:
                raise InvalidModelError(f"node {node.name!r} ({node.op_type}) reads {name!r}, which is neither "
                                        "a graph input, an initializer nor the output of a node")
            d.add(producers[name])
        deps.append(d)
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(i)
    waiting = [len(d) for d in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)  # the file's own order wherever it is valid
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, []):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(graph.node):
        stuck = [graph.node[i].name or graph.node[i].op_type for i, w in enumerate(waiting) if w > 0][:5]
        raise InvalidModelError(f"the graph has a cycle through nodes {stuck}")
    return [graph.node[i] for i in order]
