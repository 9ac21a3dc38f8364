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
from svodc.codegen.gpu_compile import GpuImage
from svodc.codegen.link import CodeImage
from svodc.errors import BundleError, TargetError
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
    gpu_binding,
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


def _weights_blob(program: Program, byte_order: str) -> bytes:
    """The weights section, every element in the bundle's byte order (converted here, at compile time,
    so the runtime maps weights as they are)."""
    blob = bytearray(program.weights_size)
    order = "<" if byte_order == "little" else ">"
    for w in program.weights:
        assert w.data is not None
        raw = np.ascontiguousarray(w.data.array).astype(w.data.array.dtype.newbyteorder(order), copy=False)
        data = raw.tobytes()
        blob[w.offset: w.offset + len(data)] = data
    return bytes(blob)


def _gpu_variant(program: Program, image: GpuImage, sections: list[tuple[dict, bytes]]) -> dict:
    """A GPU variant (docs/bundle-format.md, "GPU variants"): the code object (PTX for cuda), the
    cubin when there is one, and the launch list. entry/kernels/fixups are placeholders that keep the
    variant well-formed for runtimes before 1.2, which refuse it by its architecture."""
    t = image.target
    sections.append(({"name": f"gpu.{t.kind}.{t.cpu}{'.ptx' if t.kind == 'cuda' else ''}", "kind": "code"},
                     image.code))
    v = {"kind": t.kind, "arch": t.arch, "cpu": t.cpu, "features": [], "feature_bits": 0,
         "section": len(sections) - 1, "entry": 0, "kernels": [0] * len(program.kernels), "fixups": [],
         "launches": [{"kernel": x.kernel, "symbol": x.symbol, "grid": [x.grid, 1, 1], "block": [x.block, 1, 1]}
                      for x in image.launches]}
    if image.cubin is not None:
        sections.append(({"name": f"gpu.{t.kind}.{t.cpu}.cubin", "kind": "code"}, image.cubin))
        v["cubin"] = len(sections) - 1
    return v


def _byte_order(images: list[tuple[Target, CodeImage]], gpu_images: list[GpuImage]) -> str:
    """The one byte order of the bundle's data (docs/bundle-format.md "Byte order"): its CPU variants'
    (GPUs are little-endian). svodc.target.parse_target refuses mixes with a message for the user."""
    orders = {t.byte_order for t, _ in images} | ({"little"} if gpu_images else set())
    if len(orders) > 1:
        raise TargetError(f"the variants of one bundle must share a byte order, got {sorted(orders)}: compile "
                          "big-endian (s390x) variants into a bundle of their own")
    return orders.pop() if orders else "little"


def write_bundle(program: Program, images: list[tuple[Target, CodeImage]], model_digest: str,
                 test_vectors: list[dict] | None = None, gpu_images: list[GpuImage] = ()) -> bytes:
    """The bundle's bytes. test_vectors: manifest entries from svodc.testvec (optional); gpu_images:
    GPU variants, after the CPU ones."""
    byte_order = _byte_order(images, gpu_images)
    sections: list[tuple[dict, bytes]] = [({"name": "weights", "kind": "weights"}, _weights_blob(program, byte_order))]
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
    variants += [_gpu_variant(program, g, sections) for g in gpu_images]

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
        "byte_order": byte_order,
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
        if "launches" in v:
            v["gpu_binding"] = gpu_binding(v, table[v["cubin"]]["sha256"] if "cubin" in v else None)
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
