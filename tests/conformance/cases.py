"""The node test cases of the pinned onnx package, with the op type each one tests and whether it is
in scope.

Cases are built in memory (`collect_testcases`), never read from the data files, so the suite is the
one the installed onnx defines. A case's op type is the op of its single node; an `_expanded` case
(the op replaced by its function body) counts for the op of the case it expands.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

# Out of scope by decision (issue 3): string processing, image decoding and training-only ops.
OUT_OF_SCOPE = {
    "StringConcat": "string op", "StringSplit": "string op", "StringNormalizer": "string op",
    "RegexFullMatch": "string op", "ImageDecoder": "image decoding", "Adagrad": "training op",
    "Adam": "training op", "Momentum": "training op",
}
_EXPANDED_SUFFIXES = ("_expanded_ver18", "_expanded")

Value = np.ndarray | list | None  # a tensor, a sequence (list) or an absent optional (None)


@dataclass(frozen=True)
class Case:
    name: str
    op_type: str
    domain: str
    model: bytes  # serialized ModelProto
    inputs: list[Value]
    outputs: list[Value]
    rtol: float
    atol: float

    @property
    def out_of_scope(self) -> str | None:
        reason = OUT_OF_SCOPE.get(self.op_type)
        return f"out of scope: {reason} {self.op_type}" if reason else None

    @property
    def expanded(self) -> bool:
        return any(s in self.name for s in _EXPANDED_SUFFIXES)


def _value(v):
    """Test data as numpy: some cases give TensorProtos (to keep types like float8 exact)."""
    import onnx
    from onnx import numpy_helper

    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, onnx.SequenceProto):
        return [_value(t) for t in numpy_helper.to_list(v)]
    if isinstance(v, onnx.OptionalProto):
        return _value(numpy_helper.to_optional(v))
    if isinstance(v, list):
        return [_value(t) for t in v]
    return v


def collect_cases() -> list[Case]:
    """Every node test case, in the onnx package's order."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow on purpose (cast tests)
        raw = collect_testcases(None)
    by_name = {c.name: c for c in raw}

    def op_of(c) -> tuple[str, str]:
        for suffix in _EXPANDED_SUFFIXES:
            base = c.name.split(suffix)[0]
            if suffix in c.name and base in by_name:
                return op_of(by_name[base])
        node = c.model.graph.node[0]
        return node.op_type, node.domain

    cases = []
    for c in raw:
        (inputs, outputs), = c.data_sets
        op_type, domain = op_of(c)
        cases.append(Case(c.name, op_type, domain, c.model.SerializeToString(), [_value(v) for v in inputs],
                          [_value(v) for v in outputs], float(c.rtol), float(c.atol)))
    return cases
