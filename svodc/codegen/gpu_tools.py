"""External tools for GPU code objects, and the check of what they produce.

- AMD: LLVM emits a relocatable object; the HIP/HSA loaders need a shared object, which ld.lld makes
  (`ld.lld -shared`). Found as: the `ziglang` package (the svod[gpu] extra: it ships LLD,
  run as `python -m ziglang ld.lld`), else `ld.lld-NN` or `ld.lld` on PATH if it is LLVM 18 or newer
  (Debian's plain `lld` is 14: too old for gfx12). None: ToolMissingError saying what to install.
- NVIDIA: `ptxas` (CUDA toolkit) turns PTX into a cubin when it is on the build machine; without it
  the bundle carries PTX only, which the driver compiles at load (slower first load, same code).

check_amd_code_object() reads the linked object's ELF header and its AMDGPU metadata note (msgpack)
and refuses one that is not a loadable code object v5 for the architecture listing every kernel.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import msgpack

from svodc.errors import CodegenError, ToolMissingError

LLD_MIN_VERSION = 18
TOOL_TIMEOUT_S = 600
ET_DYN, EM_AMDGPU, ELFOSABI_AMDGPU_HSA, ABI_VERSION_V5 = 3, 224, 64, 3
NT_AMDGPU_METADATA = 32
SHT_NOTE = 7


def _version(cmd: list[str]) -> int:
    try:
        out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    m = re.search(r"LLD (\d+)", out)
    return int(m.group(1)) if m else 0


@functools.cache
def find_lld() -> tuple[str, ...]:
    if importlib.util.find_spec("ziglang") is not None:
        cmd = [sys.executable, "-m", "ziglang", "ld.lld"]
        if _version(cmd) >= LLD_MIN_VERSION:
            return tuple(cmd)
    names = [f"ld.lld-{v}" for v in range(30, LLD_MIN_VERSION - 1, -1)] + ["ld.lld"]
    for name in names:
        path = shutil.which(name)
        if path and _version([path]) >= LLD_MIN_VERSION:
            return (path,)
    raise ToolMissingError(f"AMD GPU targets need ld.lld (LLVM {LLD_MIN_VERSION} or newer) to link code objects: "
                           "pip install 'svod[gpu]' (the ziglang package), or apt-get install lld-22")


@functools.cache
def find_ptxas() -> str | None:
    return shutil.which("ptxas") or next((p for p in ("/usr/local/cuda/bin/ptxas",) if Path(p).exists()), None)


def _run(cmd: list[str], what: str) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        raise CodegenError(f"{what}: cannot run {cmd[0]}: {e}") from None
    if r.returncode != 0:
        msg = " ".join((r.stderr or r.stdout).split())[:600]
        raise CodegenError(f"{what}: {Path(cmd[0]).name} failed: {msg}")


def link_amd_code_object(obj: bytes, what: str) -> bytes:
    """Relocatable AMDGPU object -> loadable code object (an ET_DYN shared object)."""
    lld = list(find_lld())
    with tempfile.TemporaryDirectory(prefix="svodc-lld-") as d:
        src, out = Path(d) / "kernels.o", Path(d) / "kernels.hsaco"
        src.write_bytes(obj)
        _run([*lld, "-shared", "--no-undefined", "--build-id=none", "-o", str(out), str(src)], what)
        return out.read_bytes()


def assemble_ptx(ptx: str, arch: str, what: str) -> bytes | None:
    """PTX -> cubin for `arch` with ptxas, or None when ptxas is not installed."""
    ptxas = find_ptxas()
    if ptxas is None:
        return None
    with tempfile.TemporaryDirectory(prefix="svodc-ptxas-") as d:
        src, out = Path(d) / "kernels.ptx", Path(d) / "kernels.cubin"
        src.write_text(ptx)
        _run([ptxas, f"-arch={arch}", "-O3", "-o", str(out), str(src)], what)
        return out.read_bytes()


def amd_metadata(elf: bytes) -> dict:
    """The ELF header facts and the AMDGPU metadata note of a code object:
    {"type", "machine", "osabi", "abi_version", "metadata": the note's msgpack map}."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise CodegenError("AMD code object: not a 64-bit little-endian ELF file")
    e_type, machine = struct.unpack_from("<HH", elf, 16)
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    notes = []
    for i in range(shnum):
        _, typ, _, _, off, size, *_ = struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)
        p = off
        while typ == SHT_NOTE and p + 12 <= off + size:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, p)
            name = elf[p + 12: p + 12 + namesz].rstrip(b"\0")
            desc_at = p + 12 + (namesz + 3) // 4 * 4
            if name == b"AMDGPU" and ntype == NT_AMDGPU_METADATA:
                notes.append(msgpack.unpackb(elf[desc_at: desc_at + descsz], strict_map_key=False))
            p = desc_at + (descsz + 3) // 4 * 4
    if len(notes) != 1:
        raise CodegenError(f"AMD code object: expected one AMDGPU metadata note, found {len(notes)}")
    return {"type": e_type, "machine": machine, "osabi": elf[7], "abi_version": elf[8], "metadata": notes[0]}


def check_amd_code_object(elf: bytes, arch: str, kernels: dict[str, int]) -> dict:
    """Refuse a code object the HIP loader would not take as ours: not ET_DYN AMDGPU HSA code
    object v5 for `arch`, or a kernel (symbol -> pointer arguments) missing from its metadata or
    with other arguments. Returns the metadata note."""
    info = amd_metadata(elf)
    want = (ET_DYN, EM_AMDGPU, ELFOSABI_AMDGPU_HSA, ABI_VERSION_V5)
    got = (info["type"], info["machine"], info["osabi"], info["abi_version"])
    if got != want:
        raise CodegenError(f"AMD code object for {arch}: ELF (type, machine, OS ABI, ABI version) is {got}, "
                           f"expected {want} (a shared object, AMDGPU, HSA, code object v5)")
    md = info["metadata"]
    if md.get("amdhsa.target", "").split("--")[-1] != arch:
        raise CodegenError(f"AMD code object for {arch} targets {md.get('amdhsa.target')!r}")
    listed = {k[".name"]: k for k in md.get("amdhsa.kernels", [])}
    for name, nargs in kernels.items():
        k = listed.get(name)
        if k is None or k.get(".symbol") != f"{name}.kd":
            raise CodegenError(f"AMD code object for {arch}: kernel {name} (descriptor {name}.kd) is not in its "
                               "metadata")
        args = [a for a in k.get(".args", []) if not a.get(".value_kind", "").startswith("hidden_")]
        if [(a[".offset"], a[".size"]) for a in args] != [(8 * i, 8) for i in range(nargs)]:
            raise CodegenError(f"AMD code object for {arch}: kernel {name} takes {args}, expected {nargs} pointers")
    return md
