"""Typed readers for manifest fields, and the records built from a verified manifest. Every reader
checks type and range and raises BundleFormatError naming the field's path (`variants[1].fixups[3]`);
bool is refused wherever an integer is expected."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from svodrt.errors import BundleFormatError
from svodrt.format import DTYPES, MAX_BYTES, MAX_ITEMS, MAX_NAME, MAX_RANK, MAX_STRING


def fail(where: str, msg: str) -> BundleFormatError:
    return BundleFormatError(f"manifest field {where}: {msg}")


def field(d: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(d, dict):
        raise fail(where, f"is a {type(d).__name__}, expected a map")
    if key not in d:
        raise fail(f"{where}.{key}", "is missing")
    v = d[key]
    if (isinstance(v, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))) or not isinstance(v, kind):
        names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise fail(f"{where}.{key}", f"has type {type(v).__name__}, expected {names}")
    return v


def check_uint(v: Any, where: str, limit: int = MAX_BYTES) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise fail(where, f"has type {type(v).__name__}, expected an integer")
    if not 0 <= v <= limit:
        raise fail(where, f"= {v} is out of range [0, {limit}]")
    return v


def uint(d: Any, key: str, where: str, limit: int = MAX_BYTES) -> int:
    return check_uint(field(d, key, int, where), f"{where}.{key}", limit)


def name(d: Any, key: str, where: str, allow_empty: bool = False) -> str:
    v = field(d, key, str, where)
    if len(v) > MAX_NAME or (not v and not allow_empty) or "\x00" in v:
        raise fail(f"{where}.{key}", f"{v[:40]!r} must be 1..{MAX_NAME} characters without NUL")
    return v


def items(d: Any, key: str, where: str, limit: int = MAX_ITEMS) -> list:
    v = field(d, key, list, where)
    if len(v) > limit:
        raise fail(f"{where}.{key}", f"has {len(v)} items, over the limit {limit}")
    return v


def uints(d: Any, key: str, where: str, limit: int = MAX_BYTES) -> list[int]:
    return [check_uint(x, f"{where}.{key}[{i}]", limit) for i, x in enumerate(items(d, key, where))]


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    kind: str
    offset: int
    length: int
    sha256: bytes


@dataclass(frozen=True)
class Dim:  # a bounded dim (format 1.5): its size is chosen per call in [lo, hi]
    name: str
    lo: int
    hi: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]  # at the dims' upper bounds: the memory the code is laid out for
    dims: tuple[tuple[int, Dim, int], ...] = ()  # (axis, dim, factor): that axis is factor * the dim's value

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][1]

    def __str__(self) -> str:
        shown: list = list(self.shape)
        for axis, d, k in self.dims:
            shown[axis] = f"{d.name}={d.lo}..{d.hi}" if k == 1 else f"{k}*{d.name}={k * d.lo}..{k * d.hi}"
        return f"{self.name}: {self.dtype}[{', '.join(map(str, shown))}]"


def dim_table(m: Any) -> dict[str, Dim]:
    """The manifest's `dims` (format 1.5) in `dims` array order ({} if absent); `inputs` is descriptive."""
    if "dims" not in m:
        return {}
    out: dict[str, Dim] = {}
    for i, d in enumerate(items(m, "dims", "manifest")):
        dim = Dim(name(d, "name", f"dims[{i}]"), uint(d, "lo", f"dims[{i}]"), uint(d, "hi", f"dims[{i}]"))
        if not 1 <= dim.lo <= dim.hi or dim.name in out:
            raise fail(f"dims[{i}]", f"{dim.name!r} {dim.lo}..{dim.hi} must be a new name with 1 <= lo <= hi")
        out[dim.name] = dim
    return out


def _dim_axis(v: str, dims: dict[str, Dim] | None, where: str) -> tuple[Dim, int]:
    dim_name, _, k = v.partition("*")
    if dim_name not in (dims or {}) or not (k == "" or (k.isdigit() and 0 < int(k) <= MAX_BYTES)):
        raise fail(where, f"{v[:40]!r} is neither a size nor a bounded dim of the manifest's dims")
    return dims[dim_name], int(k or 1)


def tensor(d: Any, where: str, dims: dict[str, Dim] | None = None) -> TensorInfo:
    t_name = name(d, "name", where)
    dtype = field(d, "dtype", str, where)
    if dtype not in DTYPES:
        raise fail(f"{where}.dtype", f"{dtype[:40]!r} is not one of {', '.join(DTYPES)}")
    raw = list(items(d, "shape", where))
    sym = tuple((i, *_dim_axis(v, dims, f"{where}.shape[{i}]")) for i, v in enumerate(raw) if isinstance(v, str))
    for i, dim, k in sym:
        raw[i] = dim.hi * k
    shape = tuple(check_uint(x, f"{where}.shape[{i}]") for i, x in enumerate(raw))
    if len(shape) > MAX_RANK:
        raise fail(f"{where}.shape", f"has rank {len(shape)}, over the limit {MAX_RANK}")
    # Each dim is at most MAX_BYTES, and the running product is checked, so no product is huge.
    n = DTYPES[dtype][1]
    for dim in shape:
        n *= dim
        if n > MAX_BYTES:
            raise fail(where, f"shape {list(shape)} is over {MAX_BYTES} bytes")
    return TensorInfo(t_name, dtype, shape, sym)


