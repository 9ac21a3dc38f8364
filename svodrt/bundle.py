"""Reading and verifying a bundle before anything of it is mapped or run: the header, the manifest
(inside the file and ending it, bounded, digest, msgpack map), the sections (inside, aligned, in
order, distinct, zero padding, one weights section), then the plan (svodrt/plan.py). Section
checksums are `check_section`'s. Each failure is a BundleFormatError naming field or section and offset."""

from __future__ import annotations

from dataclasses import dataclass, fields

from svodrt.errors import BundleFormatError, BundleVersionError
from svodrt.features import BYTE_ORDER
from svodrt.format import (
    FLAG_MANIFEST_ZSTD,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    HEADER_SIZE,
    MAGIC,
    MAX_BYTES,
    MAX_HEADER_SIZE,
    MAX_MANIFEST_RAW,
    Header,
    section_align,
    unpack_header,
)
from svodrt.plan import Plan, parse_plan
from svodrt.schema import KernelInfo, Section, TensorInfo, TestVector, Variant, field, items, name, uint

__all__ = ["Bundle", "KernelInfo", "Section", "TensorInfo", "TestVector", "Variant", "check_section",
           "parse_bundle"]


@dataclass(frozen=True)
class Bundle(Plan):
    """A verified bundle: the execution plan (svodrt/plan.py) and where it came from."""

    header: Header
    manifest: dict
    sections: list[Section]
    weights: Section


def _fail(msg: str) -> BundleFormatError:
    return BundleFormatError(msg)


def read_header(data: bytes | memoryview) -> Header:
    if len(data) < HEADER_SIZE:
        raise _fail(f"file is {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header: not a .svod bundle "
                    "or truncated")
    magic, h = unpack_header(bytes(data[:HEADER_SIZE]))
    if magic != MAGIC:
        raise _fail(f"bad magic {magic!r} at offset 0: not a .svod bundle")
    if h.major > FORMAT_MAJOR:
        raise BundleVersionError(f"bundle format {h.major}.{h.minor} is newer than this runtime's "
                                 f"{FORMAT_MAJOR}.{FORMAT_MINOR} (it reads {FORMAT_MAJOR}.x; header offset 8): "
                                 "upgrade svodrt")
    if h.major < 1:
        raise _fail(f"bundle format major version {h.major} at offset 8 is invalid")
    if not HEADER_SIZE <= h.header_size <= MAX_HEADER_SIZE:
        raise _fail(f"header size {h.header_size} at offset 12 is outside [{HEADER_SIZE}, {MAX_HEADER_SIZE}]")
    if h.flags & ~FLAG_MANIFEST_ZSTD or h.reserved:
        raise _fail(f"header flags {h.flags:#x} / reserved {h.reserved:#x} at offset 16 hold unknown bits")
    if h.file_size != len(data):
        raise _fail(f"header (offset 24) says the file is {h.file_size} bytes, it is {len(data)} bytes "
                    "(truncated or extended)")
    end = h.manifest_offset + h.manifest_size
    if h.manifest_offset < h.header_size or end != len(data) or h.manifest_size == 0:
        raise _fail(f"manifest [{h.manifest_offset}, {end}) (header offsets 32, 40) must lie after the header "
                    f"and end the file ({len(data)} bytes)")
    if h.manifest_raw_size > MAX_MANIFEST_RAW:
        raise _fail(f"manifest size {h.manifest_raw_size} (header offset 48) exceeds the limit {MAX_MANIFEST_RAW}")
    return h


def read_manifest(data: bytes | memoryview, h: Header) -> dict:
    stored = bytes(data[h.manifest_offset: h.manifest_offset + h.manifest_size])
    import hashlib  # these here, not at `import svodrt`: imports are most of a cold start

    import msgpack

    if h.flags & FLAG_MANIFEST_ZSTD:
        import zstandard

        try:  # max_output_size bounds the memory a lying frame header can make us allocate
            raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=h.manifest_raw_size)
        except zstandard.ZstdError as e:
            raise _fail(f"manifest at offset {h.manifest_offset} does not decompress: {e}") from None
    else:
        raw = stored
    if len(raw) != h.manifest_raw_size:
        raise _fail(f"manifest at offset {h.manifest_offset} is {len(raw)} bytes, header says {h.manifest_raw_size}")
    if hashlib.sha256(raw).digest()[:8] != h.manifest_digest:
        raise _fail(f"manifest at offset {h.manifest_offset} fails its checksum (header offset 56): the file is "
                    "damaged")
    try:
        m = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several types for malformed input
        raise _fail(f"manifest at offset {h.manifest_offset} is not valid msgpack: {e}") from None
    if not isinstance(m, dict):
        raise _fail(f"manifest at offset {h.manifest_offset} is not a map")
    return m


