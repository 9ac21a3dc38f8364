"""Program + code images -> .svod bytes (format 1; docs/bundle-format.md).

Deterministic: no timestamps, no paths, no dict ordering left to chance; the same model and options
with the same compiler version give the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import msgpack
import numpy as np
import zstandard

from svodc import __version__
from svodc.codegen.gpu_compile import GpuImage
from svodc.codegen.link import CodeImage
from svodc.codegen.team import TEAM_SYMBOLS
from svodc.errors import BundleError, TargetError
from svodc.ir.dtypes import dtypes, to_storage
from svodc.passes.dynamic import ComputedDim, ValueDim
from svodc.program import Buffer, BufferKind, Program
from svodc.target import Target
from svodrt import features as feature_table
from svodrt.abi import ENTRY
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
    team_binding,
    variant_binding,
)
from svodrt_gpu.plan import gpu_binding
from svodrt_trust import signed_message

ZSTD_LEVEL = 10
# Manifests up to this size are stored plain: decompressing costs a load more (Zen 4: squeezenet's 13.8 KB, ~17 us
# with the decompressor's setup; the zstandard import at a first load, ~0.6 ms) than their bytes cost to read.
MANIFEST_PLAIN_MAX = 64 << 10
# Informational manifest entries no runtime check depends on (docs/bundle-format.md "Optional entries"):
# the compile options and the op type of every ONNX node kernels name in their provenance.
EXTRA_KEYS = ("options", "node_ops")


def _shape_entry(b: Buffer) -> list:
    """The shape, with each axis a bounded dim sizes written as its name ("NAME", or "NAME*K" for K times
    it; format 1.5): the runtime's size at the bound is hi * K. A runtime before 1.5 refuses the entry."""
    if not b.dims:
        return list(b.shape)
    return [d if ax is None else ax.dim if ax.factor == 1 else f"{ax.dim}*{ax.factor}"
            for d, ax in zip(b.shape, b.dims, strict=True)]


def _dims_table(program: Program) -> list[dict]:
    """Format 1.5: each bounded dim, in the order of the entry's `dims` array, and the input axes it sizes;
    format 1.7: then each computed dim (passes/dynamic.py), marked `computed`."""
    uses: dict[str, list] = {d.name: [] for d in program.dims}
    for b in program.inputs:
        for axis, ax in enumerate(b.dims):
            if ax is not None:
                uses[ax.dim].append([b.name, axis])
    return [{"name": d.name, "lo": d.lo, "hi": d.hi, "computed": True} if isinstance(d, ComputedDim | ValueDim) else
            {"name": d.name, "lo": d.lo, "hi": d.hi, "inputs": uses[d.name]} for d in program.dims]


def _edge_entry(name: str, e: object, role: str, program: Program) -> list:
    """A step of svodrt's string program. StringNormalizer of a graph input as a graph output keeps 1.6's
    form, which 1.6 runtimes run; every other step is 1.8's five-item form, which they refuse at load."""
    computed = {n for n, _, r in program.edge_outputs if r != "output"}
    if role == "output" and e.op == "StringNormalizer" and e.sources[0] not in computed:
        return [name, e.op, e.sources[0], e.attrs]
    return [name, e.op, list(e.sources), e.attrs, role]


def _buffer_entry(b: Buffer) -> dict:
    entry = {"id": b.id, "kind": b.kind.value, "name": b.name, "dtype": b.dtype.name, "shape": _shape_entry(b)}
    if b.kind in (BufferKind.INPUT, BufferKind.OUTPUT):
        entry["slot"] = b.slot
    else:
        entry["offset"] = b.offset
    return entry


