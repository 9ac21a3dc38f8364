"""The .svod bundle format: constants, the header and the variant binding, defined once, here
(svodc imports them).

Layout (header integers little-endian, section data in the manifest's byte_order; see
docs/bundle-format.md for the full specification):

    0         header (HEADER_SIZE bytes)
    64..      sections (weights, code images), stored uncompressed, in order, not overlapping; each
              starts at a multiple of SMALL_ALIGN, and one of MAP_ALIGN bytes or more at a multiple
              of MAP_ALIGN so it can be mapped straight from the file
    ...       the manifest: msgpack, zstd-compressed, after the last section, ending the file

Header fields (64 bytes):
    magic[8]          b"SVOD\\x00\\r\\n\\x1a" (a NUL, CR-LF and ^Z catch text-mode mangling)
    u16 major, u16 minor
    u32 header_size
    u32 flags         bit 0: the manifest is zstd-compressed; other bits must be 0
    u32 reserved      0
    u64 file_size
    u64 manifest_offset, u64 manifest_size (stored), u64 manifest_raw_size (uncompressed)
    u8[8] manifest_digest: the first 8 bytes of sha256(raw manifest); the manifest in turn holds
                      a full sha256 of every section and a binding digest per code variant
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import msgpack

MAGIC = b"SVOD\x00\r\n\x1a"
FORMAT_MAJOR = 1
FORMAT_MINOR = 4  # 1.4: string inputs + vocabulary; 1.3: float8/float4/int4/int2 dtypes; 1.2: GPU variants;
# 1.1: byte_order "big" (s390x)
HEADER = struct.Struct("<8sHHIIIQQQQ8s")
FLAG_MANIFEST_ZSTD = 1
HEADER_SIZE = HEADER.size  # 64
MAX_HEADER_SIZE = 4096  # a later minor version may grow the header up to this
SMALL_ALIGN = 64  # every section starts at a multiple of this
MAP_ALIGN = 65536  # ... and a section this large or larger at a multiple of this (64 KiB pages on arm64)
MAX_MANIFEST_RAW = 256 << 20  # a manifest larger than this is refused before decompression

# Limits that keep the runtime's arithmetic, allocations and loops bounded whatever a manifest says.
MAX_BYTES = 1 << 40  # no tensor, arena, section or weights area may be larger (1 TiB)
MAX_RANK = 64  # numpy's own limit
MAX_ITEMS = 1 << 20  # no manifest list (kernels, buffers, fixups, ...) may be longer
MAX_NAME = 4096  # characters in any name
MAX_TEST_VECTORS = 16
MAX_STRING = 1 << 16  # characters in one vocabulary string
MAX_STRING_ID = (1 << 31) - 1  # string ids are int32: the vocabulary plus one call's new strings stay below

# Index of each pointer in the buffer table the entry function receives.
BUF_ARENA = 0
BUF_WEIGHTS = 1
BUF_FIRST_INPUT = 2

# The `sync` block the entry function's barrier uses: u32 count, u32 generation, void (*yield)(void).
SYNC_SIZE = 64  # one cache line, so two calls' sync blocks never share one


@dataclass(frozen=True)
class Header:
    major: int
    minor: int
    header_size: int
    flags: int
    reserved: int
    file_size: int
    manifest_offset: int
    manifest_size: int
    manifest_raw_size: int
    manifest_digest: bytes

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, self.major, self.minor, self.header_size, self.flags, self.reserved,
                           self.file_size, self.manifest_offset, self.manifest_size, self.manifest_raw_size,
                           self.manifest_digest)


def unpack_header(data: bytes) -> tuple[bytes, Header]:
    magic, *fields = HEADER.unpack_from(data, 0)
    return magic, Header(*fields)


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def section_align(length: int) -> int:
    """Where a section of `length` bytes may start: small ones pack tightly (a tiny model's bundle is
    a few KB), large ones are page-aligned for every page size we map on."""
    return MAP_ALIGN if length >= MAP_ALIGN else SMALL_ALIGN


def variant_binding(variant: Mapping, code_sha256: bytes, manifest: Mapping) -> bytes:
    """The digest that binds a code image to everything its machine code was compiled against.

    Range checks cannot tell a plausible but wrong entry offset, fixup list, feature list, input
    shape or arena size from the right one, and each of those decides what the code does to memory
    or which CPU can run it. So they are hashed together with the code's own checksum; the runtime
    recomputes this and refuses a mismatch. sha256 of the msgpack array
    [arch, cpu, features, feature_bits, code sha256, entry, kernels, fixups,
     [[name, dtype, shape] per input], [[name, dtype, shape] per output], arena_size, weights_size],
    and, only in a bundle with a string input (format 1.4), its `vocabulary` as a 13th element: the code
    compares string ids with ids of these strings, so a changed vocabulary is changed code. (No older
    runtime computes this binding for such a bundle: it refuses the "string" dtype of an input first.)"""
    def sig(ts) -> list:
        return [[t["name"], t["dtype"], list(t["shape"])] for t in ts]

    fields = [variant["arch"], variant["cpu"], list(variant["features"]), variant["feature_bits"], bytes(code_sha256),
              variant["entry"], list(variant["kernels"]), list(variant["fixups"]), sig(manifest["inputs"]),
              sig(manifest["outputs"]), manifest["arena_size"], manifest["weights_size"]]
    if has_string_inputs(manifest["inputs"]):
        fields.append(list(manifest.get("vocabulary", ())))
    return hashlib.sha256(msgpack.packb(fields, use_bin_type=True)).digest()


def has_string_inputs(inputs) -> bool:
    """Whether a manifest's input list (of maps) declares a string input (format 1.4)."""
    return any(isinstance(t, Mapping) and t.get("dtype") == STRING for t in inputs)


