"""String tensors: interned at compile time, compared as ids at run time.

A string tensor is a tensor of `dtypes.string`: int32 ids. Every string the model holds (string
initializers and constants, LabelEncoder keys, a string `--input-value`) is interned here, at import,
into the model's vocabulary: the first string met gets id 0, the next new one id 1, and so on. Import
order is deterministic, so the vocabulary is too (bundles stay byte-identical). The bundle carries it;
at run time svodrt gives each input string its vocabulary id, or a new id past the vocabulary that is
the same for equal strings in one call (svodrt_strings/ids.py).

Invariant: a compiled model's outputs depend on string ids only through id equality and through which
vocabulary entry an id is, never through an id's value past the vocabulary. Two consequences: Equal of
two string tensors is a comparison of ids, correct for any strings; and the handlers that may touch a
string tensor are exactly those registered with `strings=True` (movement and selection ops, which move
ids without reading them, Equal, LabelEncoder). Every other op on a string tensor is refused at import
with the node's name (string_use_problem), never compiled wrongly. String work on run-time strings is
svodrt's (the string program, format 1.8): its results that code reads are code inputs made here
(edge_input), interned at run time like any string input, so the invariant holds for them too.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from svodc.frontend.dtypes import UnsupportedDType
from svodc.frontend.values import EdgeStrings, OptionalValue, SequenceValue, Value
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConstData, InputArg, Ops
from svodc.ir.uop import UOp


class Vocabulary:
    """The strings of one model, numbered in the order the import first meets them, and the string
    program's results that code reads (`edge_inputs`, format 1.8), in the order they were made, and its
    checks."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self.edge_inputs: dict[str, tuple[EdgeStrings, UOp]] = {}
        self.edge_checks: list[EdgeStrings] = []  # OneHotEncoder (zeros=0) of an input: svodrt refuses unknown values

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def strings(self) -> tuple[str, ...]:
        return tuple(self._ids)  # dicts keep insertion order: index = id

    def intern(self, s: str | bytes, where: str = "a string") -> int:
        if isinstance(s, bytes):
            try:
                s = s.decode("utf-8")
            except UnicodeDecodeError:
                raise UnsupportedDType(f"{where}: {s[:40]!r} is not UTF-8 (svodrt handles strings as text)") from None
        if not isinstance(s, str):
            raise UnsupportedDType(f"{where}: {s!r:.40} is a {type(s).__name__}, not a string")
        return self._ids.setdefault(s, len(self._ids))

    def ids(self, array: np.ndarray | Iterable, where: str = "a string tensor") -> np.ndarray:
        """An array of strings (str or UTF-8 bytes) as an int32 array of their ids, same shape."""
        a = np.asarray(array, dtype=object)
        flat = [self.intern(s, where) for s in a.reshape(-1).tolist()]
        return np.array(flat, dtype=np.int32).reshape(a.shape)

    def constant(self, array: np.ndarray | Iterable, where: str = "a string tensor") -> UOp:
        """A string constant: a WEIGHT of dtypes.string holding the strings' ids."""
        return UOp(Ops.WEIGHT, dtypes.string, (), ConstData(self.ids(array, where)))


def edge_input(vocabulary: Vocabulary, v: EdgeStrings) -> UOp:
    """The code input that svodrt fills with a string op's result (one INPUT per result, made when code
    first reads it; its shape must not depend on the strings)."""
    if v.name not in vocabulary.edge_inputs:
        assert v.shape is not None, "a result whose shape depends on the strings is only a graph output"
        vocabulary.edge_inputs[v.name] = (v, UOp(Ops.INPUT, v.dtype, (), InputArg(v.name, v.shape)))
    return vocabulary.edge_inputs[v.name][1]


def is_string(value: Value | None) -> bool:
    """A string tensor, or a sequence or optional of them."""
    if isinstance(value, EdgeStrings):
        return value.dtype is dtypes.string
    if isinstance(value, OptionalValue):
        return is_string(value.value)
    if isinstance(value, SequenceValue):
        return value.dtype is dtypes.string
    return isinstance(value, UOp) and value.dtype is dtypes.string


def string_use_problem(op_type: str, inputs: Iterable[Value | None], outputs: Iterable[Value | None]) -> str | None:
    """Why an op that was not written for strings cannot take or make these values (None: it may)."""
    if any(is_string(v) for v in inputs):
        return (f"{op_type} on string tensors is not supported: svod compiles strings as ids, into Equal, "
                "LabelEncoder (string keys) and ops that only move or select elements")
    if any(is_string(v) for v in outputs):
        return f"{op_type} producing a string tensor is not supported (svod computes no new strings)"
    return None
