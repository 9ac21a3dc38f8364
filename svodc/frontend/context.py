"""What a handler sees of one ONNX node: its inputs (tensors as UOps, or sequence/optional values),
its attributes, the op version, compile-time values of inputs that must be constant (shapes, axes,
pads), and a way to import the node's subgraphs (If, Loop, Scan bodies) in its scope."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper

from svodc.frontend.dtypes import onnx_to_dtype
from svodc.frontend.strings import edge_input
from svodc.frontend.values import EdgeStrings, describe
from svodc.ir.interpret import evaluate
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp, toposort

if TYPE_CHECKING:
    from svodc.frontend.strings import Vocabulary
    from svodc.frontend.values import SequenceValue, Value

# Imports a subgraph attribute of the node with the given values for its inputs; returns its outputs.
SubgraphRunner = Callable[[onnx.GraphProto, "list[Value | None]"], "list[Value | None]"]


class Unsupported(Exception):
    """Raised by a handler: this node (attribute, input, dtype) cannot be compiled. The message
    becomes the reason in UnsupportedModelError."""


class NeedsConstant(Unsupported):
    """An input that must be known at compile time depends on graph inputs. Fixing those inputs'
    values at compile time (CompileOptions.input_values, `--input-value`) makes the node compile."""

    def __init__(self, message: str, inputs: tuple[str, ...]):
        super().__init__(message)
        self.inputs = inputs


class NeedsBound(NeedsConstant):
    """An output size that run-time inputs decide and nothing bounds: bounding the computed dims
    (`--dim TENSOR:AXIS=0..HI`) makes the node compile; fixing the inputs' values does too."""

    def __init__(self, message: str, inputs: tuple[str, ...], dims: tuple[str, ...]):
        super().__init__(message, inputs)
        self.dims = dims


def is_constant(x: UOp) -> bool:
    return all(n.op is not Ops.INPUT for n in toposort([x]))


def constant_value(x: UOp) -> np.ndarray:
    """Evaluate a subgraph whose leaves are all constants (compile-time shape arithmetic)."""
    return evaluate([x])[0]