# GPU variants (format 1.2). Older runtimes read a GPU variant as a CPU variant of an architecture no
# host has ("nvptx64", "amdgcn"), so they refuse it by architecture and still run the bundle's CPU variants.
GPU_KINDS = ("cuda", "hip")
MAX_GRID = (1 << 31) - 1  # blocks per launch (CUDA's grid x limit)
MAX_BLOCK = 1024  # threads per block


def gpu_binding(variant: Mapping, cubin_sha256: bytes | None) -> bytes:
    """Binds what only GPU runtimes read -- the kind, the launch list and the cubin -- to the variant's
    binding (which covers the code object and the plan). sha256 of the msgpack array
    [binding, kind, cubin sha256 or empty, [[kernel, symbol, grid, block] per launch]]."""
    launches = [[x["kernel"], x["symbol"], list(x["grid"]), list(x["block"])] for x in variant["launches"]]
    fields = [bytes(variant["binding"]), variant["kind"], bytes(cubin_sha256 or b""), launches]
    return hashlib.sha256(msgpack.packb(fields, use_bin_type=True)).digest()


# dtype names a bundle may use, with the numpy dtype their elements travel as (in and out of run(),
# and in buffers) and the bytes per element. Types numpy lacks travel as raw bits: bfloat16 as uint16,
# the float8 and float4 formats as uint8 (float4: the 4-bit code in the low half). The narrow integers
# int4/int2 (uint4/uint2) travel one element per byte as int8 (uint8) values in their range.
# Added in format 1.3: the float8, float4, int4/uint4 and int2/uint2 names. Added in 1.4: "string", for
# inputs and for buffers: an element is an int32 id (the index of the string in the manifest's
# `vocabulary`, or a number past it that run() gives strings the vocabulary lacks, see svodrt/strings.py);
# run() takes arrays of str for string inputs, never the ids.
DTYPES: dict[str, tuple[str, int]] = {
    "bool": ("bool", 1), "int8": ("int8", 1), "int16": ("int16", 2), "int32": ("int32", 4),
    "int64": ("int64", 8), "uint8": ("uint8", 1), "uint16": ("uint16", 2), "uint32": ("uint32", 4),
    "uint64": ("uint64", 8), "float16": ("float16", 2), "bfloat16": ("uint16", 2),
    "float32": ("float32", 4), "float64": ("float64", 8),
    "float8e4m3fn": ("uint8", 1), "float8e4m3fnuz": ("uint8", 1), "float8e5m2": ("uint8", 1),
    "float8e5m2fnuz": ("uint8", 1), "float8e8m0": ("uint8", 1), "float4e2m1": ("uint8", 1),
    "int4": ("int8", 1), "uint4": ("uint8", 1), "int2": ("int8", 1), "uint2": ("uint8", 1),
    "string": ("int32", 4),
}
STRING = "string"
# The float formats that travel as bits: (total bits, mantissa bits, exponent bias, kind). kind: "ieee"
# (an all-ones exponent is inf/NaN), "fn" (no inf; the all-ones magnitude is NaN), "fnuz" (no inf, no
# -0; sign bit alone is NaN), "sat" (no inf or NaN), "e8m0" (exponent only; 0xFF is NaN). float16
# too (numpy has it, but the compiler's conversion code reads the same table).
FLOAT_FORMATS: dict[str, tuple[int, int, int, str]] = {
    "float16": (16, 10, 15, "ieee"), "bfloat16": (16, 7, 127, "ieee"), "float8e5m2": (8, 2, 15, "ieee"),
    "float8e4m3fn": (8, 3, 7, "fn"), "float8e4m3fnuz": (8, 3, 8, "fnuz"), "float8e5m2fnuz": (8, 2, 16, "fnuz"),
    "float4e2m1": (4, 1, 1, "sat"), "float8e8m0": (8, 0, 127, "e8m0"),
}
# ml_dtypes' names for the types that travel as bits: run() accepts such arrays and views their bits
# (svodrt never imports ml_dtypes; the dtype's name is enough).
BITS_OF: dict[str, str] = {
    "bfloat16": "bfloat16", "float8_e4m3fn": "float8e4m3fn", "float8_e4m3fnuz": "float8e4m3fnuz",
    "float8_e5m2": "float8e5m2", "float8_e5m2fnuz": "float8e5m2fnuz", "float8_e8m0fnu": "float8e8m0",
    "float4_e2m1fn": "float4e2m1",
}
