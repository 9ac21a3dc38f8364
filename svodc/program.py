"""The types that stages hand to each other (svodc/api.py chains the stages):

- ImportedGraph: what the frontend hands to the passes (tensor-level UOps and their provenance);
- Program: what the passes hand to codegen and the bundle writer.

Both live here, below every stage, so a pass imports neither the frontend (which imports onnx and
registers its handlers as a side effect) nor codegen.

A Program is a list of kernels in execution order, each a loop-level UOp AST whose PARAM i is `params[i]`, and the
buffers they read and write, with their placement:
- input / output: the caller's arrays, by slot (position in the graph's inputs / outputs);
- weight: an offset in the weights section (read-only, mapped from the bundle);
- scratch: an offset in the arena (one allocation per inference call).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from svodc.ir.dtypes import DType
from svodc.ir.ops import ConstData
from svodc.ir.provenance import Provenance
from svodc.ir.shapes import prod
from svodc.ir.uop import UOp

if TYPE_CHECKING:  # an annotation only: the frontend (and onnx) stays out of the passes' imports
    from svodc.frontend.dims import DimSpec
    from svodc.frontend.values import EdgeStrings


@dataclass
class ImportedGraph:
    inputs: list[tuple[str, UOp]]  # bundle inputs in declaration order (INPUT nodes; frontend/boundary.py)
    outputs: list[tuple[str, UOp]]  # bundle outputs in declaration order
    provenance: Provenance
    producer: str  # "name version" of the tool that made the model, for the manifest
    expanded_ops: frozenset[str] = frozenset()  # ops imported through their ONNX function bodies
    vocabulary: tuple[str, ...] = ()  # the model's strings; string id i is vocabulary[i] (frontend/strings.py)
    zipmaps: tuple[tuple[str, tuple[int | str, ...]], ...] = ()  # (output, keys): svodrt returns a list of dicts
    # svodrt's string program (format 1.8): (name, step, "input" (a code input it fills) | "output" (one it returns))
    edge_outputs: tuple[tuple[str, EdgeStrings, str], ...] = ()
    op_types: dict[str, str] | None = None  # node name -> op type (graph_import.GraphImporter.op_types)
    # Bounded symbolic dims (frontend/dims.py), in the order met, and which input axes each sizes; the
    # INPUT nodes have their upper bounds.
    dims: tuple[DimSpec, ...] = ()
    input_dims: dict[str, dict[int, str]] = field(default_factory=dict)


class BufferKind(enum.Enum):
    INPUT = "input"
    OUTPUT = "output"
    WEIGHT = "weight"
    SCRATCH = "scratch"


@dataclass(eq=False)
class Buffer:
    id: int
    kind: BufferKind
    dtype: DType
    shape: tuple[int, ...]
    name: str
    data: ConstData | None = None  # weights only
    slot: int = -1  # inputs and outputs: index among the graph's inputs / outputs
    offset: int = -1  # weights: offset in the weights section; scratch: offset in the arena
    # inputs and outputs of a bundle with bounded dims: per axis a passes.dynamic.SymAxis or None
    # (`shape` is the upper bound); () when every axis is static
    dims: tuple = ()
    # A view (passes/steploop.py): these elements of `view_of`'s storage from element `view_offset`, moved by
    # `step_stride` elements per step of the step loop whose kernels read or write it (0: not moved).
    view_of: Buffer | None = None
    view_offset: int = 0
    step_stride: int = 0

    @property
    def storage(self) -> Buffer:
        """The buffer whose memory this is: itself, or what it views."""
        return self.view_of if self.view_of is not None else self

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize

    def __repr__(self) -> str:
        where = f"slot {self.slot}" if self.slot >= 0 else f"+{self.offset}"
        return f"Buffer#{self.id}({self.kind.value} {self.name} {self.dtype.name}{list(self.shape)} {where})"


# When a kernel runs (passes/branches.py): when one of the conjunctions holds, each a tuple of (flag buffer, value),
# the flag a one-byte bool some earlier kernel wrote; () runs it always.
KernelGuard = tuple[tuple[tuple[Buffer, bool], ...], ...]


@dataclass(eq=False)
class Kernel:
    name: str
    ast: UOp  # loop-level SINK(STORE ...)
    params: list[Buffer]  # PARAM i <-> params[i]; params[0] is written, the rest are read
    provenance: list[str] = field(default_factory=list)  # ONNX node names this kernel computes
    kind: str = "loop"  # "gemm" (a contraction kernel), "loop" (generic loops) or "copy"; informative
    guard: KernelGuard = ()
    # In a step loop (Program.loops): the entry passes the step in `part` (step * nparts + part) and the
    # wrapper moves each parameter by its step_stride per step (codegen/llvm_ir.render_wrapper).
    stepped: bool = False


@dataclass
class Program:
    inputs: list[Buffer]
    outputs: list[Buffer]
    kernels: list[Kernel]
    weights: list[Buffer]  # placed in the weights section, by offset
    scratch: list[Buffer]  # placed in the arena, by offset
    arena_size: int = 0
    weights_size: int = 0
    producer: str = ""  # the tool that made the source model
    vocabulary: tuple[str, ...] = ()  # string id i stands for vocabulary[i] (svodc/frontend/strings.py)
    dims: tuple = ()  # bounded input dims (frontend.dims.DimSpec), in the order of the entry's `dims` array
    zipmaps: tuple[tuple[str, tuple[int | str, ...]], ...] = ()  # (output, keys): returned as a list of dicts
    edge_outputs: tuple = ()  # ImportedGraph.edge_outputs: svodrt's string program
    # Step loops (passes/steploop.py): (first kernel, end kernel, trips): kernels[first:end] run `trips`
    # times in order, step 0 first, before kernels[end].
    loops: list[tuple[int, int, int]] = field(default_factory=list)