class NodeContext:
    def __init__(self, node: onnx.NodeProto, inputs: list[Value | None], version: int, opset: int,
                 subgraph_runner: SubgraphRunner | None = None, vocabulary: Vocabulary | None = None,
                 bounded_axes: Callable[[UOp], tuple[str | None, ...]] | None = None,
                 loop_bounds: dict[str, int] | None = None,
                 dim_bounds: dict[str, object] | None = None, realize: Callable[[UOp], None] | None = None,
                 step_loops: bool = True):
        self.node = node
        self.inputs = inputs
        self.version = version  # the op's schema since_version this node uses
        self.opset = opset  # the model's opset for this node's domain
        self._attrs: dict[str, Any] = {a.name: a for a in node.attribute}
        self._run_subgraph = subgraph_runner
        self._vocabulary = vocabulary
        self._bounded_axes = bounded_axes
        self.loop_bounds = loop_bounds or {}  # CompileOptions.loop_bounds, by node name
        self.dim_bounds = dim_bounds or {}  # CompileOptions.dims: bounds of value-sized dims (TENSOR:AXIS) too
        self._realize = realize
        self.step_loops = step_loops  # CompileOptions.step_loops: recurrent layers as step loops

    def realize(self, x: UOp) -> None:
        """Ask scheduling to store x in a buffer of its own rather than fuse it into its consumers: for a
        value every later step of a loop reads, which fused would be recomputed from the first step on."""
        if self._realize is not None:
            self._realize(x)

    @property
    def has_bounded_dims(self) -> bool:
        """The model has bounded input dims (frontend/dims.py): some values' sizes vary per call."""
        return self._bounded_axes is not None

    def bounded(self, x: UOp) -> tuple[str | None, ...]:
        """Per axis of x the bounded input dim its size follows (it varies per call; frontend/dims.py), or None."""
        return self._bounded_axes(x) if self._bounded_axes is not None else (None,) * x.ndim

    @property
    def vocabulary(self) -> Vocabulary:
        """The model's strings: a handler interns the strings it compiles in (svodc/frontend/strings.py)."""
        if self._vocabulary is None:
            raise Unsupported("string constants cannot be compiled here")
        return self._vocabulary

    @property
    def name(self) -> str:
        return self.node.name or (self.node.output[0] if self.node.output else self.node.op_type)

    # ---------------------------------------------------------------- inputs
    def input(self, i: int) -> UOp:
        x = self.optional_input(i)
        if x is None:
            raise Unsupported(f"input {i} is required")
        return x

    def optional_input(self, i: int) -> UOp | None:
        """Tensor input i, or None when it is absent."""
        v = self.value(i)
        if isinstance(v, EdgeStrings) and v.shape is not None:  # code reads a string op's result: svodrt fills it
            return edge_input(self.vocabulary, v)
        if v is not None and not isinstance(v, UOp):
            raise Unsupported(f"input {i} must be a tensor, got {describe(v)}")
        return v

    def value(self, i: int) -> Value | None:
        """Input i whatever its kind (tensor, sequence, optional), or None when absent."""
        return self.inputs[i] if i < len(self.inputs) else None

    def sequence_input(self, i: int) -> SequenceValue:
        from svodc.frontend.values import OptionalValue, SequenceValue

        v = self.value(i)
        if isinstance(v, OptionalValue):
            v = v.value
        if not isinstance(v, SequenceValue):
            raise Unsupported(f"input {i} must be a sequence, got {describe(v)}")
        return v

    def const_input(self, i: int, what: str = "") -> np.ndarray:
        """Input i as a numpy array; it must be computable at compile time."""
        x = self.input(i)
        if not is_constant(x):
            label = what or f"input {i} ({self.node.input[i]!r})"
            names = tuple(dict.fromkeys(n.arg.name for n in toposort([x]) if n.op is Ops.INPUT))
            raise NeedsConstant(f"{label} must be known at compile time; it depends on graph input"
                                f"{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}: fix "
                                f"{'their values' if len(names) > 1 else 'its value'} with --input-value", names)
        return constant_value(x)

    def optional_const_input(self, i: int, what: str = "") -> np.ndarray | None:
        return None if self.optional_input(i) is None else self.const_input(i, what)

    @property
    def num_outputs(self) -> int:
        return len(self.node.output)

    def output_used(self, i: int) -> bool:
        return i < len(self.node.output) and self.node.output[i] != ""

    # ---------------------------------------------------------------- attributes
    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def attr(self, name: str, default: Any = None) -> Any:
        a = self._attrs.get(name)
        if a is None:
            return default
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, list) and v and isinstance(v[0], bytes):
            return [s.decode() for s in v]
        if isinstance(v, onnx.TensorProto):
            from onnx import numpy_helper

            return numpy_helper.to_array(v)
        return v

    def raw_attr(self, name: str, default: Any = None) -> Any:
        """An attribute's value as onnx gives it: strings as bytes (they need not be UTF-8), tensors as
        TensorProtos."""
        a = self._attrs.get(name)
        return default if a is None else helper.get_attribute_value(a)

    def ints(self, name: str, default: list[int] | None = None) -> list[int] | None:
        v = self.attr(name)
        return default if v is None else [int(i) for i in v]

    def dtype_attr(self, name: str, default: int | None = None):
        code = self.attr(name, default)
        if code is None:
            raise Unsupported(f"attribute {name!r} is required")
        return onnx_to_dtype(int(code), where=f"attribute {name!r}")

    def unsupported(self, reason: str) -> Unsupported:
        return Unsupported(reason)

    # ---------------------------------------------------------------- subgraphs
    def subgraph(self, name: str) -> onnx.GraphProto:
        a = self._attrs.get(name)
        if a is None or a.type != onnx.AttributeProto.GRAPH:
            raise Unsupported(f"graph attribute {name!r} is required")
        return a.g

    def run_subgraph(self, graph: onnx.GraphProto, inputs: list[Value | None]) -> list[Value | None]:
        """Import `graph` in this node's scope (it may read outer values) with `inputs` bound to its
        formal inputs; returns its outputs. Raises Unsupported listing what inside cannot compile."""
        if self._run_subgraph is None:
            raise Unsupported("subgraphs cannot be imported here")
        return self._run_subgraph(graph, inputs)
