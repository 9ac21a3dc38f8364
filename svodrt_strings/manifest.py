"""The manifest's fields for strings at the edge, read by svodrt/schema.py only for a bundle that has them:
`vocabulary` (format 1.4) and `zipmaps` (1.6); `edge_outputs` is program.py's parse_steps."""

from svodrt.format import MAX_STRING
from svodrt.schema import TensorInfo, fail


def parse_vocabulary(v: list) -> tuple[str, ...]:
    """The manifest's `vocabulary` (format 1.4, docs/bundle-format.md "Strings"); its order is the ids' meaning."""
    seen: set[str] = set()
    for i, s in enumerate(v):
        if not isinstance(s, str):
            raise fail(f"vocabulary[{i}]", f"has type {type(s).__name__}, expected str")
        if len(s) > MAX_STRING:
            raise fail(f"vocabulary[{i}]", f"has {len(s)} characters, over the limit {MAX_STRING}")
        if s in seen:
            raise fail(f"vocabulary[{i}]", f"{s[:40]!r} repeats an earlier string")
        seen.add(s)
    return tuple(v)


def parse_zipmaps(raw: list, outputs: list[TensorInfo]) -> tuple[tuple[str, tuple], ...]:
    """The manifest's `zipmaps` (format 1.6): [output name, keys] per float32 [N, len(keys)] output that
    run() returns as a list of {key: score} dicts (ai.onnx.ml ZipMap); keys all str or all int."""
    by_name, out = {t.name: t for t in outputs}, []
    for i, z in enumerate(raw):
        if not isinstance(z, list) or len(z) != 2 or not isinstance(z[1], list):
            raise fail(f"zipmaps[{i}]", "must be [output name, keys]")
        t = by_name.get(z[0]) if isinstance(z[0], str) else None
        if t is None or t.dtype != "float32" or len(t.shape) != 2 or t.shape[1] != len(z[1]):
            raise fail(f"zipmaps[{i}]", f"names no float32 [N, {len(z[1])}] output")
        if not (all(type(k) is str for k in z[1]) or all(type(k) is int for k in z[1])):
            raise fail(f"zipmaps[{i}][1]", "keys must be all str or all int")
        out.append((z[0], tuple(z[1])))
    return tuple(out)
