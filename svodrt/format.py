"""The .svod bundle format: constants and the header, defined once, here (svodc imports them).

Layout (all integers little-endian; see docs/bundle-format.md for the full specification):

    0         header (HEADER_SIZE bytes)
    65536     sections, each starting at a multiple of SECTION_ALIGN (code images, weights),
              stored uncompressed so they can be mapped straight from the file
    ...       the manifest: msgpack, zstd-compressed, after the last section

Header fields (64 bytes):
    magic[8]          b"SVOD\\x00\\r\\n\\x1a" (a NUL, CR-LF and ^Z catch text-mode mangling)
    u16 major, u16 minor
    u32 header_size
    u32 flags         bit 0: the manifest is zstd-compressed; other bits must be 0
    u32 reserved      0
    u64 file_size
    u64 manifest_offset, u64 manifest_size (stored), u64 manifest_raw_size (uncompressed)
    u8[8] manifest_digest: the first 8 bytes of sha256(raw manifest); the manifest in turn holds
                      a full sha256 of every section
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"SVOD\x00\r\n\x1a"
FORMAT_MAJOR = 1
FORMAT_MINOR = 1
HEADER = struct.Struct("<8sHHIIIQQQQ8s")
FLAG_MANIFEST_ZSTD = 1
HEADER_SIZE = HEADER.size  # 64
SECTION_ALIGN = 65536  # arm64 kernels can use 64 KiB pages: sections must be mappable there too
MAX_MANIFEST_RAW = 256 << 20  # a manifest larger than this is refused before decompression

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


def align_up(n: int, a: int = SECTION_ALIGN) -> int:
    return (n + a - 1) // a * a


# dtype names a bundle may use, with the numpy dtype their elements travel as (in and out of run(),
# and in buffers) and the bytes per element. Types numpy lacks travel as raw bits: bfloat16 as uint16,
# the float8 and float4 formats as uint8 (float4: the 4-bit code in the low half). The narrow integers
# int4/int2 (uint4/uint2) travel one element per byte as int8 (uint8) values in their range.
# Added in format 1.1: the float8, float4, int4/uint4 and int2/uint2 names.
DTYPES: dict[str, tuple[str, int]] = {
    "bool": ("bool", 1), "int8": ("int8", 1), "int16": ("int16", 2), "int32": ("int32", 4),
    "int64": ("int64", 8), "uint8": ("uint8", 1), "uint16": ("uint16", 2), "uint32": ("uint32", 4),
    "uint64": ("uint64", 8), "float16": ("float16", 2), "bfloat16": ("uint16", 2),
    "float32": ("float32", 4), "float64": ("float64", 8),
    "float8e4m3fn": ("uint8", 1), "float8e4m3fnuz": ("uint8", 1), "float8e5m2": ("uint8", 1),
    "float8e5m2fnuz": ("uint8", 1), "float8e8m0": ("uint8", 1), "float4e2m1": ("uint8", 1),
    "int4": ("int8", 1), "uint4": ("uint8", 1), "int2": ("int8", 1), "uint2": ("uint8", 1),
}
# ml_dtypes' names for the types that travel as bits: run() accepts such arrays and views their bits
# (svodrt never imports ml_dtypes; the dtype's name is enough).
BITS_OF: dict[str, str] = {
    "bfloat16": "bfloat16", "float8_e4m3fn": "float8e4m3fn", "float8_e4m3fnuz": "float8e4m3fnuz",
    "float8_e5m2": "float8e5m2", "float8_e5m2fnuz": "float8e5m2fnuz", "float8_e8m0fnu": "float8e8m0",
    "float4_e2m1fn": "float4e2m1",
}
