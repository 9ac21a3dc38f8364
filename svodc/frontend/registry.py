"""The operator registry: ONNX (domain, op type, op version) -> handler.

A handler declares the exact ONNX op versions it implements (the `since_version`s of the op's
schemas), so a model that uses a newer version of an op, with semantics no handler has seen, fails
with an error naming the op and both versions instead of being compiled wrongly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx
import onnx.defs

if TYPE_CHECKING:
    from svodc.frontend.context import NodeContext
    from svodc.ir.uop import UOp

HandlerFn = Callable[["NodeContext"], "list[UOp | None] | UOp"]


@dataclass(frozen=True)
class Handler:
    domain: str
    op_type: str
    versions: tuple[int, ...]
    fn: HandlerFn
    # Correct on string tensors (ids, svodc/frontend/strings.py): it only moves, selects or compares
    # elements, or handles strings itself. The importer refuses string values to every other handler.
    strings: bool = False


_REGISTRY: dict[tuple[str, str], list[Handler]] = {}


def onnx_op(op_type: str, *versions: int, domain: str = "", strings: bool = False) -> Callable[[HandlerFn], HandlerFn]:
    """Register a handler for the given op versions: @onnx_op("Softmax", 13). strings=True: the handler
    is correct on string tensors (see Handler.strings)."""
    if not versions:
        raise ValueError(f"handler for {op_type} must name the op versions it implements")

    def register(fn: HandlerFn) -> HandlerFn:
        _REGISTRY.setdefault((domain, op_type), []).append(Handler(domain, op_type, tuple(versions), fn, strings))
        return fn

    return register


class NoHandler(LookupError):
    """Why a node cannot be handled: the text goes into UnsupportedNode.reason."""


def schema_version(domain: str, op_type: str, opset: int) -> int:
    """The since_version of the op's schema that a model importing `opset` of `domain` uses."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except onnx.defs.SchemaError:
        raise NoHandler(f"{op_type} is not an operator of {domain or 'ai.onnx'} opset {opset}") from None


# Domains whose schemas the onnx package does not carry: onnxruntime's contrib ops. An op of such a
# domain resolves to the newest version a handler implements that the model's opset of the domain
# includes (every com.microsoft op so far has the single version 1).
EXTERNAL_DOMAINS = frozenset({"com.microsoft"})


def _external_version(handlers: list[Handler], domain: str, op_type: str, opset: int) -> int:
    known = [v for h in handlers for v in h.versions if v <= opset]
    if not known:
        raise NoHandler(f"{domain}.{op_type} has no implemented version <= opset {opset}")
    return max(known)


def lookup(domain: str, op_type: str, opset: int) -> tuple[Handler, int]:
    """The handler for this op at the model's opset, and the op version it resolved to."""
    handlers = _REGISTRY.get((domain, op_type))
    if not handlers:
        raise NoHandler("operator not supported")
    if domain in EXTERNAL_DOMAINS:
        version = _external_version(handlers, domain, op_type, opset)
    else:
        version = schema_version(domain, op_type, opset)
    for h in handlers:
        if version in h.versions:
            return h, version
    have = sorted({v for h in handlers for v in h.versions})
    raise NoHandler(f"op version {version} (opset {opset}) is not implemented; implemented versions: {have}")
