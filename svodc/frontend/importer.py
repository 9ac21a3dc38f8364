"""ONNX model -> tensor-level UOp graph.

The importer reads the model with the `onnx` package, resolves every graph input's shape (symbolic
dims must be fixed by the options for now), turns initializers into WEIGHTs by reference to their
data, and imports the nodes (graph_import.py: one registered handler per node in dependency order,
nested scopes for subgraphs, function bodies for ops without a handler). Every node that cannot be
handled is collected, and all of them are reported at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

# Importing the op families registers their handlers.
import svodc.frontend.ops  # noqa: F401
from svodc.errors import (
    InputShapeError,
    InvalidModelError,
    ModelLoadError,
    UnsupportedModelError,
    UnsupportedNode,
)
from svodc.frontend.dtypes import UnsupportedDType, onnx_to_dtype
from svodc.frontend.graph_import import GraphImporter, Scope
from svodc.frontend.values import describe
from svodc.ir.ops import ConstData, InputArg, Ops
from svodc.ir.provenance import Provenance
from svodc.ir.uop import UOp
from svodc.options import CompileOptions

ModelSource = str | os.PathLike | bytes | onnx.ModelProto


@dataclass
class ImportedGraph:
    inputs: list[tuple[str, UOp]]  # graph inputs in declaration order (INPUT nodes)
    outputs: list[tuple[str, UOp]]  # graph outputs in declaration order
    provenance: Provenance
    producer: str  # "name version" of the tool that made the model, for the manifest
    expanded_ops: frozenset[str] = frozenset()  # ops imported through their ONNX function bodies


def load_model(source: ModelSource) -> onnx.ModelProto:
    if isinstance(source, onnx.ModelProto):
        return source
    try:
        if isinstance(source, bytes):
            return onnx.load_from_string(source)
        path = Path(source)
        if not path.is_file():
            raise ModelLoadError(f"model file {str(path)!r} does not exist")
        return onnx.load(str(path))  # external data is resolved relative to the model's folder
    except ModelLoadError:
        raise
    except Exception as e:  # protobuf raises DecodeError, RuntimeWarning-derived errors, OSError...
        where = "model bytes" if isinstance(source, bytes) else repr(str(source))
        raise ModelLoadError(f"cannot parse {where} as an ONNX model: {type(e).__name__}: {e}") from e


def import_model(source: ModelSource, options: CompileOptions | None = None) -> ImportedGraph:
    options = options or CompileOptions()
    model = load_model(source)
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    opsets = {o.domain if o.domain != "ai.onnx" else "": o.version for o in model.opset_import}
    if not opsets:
        raise InvalidModelError("the model imports no opset")
    graph = model.graph
    prov = Provenance()
    scope = Scope()

    for init in graph.initializer:
        scope.set(init.name, _weight(init))
    for init in graph.sparse_initializer:
        raise UnsupportedModelError([UnsupportedNode(init.values.name, "sparse_initializer", "", opsets.get("", 0),
                                                     "sparse initializers are not supported")])
    unknown = set(options.input_values) - {vi.name for vi in graph.input}
    if unknown:
        raise InputShapeError(f"--input-value names {sorted(unknown)}, which are not inputs of the model")
    inputs = []
    for vi in graph.input:
        if vi.name in scope.values:  # an initializer listed as an input (IR < 4): a constant
            continue
        if vi.name in options.input_values:
            scope.set(vi.name, _fixed_input(vi, options.input_values[vi.name]))
            continue
        x = _graph_input(vi, options)
        scope.set(vi.name, x)
        inputs.append((vi.name, x))

    importer = GraphImporter(prov, _weight)
    problems = importer.import_graph_nodes(graph, scope, opsets)
    if problems:
        raise UnsupportedModelError(problems)

    outputs = []
    for vi in graph.output:
        v = scope.get(vi.name, None)
        if not isinstance(v, UOp):
            if v is None:
                raise InvalidModelError(f"graph output {vi.name!r} is not produced by any node")
            raise UnsupportedModelError([UnsupportedNode(vi.name, "graph output", "", opsets.get("", 0),
                                                         f"only tensor outputs are supported, this is {describe(v)}")])
        outputs.append((vi.name, v))
    producer = f"{model.producer_name} {model.producer_version}".strip()
    return ImportedGraph(inputs, outputs, prov, producer, frozenset(importer.expanded))


def _fixed_input(vi: onnx.ValueInfoProto, value: np.ndarray) -> UOp:
    """A graph input whose value was fixed at compile time: a WEIGHT of the declared element type."""
    tt = vi.type.tensor_type
    try:
        dtype = onnx_to_dtype(tt.elem_type, where=f"input {vi.name!r}")
    except UnsupportedDType as e:
        raise UnsupportedModelError([UnsupportedNode(vi.name, "graph input", "", 0, str(e))]) from None
    array = np.asarray(value)
    if array.dtype != dtype.np:
        raise InputShapeError(f"--input-value {vi.name}: the value has dtype {array.dtype}, the model declares "
                              f"{dtype.name}")
    return UOp(Ops.WEIGHT, dtype, (), ConstData(array))


def _weight(init: onnx.TensorProto) -> UOp:
    try:
        dtype = onnx_to_dtype(init.data_type, where=f"initializer {init.name!r}")
        array = numpy_helper.to_array(init)
    except UnsupportedDType as e:
        raise UnsupportedModelError([UnsupportedNode(init.name, "initializer", "", 0, str(e))]) from None
    except Exception as e:
        raise InvalidModelError(f"initializer {init.name!r} cannot be read: {e}") from e
    if dtype.name == "bfloat16":
        array = np.asarray(array).view(np.uint16)
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
