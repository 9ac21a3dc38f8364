"""What an ONNX value is during import: a tensor (a UOp), a sequence of tensors, or an optional.

Sequences and optionals exist only in the frontend: their lengths and presence must be known at
compile time, so a sequence is a tuple of tensor UOps and an optional is a value or nothing. Ops on
them (SequenceAt, SequenceInsert, OptionalHasElement...) are list operations at import time; only
the tensors reach the IR.
"""

from __future__ import annotations

from dataclasses import dataclass

from svodc.ir.dtypes import DType
from svodc.ir.uop import UOp


@dataclass(frozen=True)
class SequenceValue:
    items: tuple[UOp, ...]
    dtype: DType  # the element type, known even for an empty sequence

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class OptionalValue:
    value: UOp | SequenceValue | None  # None: the optional holds no element

    @property
    def has_element(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class ZipMapValue:
    """ai.onnx.ml ZipMap's sequence of maps: row i is {keys[j]: scores[i, j]}. Only a graph output can
    take it; the bundle output is the scores tensor, with the keys in the manifest (format 1.6)."""

    scores: UOp
    keys: tuple[int | str, ...]


@dataclass(frozen=True)
class EdgeStrings:
    """A string op's result on run-time strings, which svodrt computes in Python before native code runs
    (format 1.8's string program; docs/architecture.md, strings). `sources` name graph inputs or earlier
    results (or hold a constant string as [s]). A result of a known shape that code reads becomes a code
    input svodrt fills (frontend/strings.py edge_input); one whose shape depends on the strings
    (shape None) can only be a graph output, which svodrt returns itself (1.6 `edge_outputs`)."""

    name: str  # the ONNX value: the code input's name when code reads it
    op: str
    sources: tuple[str | list[str], ...]
    attrs: dict
    dtype: DType
    shape: tuple[int, ...] | None
    bounded: tuple[tuple[int, str, int, int], ...] = ()  # (axis, dim name, lo, hi): shape has hi there


Value = UOp | SequenceValue | OptionalValue | ZipMapValue | EdgeStrings


def describe(v: Value | None) -> str:
    if v is None:
        return "nothing"
    if isinstance(v, SequenceValue):
        return f"a sequence of {len(v)} {v.dtype.name} tensors"
    if isinstance(v, EdgeStrings):
        return f"the {v.op} of {v.sources[0]!r}, whose shape depends on the strings: only a graph output takes it"
    if isinstance(v, ZipMapValue):
        return f"a sequence of {v.scores.shape[0]} maps (ZipMap)"
    if isinstance(v, OptionalValue):
        return f"an optional holding {describe(v.value)}"
    return f"a {v.dtype.name} tensor of shape {list(v.shape)}"
