"""Reading and verifying a bundle, before anything of it is mapped or run.

Checks, in order: header (magic, version, sizes), manifest (bounds, size limit, digest, msgpack,
schema: every field's type and range), sections (inside the file, aligned, not overlapping, sha256),
tensors and buffers (known dtypes, sizes inside the arena or the weights section), kernels (every
parameter names a known buffer) and code variants (entry, kernel and fixup offsets inside their
section). Each failure is a BundleFormatError naming the field or section and the offset.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass
from typing import Any

import msgpack
import zstandard

from svodrt.errors import BundleFormatError, BundleVersionError
from svodrt.features import BYTE_ORDER
from svodrt.format import (
    DTYPES,
    FLAG_MANIFEST_ZSTD,
    FORMAT_MAJOR,
    HEADER_SIZE,
    MAGIC,
    MAX_MANIFEST_RAW,
    SECTION_ALIGN,
    Header,
    unpack_header,
)

MAX_DIM = 1 << 40  # no tensor dimension or byte size may exceed this (keeps size arithmetic sane)


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    kind: str
    offset: int
    length: int
    sha256: bytes


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][1]


@dataclass(frozen=True)
class Variant:
    arch: str
    cpu: str
    features: tuple[str, ...]
    section: Section
    entry: int
    kernels: tuple[int, ...]
    fixups: tuple[int, ...]


@dataclass(frozen=True)
class KernelInfo:
    name: str
    params: tuple[int, ...]
    provenance: tuple[str, ...]


@dataclass
class Bundle:
    header: Header
    manifest: dict
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    sections: list[Section]
    variants: list[Variant]
    kernels: list[KernelInfo]
    arena_size: int
    weights: Section
    weights_size: int


def _fail(msg: str) -> BundleFormatError:
    return BundleFormatError(msg)


def _field(d: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(d, dict):
        raise _fail(f"manifest: {where} is not a map")
    if key not in d:
        raise _fail(f"manifest: {where}.{key} is missing")
    v = d[key]
    if (kind is int and isinstance(v, bool)) or not isinstance(v, kind):
        raise _fail(f"manifest: {where}.{key} has type {type(v).__name__}, expected {kind}")
    return v


def _uint(d: Any, key: str, where: str, limit: int = 1 << 62) -> int:
    v = _field(d, key, int, where)
    if not 0 <= v <= limit:
        raise _fail(f"manifest: {where}.{key} = {v} is out of range [0, {limit}]")
    return v


def read_header(data: bytes | memoryview) -> Header:
    if len(data) < HEADER_SIZE:
        raise _fail(f"file is {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header: not a .svod bundle "
                    "or truncated")
    magic, h = unpack_header(bytes(data[:HEADER_SIZE]))
    if magic != MAGIC:
        raise _fail(f"bad magic {magic!r} at offset 0: not a .svod bundle")
    if h.major > FORMAT_MAJOR:
        raise BundleVersionError(f"bundle format {h.major}.{h.minor} is newer than this runtime reads "
                                 f"({FORMAT_MAJOR}.x): upgrade svodrt")
    if h.major < 1:
        raise _fail(f"bundle format major version {h.major} is invalid")
    if h.header_size < HEADER_SIZE or h.header_size > SECTION_ALIGN:
        raise _fail(f"header size {h.header_size} at offset 12 is invalid")
    if h.flags & ~FLAG_MANIFEST_ZSTD or h.reserved:
        raise _fail(f"header flags {h.flags:#x} / reserved {h.reserved:#x} at offset 16 hold unknown bits")
    if h.file_size != len(data):
        raise _fail(f"header says the file is {h.file_size} bytes, it is {len(data)} bytes (truncated or "
                    "extended)")
    end = h.manifest_offset + h.manifest_size
    if h.manifest_offset < h.header_size or end > len(data) or h.manifest_size == 0:
        raise _fail(f"manifest [{h.manifest_offset}, {end}) lies outside the file (size {len(data)})")
    if h.manifest_raw_size > MAX_MANIFEST_RAW:
        raise _fail(f"manifest size {h.manifest_raw_size} exceeds the limit {MAX_MANIFEST_RAW}")
    return h


def read_manifest(data: bytes | memoryview, h: Header) -> dict:
    stored = bytes(data[h.manifest_offset: h.manifest_offset + h.manifest_size])
    if h.flags & FLAG_MANIFEST_ZSTD:
        try:
            raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=h.manifest_raw_size)
        except zstandard.ZstdError as e:
            raise _fail(f"manifest at offset {h.manifest_offset} does not decompress: {e}") from None
    else:
        raw = stored
    if len(raw) != h.manifest_raw_size:
        raise _fail(f"manifest at offset {h.manifest_offset} is {len(raw)} bytes, header says {h.manifest_raw_size}")
    if hashlib.sha256(raw).digest()[:8] != h.manifest_digest:
        raise _fail(f"manifest at offset {h.manifest_offset} fails its checksum (header offset 56)")
    try:
        m = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several types for malformed input
        raise _fail(f"manifest at offset {h.manifest_offset} is not valid msgpack: {e}") from None
    if not isinstance(m, dict):
        raise _fail("manifest is not a map")
    return m


def _tensor(d: Any, where: str) -> TensorInfo:
    name = _field(d, "name", str, where)
    dtype = _field(d, "dtype", str, where)
    if dtype not in DTYPES:
        raise _fail(f"manifest: {where}.dtype {dtype!r} is not a known dtype")
    shape = _field(d, "shape", list, where)
    if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_DIM for s in shape):
        raise _fail(f"manifest: {where}.shape {shape!r} must be a list of dimensions in [0, {MAX_DIM}]")
    t = TensorInfo(name, dtype, tuple(shape))
    if t.nbytes > MAX_DIM:
        raise _fail(f"manifest: {where} is {t.nbytes} bytes, over the limit {MAX_DIM}")
    return t


def _sections(m: dict, h: Header, data: bytes | memoryview, verify: bool) -> list[Section]:
    out = []
    prev_end = h.header_size
    for i, s in enumerate(_field(m, "sections", list, "manifest")):
        where = f"sections[{i}]"
        sec = Section(i, _field(s, "name", str, where), _field(s, "kind", str, where),
                      _uint(s, "offset", where), _uint(s, "length", where), _field(s, "sha256", bytes, where))
        if sec.offset % SECTION_ALIGN:
            raise _fail(f"section {sec.name!r} offset {sec.offset} is not {SECTION_ALIGN}-aligned")
        if sec.offset < prev_end or sec.offset + sec.length > h.manifest_offset:
            raise _fail(f"section {sec.name!r} [{sec.offset}, {sec.offset + sec.length}) overlaps the header, "
                        "another section or the manifest")
        if len(sec.sha256) != 32:
            raise _fail(f"section {sec.name!r} checksum has {len(sec.sha256)} bytes, expected 32")
        if verify and hashlib.sha256(data[sec.offset: sec.offset + sec.length]).digest() != sec.sha256:
            raise _fail(f"section {sec.name!r} at offset {sec.offset} ({sec.length} bytes) fails its sha256 "
                        "checksum: the file is damaged")
        prev_end = sec.offset + sec.length
        out.append(sec)
    return out


def _variant(v: Any, i: int, sections: list[Section]) -> Variant:
    where = f"variants[{i}]"
    si = _uint(v, "section", where)
    if si >= len(sections) or sections[si].kind != "code":
        raise _fail(f"manifest: {where}.section {si} is not a code section")
    sec = sections[si]
    entry = _uint(v, "entry", where)
    kernels = _field(v, "kernels", list, where)
    fixups = _field(v, "fixups", list, where)
    for what, offs, width in (("entry", [entry], 1), ("kernels", kernels, 1), ("fixups", fixups, 8)):
        for o in offs:
            if not isinstance(o, int) or isinstance(o, bool) or not 0 <= o <= sec.length - width:
                raise _fail(f"manifest: {where}.{what} offset {o!r} is outside code section {sec.name!r} "
                            f"({sec.length} bytes)")
    if sorted(set(fixups)) != fixups or any(b - a < 8 for a, b in itertools.pairwise(fixups)):
        raise _fail(f"manifest: {where}.fixups must be sorted and 8 bytes apart")
    feats = _field(v, "features", list, where)
    if not all(isinstance(f, str) for f in feats):
        raise _fail(f"manifest: {where}.features must be a list of names")
    return Variant(_field(v, "arch", str, where), _field(v, "cpu", str, where), tuple(feats), sec, entry,
                   tuple(kernels), tuple(fixups))


def parse_bundle(data: bytes | memoryview, verify_checksums: bool = True) -> Bundle:
    h = read_header(data)
    m = read_manifest(data, h)
    fmt = _field(m, "format", list, "manifest")
    if fmt != [h.major, h.minor]:
        raise _fail(f"manifest format {fmt} disagrees with the header version {h.major}.{h.minor}")
    sections = _sections(m, h, data, verify_checksums)
    inputs = [_tensor(t, f"inputs[{i}]") for i, t in enumerate(_field(m, "inputs", list, "manifest"))]
    outputs = [_tensor(t, f"outputs[{i}]") for i, t in enumerate(_field(m, "outputs", list, "manifest"))]
    names = [t.name for t in inputs] + [t.name for t in outputs]
    if len(set(t.name for t in inputs)) != len(inputs) or len(set(t.name for t in outputs)) != len(outputs):
        raise _fail(f"manifest: input or output names repeat: {names}")
    for group, items in (("inputs", m["inputs"]), ("outputs", m["outputs"])):
        for i, t in enumerate(items):
            if _uint(t, "slot", f"{group}[{i}]") != i:
                raise _fail(f"manifest: {group}[{i}].slot must be {i}")
    arena = _uint(m, "arena_size", "manifest", MAX_DIM)
    weights_size = _uint(m, "weights_size", "manifest", MAX_DIM)
    wsec = [s for s in sections if s.kind == "weights"]
    if len(wsec) != 1 or wsec[0].length < weights_size:
        raise _fail("manifest: expected one weights section holding weights_size bytes")
    ids = {_uint(t, "id", f"{g}[{i}]") for g in ("inputs", "outputs") for i, t in enumerate(m[g])}
    for i, b in enumerate(_field(m, "buffers", list, "manifest")):
        where = f"buffers[{i}]"
        t = _tensor(b, where)
        kind = _field(b, "kind", str, where)
        limit = {"weight": weights_size, "scratch": arena}.get(kind)
        if limit is None:
            raise _fail(f"manifest: {where}.kind {kind!r} must be weight or scratch")
        off = _uint(b, "offset", where)
        if off + t.nbytes > limit:
            raise _fail(f"manifest: {where} [{off}, {off + t.nbytes}) lies outside the {kind} area ({limit} bytes)")
        ids.add(_uint(b, "id", where))
    kernels = []
    for i, k in enumerate(_field(m, "kernels", list, "manifest")):
        where = f"kernels[{i}]"
        params = _field(k, "params", list, where)
        if any(p not in ids for p in params):
            raise _fail(f"manifest: {where}.params {params} name unknown buffers")
        prov = _field(k, "provenance", list, where)
        kernels.append(KernelInfo(_field(k, "name", str, where), tuple(params), tuple(map(str, prov))))
    variants = [_variant(v, i, sections) for i, v in enumerate(_field(m, "variants", list, "manifest"))]
    for i, v in enumerate(variants):
        if len(v.kernels) != len(kernels):
            raise _fail(f"manifest: variants[{i}] has {len(v.kernels)} kernel offsets for {len(kernels)} kernels")
    if not variants:
        raise _fail("manifest: the bundle has no code variant")
    # [cross] format 1.1: a bundle's data is in one byte order, that of all its variants' architectures.
    byte_order = _field(m, "byte_order", str, "manifest")
    if byte_order not in ("little", "big"):
        raise _fail(f"manifest: byte_order {byte_order!r} must be 'little' or 'big'")
    for i, v in enumerate(variants):
        if BYTE_ORDER.get(v.arch, byte_order) != byte_order:
            raise _fail(f"manifest: variants[{i}] is for {v.arch}, whose data is {BYTE_ORDER[v.arch]}-endian, but the "
                        f"bundle's byte_order is {byte_order!r}")
    return Bundle(h, m, inputs, outputs, sections, variants, kernels, arena, wsec[0], weights_size)