def _weight_pieces(program: Program, byte_order: str) -> Iterator[memoryview]:
    """The weights section as pieces: each weight's bytes (a view of its array, in the buffer's
    storage type and the bundle's byte order -- converted here, at compile time, so the runtime maps
    weights as they are; no copy for little-endian mapped or computed arrays) and the zeros between."""
    at = 0
    for w in sorted(program.weights, key=lambda b: b.offset):
        assert w.data is not None and w.offset >= at
        if w.offset > at:
            yield memoryview(bytes(w.offset - at))
        raw = to_storage(np.asarray(w.data.array, order="C"), w.dtype)
        raw = raw.astype(raw.dtype.newbyteorder("<" if byte_order == "little" else ">"), copy=False)
        if raw.size:
            yield memoryview(raw.reshape(-1).view(np.uint8))
        at = w.offset + raw.nbytes
    if program.weights_size > at:
        yield memoryview(bytes(program.weights_size - at))


class _Writer:
    """Writes to a seekable binary file, counting bytes."""

    def __init__(self, out: BinaryIO):
        self.out, self.pos = out, 0

    def write(self, data: bytes | memoryview) -> None:
        self.out.write(data)
        self.pos += len(data)

    def pad_to(self, offset: int) -> None:
        if offset > self.pos:
            self.write(bytes(offset - self.pos))


def _gpu_variant(program: Program, image: GpuImage, sections: list[tuple[dict, bytes]]) -> dict:
    """A GPU variant (docs/bundle-format.md, "GPU variants"): the code object (PTX for cuda), the
    cubin when there is one, and the launch list. entry/kernels/fixups are placeholders that keep the
    variant well-formed for runtimes before 1.2, which refuse it by its architecture."""
    t = image.target
    sections.append(({"name": f"gpu.{t.kind}.{t.cpu}{'.ptx' if t.kind == 'cuda' else ''}", "kind": "code"},
                     image.code))
    v = {"kind": t.kind, "arch": t.arch, "cpu": t.cpu, "features": [], "feature_bits": 0,
         "section": len(sections) - 1, "entry": 0, "kernels": [0] * len(program.kernels), "fixups": [],
         "launches": [{"kernel": x.kernel, "symbol": x.symbol, "grid": [x.grid, 1, 1], "block": [x.block, 1, 1],
                       **({} if x.dims is None else {"dims": [slot for slot, _ in x.dims]})} for x in image.launches]}
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


