"""What a handler sees of one ONNX node: its inputs as UOps, its attributes, the op version, and
compile-time values of inputs that must be constant (shapes, axes, pads)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from svodc.frontend.dtypes import onnx_to_dtype
from svodc.ir.interpret import evaluate
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp, toposort


class Unsupported(Exception):
    """Raised by a handler: this node (attribute, input, dtype) cannot be compiled. The message
    becomes the reason in UnsupportedModelError."""


_CONST_LEAVES = frozenset({Ops.WEIGHT, Ops.CONST})


def is_constant(x: UOp) -> bool:
    return all(n.op is not Ops.INPUT for n in toposort([x]))


def constant_value(x: UOp) -> np.ndarray:
    """Evaluate a subgraph whose leaves are all constants (compile-time shape arithmetic)."""
    return evaluate([x])[0]


class NodeContext:
    def __init__(self, node: onnx.NodeProto, inputs: list[UOp | None], version: int, opset: int):
        self.node = node
        self.inputs = inputs
        self.version = version  # the op's schema since_version this node uses
        self.opset = opset  # the model's opset for this node's domain
        self._attrs: dict[str, Any] = {a.name: a for a in node.attribute}

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
        return self.inputs[i] if i < len(self.inputs) else None

    def const_input(self, i: int, what: str = "") -> np.ndarray:
        """Input i as a numpy array; it must be computable at compile time."""
        x = self.input(i)
        if not is_constant(x):
            label = what or f"input {i} ({self.node.input[i]!r})"
            raise Unsupported(f"{label} must be known at compile time (it depends on a graph input)")
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
