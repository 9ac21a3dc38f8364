"""The graph's inputs and outputs: ONNX values <-> the bundle's tensors.

A bundle's inputs and outputs are tensors. Sequence and optional values at the graph boundary are
flattened into them, with their structure fixed at compile time:
- a sequence input `x` of length L is the tensors `x[0]` ... `x[L-1]`; its length and its elements'
  shapes come from the input shapes given for `x[0]`, `x[1]`, ... (`--input-shape 'x[0]=2x3'`);
- a sequence output `y` is the outputs `y[0]` ... `y[L-1]`;
- an optional input is present (a tensor or sequence as above) unless its value is fixed to None
  (CompileOptions.input_values[name] = None); an absent optional output is no output at all;
- a whole sequence can be fixed at compile time as a list of arrays (input_values[name] = [...]), which
  is how an empty sequence input is given.
An input whose value is fixed at compile time (CompileOptions.input_values) is a constant, not an
input of the bundle.
"""

from __future__ import annotations

import numpy as np
import onnx

from svodc.errors import InputShapeError, UnsupportedModelError, UnsupportedNode
from svodc.frontend.dims import DimTable, resolve_dim
from svodc.frontend.dtypes import UnsupportedDType, onnx_to_dtype
from svodc.frontend.strings import Vocabulary
from svodc.frontend.values import EdgeStrings, OptionalValue, SequenceValue, Value, ZipMapValue
from svodc.ir.dtypes import DType, dtypes
from svodc.ir.ops import ConstData, InputArg, Ops
from svodc.ir.uop import UOp
from svodc.options import CompileOptions


def element_name(name: str, i: int) -> str:
    return f"{name}[{i}]"


def _dtype(name: str, tt: onnx.TypeProto.Tensor) -> DType:
    try:
        return onnx_to_dtype(tt.elem_type, where=f"input {name!r}")
    except UnsupportedDType as e:
        raise UnsupportedModelError([UnsupportedNode(name, "graph input", "", 0, str(e))]) from None


def graph_input(vi: onnx.ValueInfoProto, options: CompileOptions, vocabulary: Vocabulary,
                dims: DimTable) -> tuple[Value, list[tuple[str, UOp]]]:
    """The value a graph input has inside the graph, and the bundle inputs it is made of. A string value
    fixed at compile time (--input-value) is interned into `vocabulary`; bounded dims are recorded in
    `dims` (the INPUT node has their upper bounds)."""
    return _input(vi.name, vi.type, options, vocabulary, dims)


def _input(name: str, t: onnx.TypeProto, options: CompileOptions, vocabulary: Vocabulary,
           dims: DimTable) -> tuple[Value, list]:
    kind = t.WhichOneof("value")
    if kind == "optional_type":
        if name in options.input_values and options.input_values[name] is None:
            return OptionalValue(None), []
        value, inputs = _input(name, t.optional_type.elem_type, options, vocabulary, dims)
        return OptionalValue(value), inputs
    if kind == "sequence_type":
        elem = t.sequence_type.elem_type
        if not elem.HasField("tensor_type"):
            raise UnsupportedModelError([UnsupportedNode(name, "graph input", "", 0,
                                                         "only sequences of tensors are supported")])
        dtype = _dtype(name, elem.tensor_type)
        fixed = options.input_values.get(name)
        if isinstance(fixed, list | tuple):  # the whole sequence fixed at compile time (e.g. empty)
            if dtype is dtypes.string:
                items = tuple(vocabulary.constant(a, f"--input-value {name}") for a in fixed)
                return SequenceValue(items, dtype), []
            arrays = [np.asarray(a) for a in fixed]
            return SequenceValue(tuple(UOp(Ops.WEIGHT, dtype, (), ConstData(a)) for a in arrays), dtype), []
        items, inputs = [], []
        i = 0
        while element_name(name, i) in options.input_shapes or element_name(name, i) in options.input_values:
            x = _tensor(element_name(name, i), elem.tensor_type, options, vocabulary, dims)
            items.append(x)
            if x.op is Ops.INPUT:
                inputs.append((element_name(name, i), x))
            i += 1
        if not items and name not in options.input_values:
            raise InputShapeError(f"sequence input {name!r}: give the shapes of its elements with --input-shape "
                                  f"'{element_name(name, 0)}=DxD...' (and {element_name(name, 1)}, ...), "
                                  "or fix its value")
        return SequenceValue(tuple(items), dtype), inputs
    if kind != "tensor_type":
        raise UnsupportedModelError([UnsupportedNode(name, "graph input", "", 0,
                                                     f"{kind or 'untyped'} inputs are not supported")])
    x = _tensor(name, t.tensor_type, options, vocabulary, dims)
    return x, ([(name, x)] if x.op is Ops.INPUT else [])


def _tensor(name: str, tt: onnx.TypeProto.Tensor, options: CompileOptions, vocabulary: Vocabulary,
            dims: DimTable) -> UOp:
    dtype = _dtype(name, tt)
    if name in options.input_values and dtype is dtypes.string:
        return vocabulary.constant(options.input_values[name], f"--input-value {name}")
    if name in options.input_values:
        array = np.asarray(options.input_values[name])
        if array.dtype != dtype.np:
            raise InputShapeError(f"--input-value {name}: the value has dtype {array.dtype}, the model declares "
                                  f"{dtype.name}")
        return UOp(Ops.WEIGHT, dtype, (), ConstData(array))
    if name in options.input_shapes:
        given = tuple(options.input_shapes[name])
        declared = list(tt.shape.dim) if tt.HasField("shape") else None
        if declared is not None and len(declared) != len(given):
            raise InputShapeError(f"input {name!r}: --input-shape gives rank {len(given)}, "
                                  f"the model declares rank {len(declared)}")
        shape = tuple(resolve_dim(name, i, declared[i] if declared else None, g, dims) for i, g in enumerate(given))
        return UOp(Ops.INPUT, dtype, (), InputArg(name, shape))
    if not tt.HasField("shape"):
        raise InputShapeError(f"input {name!r} has no declared shape: pass --input-shape {name}=DxDx...")
    shape = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value >= 0:
            shape.append(d.dim_value)
        elif d.HasField("dim_param") and d.dim_param != "?" and d.dim_param in options.dims:
            shape.append(resolve_dim(name, i, d, options.dims[d.dim_param], dims))
        else:
            what = f"symbolic {d.dim_param!r}" if d.HasField("dim_param") else "unknown"
            fix = f"--dim {d.dim_param}=VALUE (or LO..HI) or " if d.HasField("dim_param") else ""
            raise InputShapeError(f"input {name!r} dim {i} is {what}: fix it at compile time with "
                                  f"{fix}--input-shape {name}=DxDx...")
    return UOp(Ops.INPUT, dtype, (), InputArg(name, tuple(shape)))


def graph_output(name: str, value: Value) -> list[tuple[str, UOp]]:
    """The bundle outputs a graph output is made of (none for an absent optional)."""
    if isinstance(value, OptionalValue):
        return [] if value.value is None else graph_output(name, value.value)
    if isinstance(value, SequenceValue):
        return [(element_name(name, i), x) for i, x in enumerate(value.items)]
    if isinstance(value, EdgeStrings):  # svodrt computes it (ImportedGraph.edge_outputs): no bundle output
        return []
    if isinstance(value, ZipMapValue):  # the scores; the keys go to the manifest (ImportedGraph.zipmaps)
        return [(name, value.scores)]
    return [(name, value)]
