"""The .svod bundle format's constants, header and binding digests, defined once here (svodc imports them);
docs/bundle-format.md is the specification."""

import struct
from collections.abc import Mapping
from typing import NamedTuple

MAGIC = b"SVOD\x00\r\n\x1a"
FORMAT_MAJOR = 1
# 1.1 big-endian, 1.2 GPU, 1.3 narrow dtypes, 1.4 strings, 1.5 bounded dims, 1.6 string outputs, 1.7 computed
# dims, 1.8 string program, 1.9 test vectors in a `tests` section, 1.10 the team functions (docs/bundle-format.md)
FORMAT_MINOR = 10
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
WEIGHTS_CHECK_LIMIT = 16 << 20  # weights bytes that every load checksums (~10 ms of sha256; svodrt/bundle.py)
MAX_NAME = 4096  # characters in any name
MAX_TEST_VECTORS = 16
MAX_STRING = 1 << 16  # characters in one vocabulary string
MAX_STRING_ID = (1 << 31) - 1  # string ids are int32: the vocabulary plus one call's new strings stay below


class Header(NamedTuple):
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
    """Binds a code image to everything its machine code was compiled against (range checks cannot tell a
    plausible but wrong offset, fixup, feature list, shape or arena size): docs/bundle-format.md "Variants"."""
    def sig(ts) -> list:
        return [[t["name"], t["dtype"], list(t["shape"])] for t in ts]

    fields = [variant["arch"], variant["cpu"], list(variant["features"]), variant["feature_bits"], bytes(code_sha256),
              variant["entry"], list(variant["kernels"]), list(variant["fixups"]), sig(manifest["inputs"]),
              sig(manifest["outputs"]), manifest["arena_size"], manifest["weights_size"]]
    if any(isinstance(t, Mapping) and t.get("dtype") == STRING for t in manifest["inputs"] + manifest["outputs"]):
        fields.append(list(manifest.get("vocabulary", ())))
    if "dims" in manifest:
        fields.append(manifest["dims"])
    return msgpack_sha256(fields)


def msgpack_sha256(obj: object) -> bytes:
    """sha256 of obj's msgpack encoding (the bindings, trust.signed_message)."""
    import hashlib  # only when a bundle is read or written, not at `import svodrt`

    import msgpack
    return hashlib.sha256(msgpack.packb(obj, use_bin_type=True)).digest()


def team_binding(variant: Mapping) -> bytes:  # format 1.10's own field: older runtimes' binding is unchanged
    return msgpack_sha256([bytes(variant["binding"]), list(variant["team"])])


# GPU variants (format 1.2; their launches and gpu_binding: svodrt_gpu/plan.py). Older runtimes read a GPU variant as a
# CPU variant of an architecture no host has ("nvptx64", "amdgcn"), so they refuse it by architecture and still run
# the bundle's CPU variants.
GPU_KINDS = ("cuda", "hip")


# dtype names a bundle may use -> (the numpy dtype an element travels as, bytes per element). Types
# numpy lacks travel as raw bits (bfloat16 as uint16, float8/float4 as uint8), int4/int2 one value
# per byte; "string" elements are int32 ids (svodrt_strings/ids.py: run() takes str arrays, never ids).
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
