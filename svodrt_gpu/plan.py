"""A GPU variant's launch list and cubin (format 1.2, docs/bundle-format.md "GPU variants"), read and checked here when
the GPU executor considers the variant: the core runtime reads of it only what every variant has (its code section,
entry points and binding), and a CPU load of a fat bundle never reads the rest. gpu_binding is defined once here (svodc
imports it)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from svodrt.errors import BundleFormatError
from svodrt.format import msgpack_sha256
from svodrt.schema import Bundle, Section, Variant, fail, field, items, name, uint, uints

MAX_GRID = (1 << 31) - 1  # blocks per launch (CUDA's grid x limit)
MAX_BLOCK = 1024  # threads per block


class Launch(NamedTuple):
    """One kernel launch: the kernel (in the plan) whose buffers are its arguments, the symbol in the code object,
    grid and block sizes."""

    kernel: int
    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dims: tuple[int, ...] = ()  # bounded dims (their indices) that scale the grid: svodrt_gpu.abi.launch_blocks


class GpuVariant(NamedTuple):
    variant: Variant
    launches: tuple[Launch, ...]
    cubin: Section | None  # cuda: the code compiled for the variant's architecture, beside its PTX


def gpu_binding(variant: Mapping, cubin_sha256: bytes | None) -> bytes:
    """Binds the kind, launch list and cubin to the variant's binding: docs/bundle-format.md "GPU variants"."""
    launches = [[x["kernel"], x["symbol"], list(x["grid"]), list(x["block"]), *([x["dims"]] if "dims" in x else [])]
                for x in variant["launches"]]  # "dims" in a bundle with dims: older runtimes refuse it here
    return msgpack_sha256([bytes(variant["binding"]), variant["kind"], bytes(cubin_sha256 or b""), launches])


def gpu_variant(b: Bundle, v: Variant) -> GpuVariant:
    try:
        return _read(b.manifest, v, b.sections)
    except BundleFormatError as e:  # as at load (svodrt/bundle.py parse_bundle)
        raise BundleFormatError(f"{e} (manifest at offset {b.header.manifest_offset})") from None


def _read(m: dict, v: Variant, sections: list[Section]) -> GpuVariant:
    raw, where, n = m["variants"][v.index], f"variants[{v.index}]", len(v.kernels)
    launches = []
    for j, x in enumerate(items(raw, "launches", where)):
        w = f"{where}.launches[{j}]"
        kernel = uint(x, "kernel", w)
        grid, block = uints(x, "grid", w, MAX_GRID), uints(x, "block", w, MAX_BLOCK)
        if kernel >= n or len(grid) != 3 or len(block) != 3 or 0 in (*grid, *block) or math.prod(block) > MAX_BLOCK:
            raise fail(w, f"kernel {kernel} of {n}, grid {grid}, block {block}: expected a kernel index, "
                       f"3 positive grid sizes and 3 positive block sizes of at most {MAX_BLOCK} threads in all")
        dims = uints(x, "dims", w, len(m.get("dims", ())) - 1) if "dims" in x else ()
        launches.append(Launch(kernel, name(x, "symbol", w), tuple(grid), tuple(block), tuple(dims)))  # type: ignore
    cubin = None
    if "cubin" in raw:
        ci = uint(raw, "cubin", where, len(sections))
        if ci >= len(sections) or sections[ci].kind != "code":
            raise fail(f"{where}.cubin", f"{ci} is not a code section")
        cubin = sections[ci]
    if field(raw, "gpu_binding", bytes, where) != gpu_binding(raw, cubin.sha256 if cubin else None):
        raise fail(f"{where}.gpu_binding", "does not match the variant's launch list and code: the manifest is "
                   "damaged or was edited")
    return GpuVariant(v, tuple(launches), cubin)
