"""Program + code images -> .svod bytes (format 1; docs/bundle-format.md).

Deterministic: no timestamps, no paths, no dict ordering left to chance; the same model and options
with the same compiler version give the same bytes.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterator
from typing import BinaryIO

import msgpack
import numpy as np
import zstandard

from svodc import __version__
from svodc.codegen.link import CodeImage
from svodc.errors import BundleError
from svodc.ir.dtypes import to_storage
from svodc.program import Buffer, BufferKind, Program
from svodc.target import Target
from svodrt import features as feature_table
from svodrt.bundle import parse_bundle
from svodrt.errors import BundleFormatError
from svodrt.format import (
    FLAG_MANIFEST_ZSTD,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    HEADER_SIZE,
    Header,
    align_up,
    section_align,
    variant_binding,
)

ZSTD_LEVEL = 10


def _buffer_entry(b: Buffer) -> dict:
    entry = {"id": b.id, "kind": b.kind.value, "name": b.name, "dtype": b.dtype.name, "shape": list(b.shape)}
    if b.kind in (BufferKind.INPUT, BufferKind.OUTPUT):
        entry["slot"] = b.slot
    else:
        entry["offset"] = b.offset
    return entry


def _weight_pieces(program: Program) -> Iterator[memoryview]:
    """The weights section as pieces: each weight's bytes (a view of its array, in the buffer's
    storage type, little-endian: no copy for mapped or computed arrays) and the zeros between."""
    at = 0
    for w in sorted(program.weights, key=lambda b: b.offset):
        assert w.data is not None and w.offset >= at
        if w.offset > at:
            yield memoryview(bytes(w.offset - at))
        raw = to_storage(np.asarray(w.data.array, order="C"), w.dtype)
        raw = raw.astype(raw.dtype.newbyteorder("<"), copy=False)
        if raw.size:
            yield memoryview(raw.reshape(-1).view(np.uint8))
        at = w.offset + raw.nbytes
    if program.weights_size > at:
        yield memoryview(bytes(program.weights_size - at))


class _Writer:
    """Writes to a seekable binary file, counting bytes."""

    def __init__(self, out: BinaryIO, start: int):
        self.out, self.pos = out, start

    def write(self, data: bytes | memoryview) -> None:
        self.out.write(data)
        self.pos += len(data)

    def pad_to(self, offset: int) -> None:
        if offset > self.pos:
            self.write(bytes(offset - self.pos))


def write_bundle_to(out: BinaryIO, program: Program, images: list[tuple[Target, CodeImage]], model_digest: str,
                    test_vectors: list[dict] | None = None) -> None:
    """Write the bundle to a seekable binary file positioned at its start. Weights go from their
    arrays straight to `out` (one copy: the write itself), hashed on the way."""
    sections: list[tuple[dict, Callable[[], Iterator[memoryview]], int]] = [
        ({"name": "weights", "kind": "weights"}, lambda: _weight_pieces(program), program.weights_size)]
    variants = []
    for target, image in images:
        sections.append(({"name": f"code.{target.arch}.{target.cpu}", "kind": "code"},
                         lambda data=image.data: iter([memoryview(data)]), len(image.data)))
        variants.append({
            "arch": target.arch,
            "cpu": target.cpu,
            "features": list(target.features),
            "feature_bits": feature_table.to_bits(target.arch, target.features),
            "section": len(sections) - 1,
            "entry": image.symbols["svod_entry"],
            "kernels": [image.symbols[k.name] for k in program.kernels],
            "fixups": list(image.fixups),
        })

    w = _Writer(out, 0)
    w.write(bytes(HEADER_SIZE))
    table = []
    for meta, pieces, length in sections:
        offset = align_up(w.pos, section_align(length))
        w.pad_to(offset)
        h = hashlib.sha256()
        for piece in pieces():
            h.update(piece)
            w.write(piece)
        if w.pos - offset != length:
            raise BundleError(f"section {meta['name']}: wrote {w.pos - offset} bytes, expected {length}")
        table.append({**meta, "offset": offset, "length": length, "sha256": h.digest()})

    manifest = {
        "format": [FORMAT_MAJOR, FORMAT_MINOR],
        "producer": {"name": "svodc", "version": __version__},
        "model": {"sha256": model_digest, "producer": program.producer},
        "byte_order": "little",
        "inputs": [_buffer_entry(b) for b in program.inputs],
        "outputs": [_buffer_entry(b) for b in program.outputs],
        "arena_size": program.arena_size,
        "weights_size": program.weights_size,
        "sections": table,
        "variants": variants,
        "buffers": [_buffer_entry(b) for b in program.weights + program.scratch],
        "kernels": [{"name": k.name, "params": [b.id for b in k.params], "provenance": k.provenance}
                    for k in program.kernels],
    }
    for v in variants:
        v["binding"] = variant_binding(v, table[v["section"]]["sha256"], manifest)
    if test_vectors:
        manifest["test_vectors"] = test_vectors
    raw = msgpack.packb(manifest, use_bin_type=True)
    # Single-threaded zstd at a fixed level: the same manifest always compresses to the same bytes.
    stored = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, threads=0).compress(raw)
    manifest_offset = w.pos
    w.write(stored)
    header = Header(FORMAT_MAJOR, FORMAT_MINOR, HEADER_SIZE, FLAG_MANIFEST_ZSTD, 0, w.pos, manifest_offset,
                    len(stored), len(raw), hashlib.sha256(raw).digest()[:8])
    out.seek(0)
    out.write(header.pack())
    out.seek(w.pos)


def check_bundle(data: bytes | memoryview) -> None:
    """Never hand out a bundle the runtime would refuse (e.g. a tensor over the format's size limit)."""
    try:
        parse_bundle(data)
    except BundleFormatError as e:
        raise BundleError(f"cannot make a valid bundle: {e}") from None


def write_bundle(program: Program, images: list[tuple[Target, CodeImage]], model_digest: str,
                 test_vectors: list[dict] | None = None) -> bytes:
    """The bundle's bytes. test_vectors: manifest entries from svodc.testvec (optional)."""
    buf = io.BytesIO()
    write_bundle_to(buf, program, images, model_digest, test_vectors)
    data = buf.getvalue()
    check_bundle(data)
    return data