def _signature(manifest: dict, key_path: str | os.PathLike) -> dict:
    """The manifest's `signature` (svodrt_trust/): Ed25519 by the PEM private key at key_path, over
    the message the runtime computes from the manifest it parses (hence the msgpack round trip)."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise BundleError("signing needs the cryptography package: pip install 'svod[sign]'") from None
    try:
        key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise BundleError(f"cannot read the signing key {os.fspath(key_path)!r}: {e}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise BundleError(f"signing key {os.fspath(key_path)!r} is not an Ed25519 private key (make one with "
                          "`openssl genpkey -algorithm ed25519`)")
    parsed = msgpack.unpackb(msgpack.packb(manifest, use_bin_type=True), raw=False)
    raw = serialization.Encoding.Raw
    return {"key": key.public_key().public_bytes(raw, serialization.PublicFormat.Raw),
            "ed25519": key.sign(signed_message(parsed))}


def write_bundle_to(out: BinaryIO, program: Program, images: list[tuple[Target, CodeImage]], model_digest: str,
                    test_vectors: list[dict] | None = None, gpu_images: list[GpuImage] = (),
                    sign_key: str | os.PathLike | None = None, extra: dict | None = None) -> None:
    """Write the bundle to a seekable binary file positioned at its start. test_vectors: the entries of
    the `tests` section, from svodc.testvec (optional); gpu_images: GPU variants, after the CPU ones; sign_key: an
    Ed25519 private key (PEM file) to sign the bundle with; extra: optional manifest entries
    (EXTRA_KEYS: svodc.api's recorded options and node op types). Weights go from their arrays straight
    to `out` (one copy: the write itself), hashed on the way."""
    sections: list[tuple[dict, bytes]] = []  # code sections; the weights section streams separately
    byte_order = _byte_order(images, gpu_images)
    variants = []
    for target, image in images:
        sections.append(({"name": f"code.{target.arch}.{target.cpu}", "kind": "code"}, image.data))
        variants.append({
            "arch": target.arch,
            "cpu": target.cpu,
            "features": list(target.features),
            "feature_bits": feature_table.to_bits(target.arch, target.features),
            "section": len(sections),
            "entry": image.symbols[ENTRY],
            "kernels": [image.symbols[k.name] for k in program.kernels],
            "fixups": list(image.fixups),
            "team": [image.symbols[name] for name in TEAM_SYMBOLS],  # format 1.10
        })
    # GPU variants number their sections from 0 among the code sections: shift past the weights
    gpu = [_gpu_variant(program, g, sections) for g in gpu_images]
    for v in gpu:
        v["section"] += 1
        if "cubin" in v:
            v["cubin"] += 1
    variants += gpu
    if test_vectors:  # format 1.9: a section of their own, so that a load never decompresses or hashes them
        sections.append(({"name": "test_vectors", "kind": "tests"}, msgpack.packb(test_vectors, use_bin_type=True)))

    w = _Writer(out)
    w.write(bytes(HEADER_SIZE))
    table = []
    weights = {"name": "weights", "kind": "weights"}
    streamed = [(weights, lambda: _weight_pieces(program, byte_order), program.weights_size)]
    streamed += [(meta, lambda data=data: iter([memoryview(data)]), len(data)) for meta, data in sections]
    for meta, pieces, length in streamed:
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
        "byte_order": byte_order,
        "inputs": [_buffer_entry(b) for b in program.inputs],
        "outputs": [_buffer_entry(b) for b in program.outputs],
        "arena_size": program.arena_size,
        "weights_size": program.weights_size,
        "sections": table,
        "variants": variants,
        "buffers": [_buffer_entry(b) for b in program.weights + program.scratch],
        "kernels": [{"name": k.name, "params": [b.storage.id for b in k.params], "provenance": k.provenance,
                     "kind": k.kind} for k in program.kernels],
    }
    if any(b.dtype is dtypes.string for b in program.inputs + program.outputs):  # 1.4 (1.5: outputs); bound
        manifest["vocabulary"] = list(program.vocabulary)
    if program.dims:  # format 1.5; the bindings cover it
        manifest["dims"] = _dims_table(program)
    if program.zipmaps:  # format 1.6
        manifest["zipmaps"] = [[name, list(keys)] for name, keys in program.zipmaps]
    if program.edge_outputs:  # format 1.6; 1.8: the string program (docs/bundle-format.md "Strings")
        manifest["edge_outputs"] = [_edge_entry(name, e, role, program) for name, e, role in program.edge_outputs]
    for v in variants:
        v["binding"] = variant_binding(v, table[v["section"]]["sha256"], manifest)
        if "team" in v:
            v["team_binding"] = team_binding(v)
        if "launches" in v:
            v["gpu_binding"] = gpu_binding(v, table[v["cubin"]]["sha256"] if "cubin" in v else None)
    for key, value in (extra or {}).items():
        if key not in EXTRA_KEYS:
            raise BundleError(f"manifest entry {key!r} is not one of {EXTRA_KEYS}")
        manifest[key] = value
    if sign_key is not None:  # last: it signs everything before it
        manifest["signature"] = _signature(manifest, sign_key)
    raw = msgpack.packb(manifest, use_bin_type=True)
    # Single-threaded zstd at a fixed level: the same manifest always compresses to the same bytes.
    flags = 0 if len(raw) <= MANIFEST_PLAIN_MAX else FLAG_MANIFEST_ZSTD
    stored = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, threads=0).compress(raw) if flags \
        else raw
    manifest_offset = w.pos
    w.write(stored)
    header = Header(FORMAT_MAJOR, FORMAT_MINOR, HEADER_SIZE, flags, 0, w.pos, manifest_offset,
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
                 test_vectors: list[dict] | None = None, gpu_images: list[GpuImage] = (),
                 sign_key: str | os.PathLike | None = None, extra: dict | None = None) -> bytes:
    """The bundle's bytes (write_bundle_to into memory)."""
    buf = io.BytesIO()
    write_bundle_to(buf, program, images, model_digest, test_vectors, gpu_images, sign_key, extra)
    data = buf.getvalue()
    check_bundle(data)
    return data
