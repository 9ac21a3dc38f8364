"""Program + code images -> .svod bytes (format 1; docs/bundle-format.md).

Deterministic: no timestamps, no paths, no dict ordering left to chance; the same model and options
with the same compiler version give the same bytes.
"""

from __future__ import annotations

import hashlib

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


def _weights_blob(program: Program) -> bytes:
    blob = bytearray(program.weights_size)
    for w in program.weights:
        assert w.data is not None
        raw = to_storage(np.ascontiguousarray(w.data.array), w.dtype)
        raw = raw.astype(raw.dtype.newbyteorder("<"), copy=False)
        data = raw.tobytes()
        blob[w.offset: w.offset + len(data)] = data
    return bytes(blob)


def write_bundle(program: Program, images: list[tuple[Target, CodeImage]], model_digest: str,
                 test_vectors: list[dict] | None = None) -> bytes:
    """The bundle's bytes. test_vectors: manifest entries from svodc.testvec (optional)."""
    sections: list[tuple[dict, bytes]] = [({"name": "weights", "kind": "weights"}, _weights_blob(program))]
    variants = []
    for target, image in images:
        sections.append(({"name": f"code.{target.arch}.{target.cpu}", "kind": "code"}, image.data))
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

    out = bytearray(HEADER_SIZE)
    table = []
    for meta, data in sections:
        offset = align_up(len(out), section_align(len(data)))
        out += bytes(offset - len(out))
        out += data
        table.append({**meta, "offset": offset, "length": len(data), "sha256": hashlib.sha256(data).digest()})

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
    manifest_offset = len(out)
    out += stored
    header = Header(FORMAT_MAJOR, FORMAT_MINOR, HEADER_SIZE, FLAG_MANIFEST_ZSTD, 0, len(out), manifest_offset,
                    len(stored), len(raw), hashlib.sha256(raw).digest()[:8])
    out[:HEADER_SIZE] = header.pack()
    data = bytes(out)
    try:  # never write a bundle the runtime would refuse (e.g. a tensor over the format's size limit)
        parse_bundle(data)
    except BundleFormatError as e:
        raise BundleError(f"cannot make a valid bundle: {e}") from None
    return data