def vocabulary(m: Any) -> tuple[str, ...]:
    """The manifest's `vocabulary` (format 1.4; required when an input is a string): distinct strings,
    each at most MAX_STRING characters, at most MAX_ITEMS of them. Its order is the ids' meaning."""
    v = items(m, "vocabulary", "manifest")
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


@dataclass(frozen=True)
class Launch:
    """One GPU kernel launch: the kernel (in the plan) whose buffers are its arguments, the symbol in
    the code object, grid and block sizes."""

    kernel: int
    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]


@dataclass(frozen=True)
class Variant:
    index: int
    arch: str
    cpu: str
    features: tuple[str, ...]
    section: Section  # the code image; GPU variants: the code object (PTX for cuda)
    entry: int
    kernels: tuple[int, ...]
    fixups: tuple[int, ...]
    kind: str = "cpu"  # "cpu", or a GPU kind: "cuda", "hip"
    launches: tuple[Launch, ...] = ()
    cubin: Section | None = None

    def describe(self) -> str:
        return f"{self.arch}:{self.cpu}" if self.kind == "cpu" else f"{self.kind}:{self.cpu}"


@dataclass(frozen=True)
class KernelInfo:
    name: str
    params: tuple[int, ...]
    provenance: tuple[str, ...]


@dataclass(frozen=True)
class TestVector:
    """A reference input and the outputs the compiler expects, with a tolerance per output."""

    __test__ = False  # not a pytest class

    inputs: tuple[bytes, ...]
    outputs: tuple[bytes, ...]
    tolerance: tuple[float, ...]


def zipmaps(m: Any, outputs: list[TensorInfo]) -> tuple[tuple[str, tuple], ...]:
    """The manifest's `zipmaps` (format 1.5): [output name, keys] per float32 [N, len(keys)] output that
    run() returns as a list of {key: score} dicts (ai.onnx.ml ZipMap); keys all str or all int."""
    if "zipmaps" not in m:
        return ()
    by_name, out = {t.name: t for t in outputs}, []
    for i, z in enumerate(items(m, "zipmaps", "manifest")):
        if not isinstance(z, list) or len(z) != 2 or not isinstance(z[1], list):
            raise fail(f"zipmaps[{i}]", "must be [output name, keys]")
        t = by_name.get(z[0]) if isinstance(z[0], str) else None
        if t is None or t.dtype != "float32" or len(t.shape) != 2 or t.shape[1] != len(z[1]):
            raise fail(f"zipmaps[{i}]", f"names no float32 [N, {len(z[1])}] output")
        if not (all(type(k) is str for k in z[1]) or all(type(k) is int for k in z[1])):
            raise fail(f"zipmaps[{i}][1]", "keys must be all str or all int")
        out.append((z[0], tuple(z[1])))
    return tuple(out)


def edge_outputs(m: Any, inputs: list[TensorInfo], outputs: list[TensorInfo]) -> tuple[tuple[str, str, dict], ...]:
    """The manifest's `edge_outputs` (format 1.5): [output, "StringNormalizer", string input, {"case":
    NONE|LOWER|UPPER, "case_sensitive": bool, "stopwords": [str]}], outputs run() computes itself."""
    strings = {t.name for t in inputs if t.dtype == "string"}
    taken, out = {t.name for t in outputs}, []
    for i, e in enumerate(items(m, "edge_outputs", "manifest") if "edge_outputs" in m else []):
        a = e[3] if isinstance(e, list) and len(e) == 4 and isinstance(e[3], dict) else {}
        if (not isinstance(e, list) or len(e) != 4 or e[1] != "StringNormalizer" or e[2] not in strings
                or not isinstance(e[0], str) or e[0] in taken or a.get("case") not in ("NONE", "LOWER", "UPPER")
                or type(a.get("case_sensitive")) is not bool or not isinstance(a.get("stopwords"), list)
                or not all(isinstance(w, str) for w in a["stopwords"]) or len(a) != 3):
            raise fail(f"edge_outputs[{i}]", "must be [new output name, 'StringNormalizer', string input, "
                       "{case, case_sensitive, stopwords}]")
        taken.add(e[0])
        out.append((e[0], e[2], a))
    return tuple(out)
