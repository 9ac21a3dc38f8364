"""The compiler's exception types: one per class of failure. Each message says what failed, where
(node, input, kernel, symbol) and what to do about it. The CLI prints the message on one line."""

from __future__ import annotations

from dataclasses import dataclass


class SvodcError(Exception):
    """Base of every error svodc raises on purpose."""


class ModelLoadError(SvodcError):
    """The model file cannot be read or is not a valid ONNX model."""


class InvalidModelError(SvodcError):
    """The model is readable but inconsistent (a cycle, a dangling input, a bad attribute)."""


@dataclass(frozen=True)
class UnsupportedNode:
    name: str
    op_type: str
    domain: str
    opset: int
    reason: str
    # Graph inputs whose values this node needs at compile time (fixing them with
    # CompileOptions.input_values / --input-value would make it compile).
    needs_values: tuple[str, ...] = ()
    # Computed dims (TENSOR:AXIS) this node sizes by a run-time value that nothing bounds: bounding them
    # (CompileOptions.dims / --dim NAME=0..HI) would make it compile with those values at run time.
    needs_dims: tuple[str, ...] = ()
    shape_error: bool = False  # the node's input shapes do not fit it (e.g. after --input-shape)

    def __str__(self) -> str:
        dom = self.domain or "ai.onnx"
        opset = f", opset {self.opset}" if self.opset else ""  # 0: the model imports no opset of the domain
        return f"{self.name or '<unnamed>'} ({dom}::{self.op_type}{opset}): {self.reason}"


class UnsupportedModelError(SvodcError):
    """Some nodes cannot be compiled. Lists every one of them, not just the first."""

    def __init__(self, nodes: list[UnsupportedNode]):
        self.nodes = nodes
        listing = "; ".join(str(n) for n in nodes)
        super().__init__(f"{len(nodes)} unsupported node{'s' if len(nodes) != 1 else ''}: {listing}")


class InputShapeError(SvodcError):
    """A graph input has a dimension that is not known at compile time and was not fixed."""


class TargetError(SvodcError):
    """The target string names an architecture, CPU or feature svodc does not know."""


class CodegenError(SvodcError):
    """LLVM rejected or crashed on generated code (a compiler bug: please report it)."""


class ToolMissingError(SvodcError):
    """A tool a target needs is not installed (ld.lld for AMD GPU code objects). The message says
    what to install."""


class LinkError(SvodcError):
    """The code image cannot be linked: an undefined symbol, an unsupported relocation, or a
    writable section. A code image must be self-contained and read-only."""


class BundleError(SvodcError):
    """The compiled model does not fit the bundle format (a tensor over its size limits, ...)."""


class OutputWriteError(SvodcError):
    """The bundle cannot be written to the requested path."""


class TestVectorError(SvodcError):
    """Test vectors were asked for (--test-vectors) but cannot be made for this model."""

    __test__ = False  # not a pytest class


class WeightsError(SvodcError):
    """Weights from outside the model (a safetensors file, ONNX external data) cannot be read or do not
    fit the model: the message names the file and the tensor."""


class PrecisionError(SvodcError):
    """A --precision the compilation cannot honour (an unknown name, or a target that takes fp32 only)."""