def _zero_gap(data: bytes | memoryview, start: int, end: int, where: str) -> None:
    """Padding must be zero, so that every byte of a bundle is covered by some check."""
    if start < end and bytes(data[start:end]) != bytes(end - start):
        raise _fail(f"padding [{start}, {end}) {where} is not zero: the file is damaged")


def _sections(m: dict, h: Header, data: bytes | memoryview) -> list[Section]:
    out: list[Section] = []
    prev_end = h.header_size
    for i, s in enumerate(items(m, "sections", "manifest", 1024)):
        where = f"sections[{i}]"
        sec = Section(i, name(s, "name", where), name(s, "kind", where), uint(s, "offset", where, MAX_BYTES),
                      uint(s, "length", where, MAX_BYTES), field(s, "sha256", bytes, where))
        align = section_align(sec.length)
        if sec.offset % align:
            raise _fail(f"section {sec.name!r} at offset {sec.offset} ({sec.length} bytes) is not {align}-aligned")
        if sec.offset < prev_end or sec.offset + sec.length > h.manifest_offset:
            raise _fail(f"section {sec.name!r} [{sec.offset}, {sec.offset + sec.length}) overlaps the header, "
                        "the previous section or the manifest")
        if len(sec.sha256) != 32:
            raise _fail(f"section {sec.name!r} checksum has {len(sec.sha256)} bytes, expected 32")
        if any(o.name == sec.name for o in out):
            raise _fail(f"section name {sec.name!r} ({where}) repeats")
        _zero_gap(data, prev_end, sec.offset, f"before section {sec.name!r}")
        prev_end = sec.offset + sec.length
        out.append(sec)
    _zero_gap(data, prev_end, h.manifest_offset, "before the manifest")
    return out


def check_section(data: bytes | memoryview, sec: Section) -> None:
    """sha256 of one section; costs about 0.6 ms per MB."""
    import hashlib

    if hashlib.sha256(data[sec.offset: sec.offset + sec.length]).digest() != sec.sha256:
        raise _fail(f"section {sec.name!r} at offset {sec.offset} ({sec.length} bytes) fails its sha256 "
                    "checksum: the file is damaged")


def parse_bundle(data: bytes | memoryview) -> Bundle:
    """Every structural check. Section checksums are left to the caller (check_section)."""
    h = read_header(data)
    m = read_manifest(data, h)
    try:
        fmt = field(m, "format", list, "manifest")
        if fmt != [h.major, h.minor]:
            raise _fail(f"manifest format {fmt!r} disagrees with the header version {h.major}.{h.minor}")
        # [cross] format 1.1: "big" for s390x; all variants share the bundle's byte order
        byte_order = field(m, "byte_order", str, "manifest")
        if byte_order not in ("little", "big"):
            raise _fail(f"manifest byte_order {byte_order[:20]!r} must be 'little' or 'big'")
        sections = _sections(m, h, data)
        weights = [s for s in sections if s.kind == "weights"]
        if len(weights) != 1:
            raise _fail(f"manifest sections: expected one weights section, found {len(weights)}")
        plan = parse_plan(m, sections, weights[0])
        for i, v in enumerate(plan.variants):
            if BYTE_ORDER.get(v.arch, byte_order) != byte_order:
                raise _fail(f"manifest variants[{i}] is for {v.arch}, whose data is {BYTE_ORDER[v.arch]}-endian, "
                            f"but the bundle's byte_order is {byte_order!r}")
    except BundleFormatError as e:
        raise BundleFormatError(f"{e} (manifest at offset {h.manifest_offset})") from None
    return Bundle(**{f.name: getattr(plan, f.name) for f in fields(plan)}, header=h, manifest=m, sections=sections,
                  weights=weights[0])

