"""Cross-check of the RDNA3 decoder against LLVM's disassembler (the oracle; tests only, never needed
by `make test`): every instruction llvm-objdump lists in a code object's kernels must decode here to
the same opcode name and length. Also a tool: `python -m tests.gpu.rdna3.objdump FILE.hsaco` prints
the instructions our decoder does not know yet."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.gpu.rdna3.decode import UnknownInstruction, decode
from tests.gpu.rdna3.runner import CodeObject

_LINE = re.compile(r"\s+(\S+)(.*?)\s*// ([0-9A-F]+):((?: [0-9A-F]{8})+)")
_SKIP = {"s_code_end"}  # padding after the last kernel, never executed
# llvm-objdump 19 lists the true16 form of these VOP1 instructions writing a VGPR's high half (vdst bit 7,
# which LLVM 20 emits when it packs two halves) as `.long`: that one form is not cross-checked.
_TRUE16_HI_VOP1 = {"v_cvt_f16_f32"}


def _undecodable_by_oracle(name: str, ins) -> bool:
    return name == ".long" and ins.enc == "VOP1" and ins.name in _TRUE16_HI_VOP1 and ins.f["vdst"] >> 7 == 1


def find_objdump() -> str | None:
    return next((p for p in (shutil.which(f"llvm-objdump-{v}") for v in range(30, 16, -1)) if p), None)


def llvm_listing(elf: bytes) -> list[tuple[int, str, int]]:
    """(address, mnemonic, length in bytes) of every instruction llvm-objdump disassembles."""
    tool = find_objdump()
    assert tool is not None, "llvm-objdump (LLVM 17 or newer) is not installed"
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "code.hsaco"
        path.write_bytes(elf)
        out = subprocess.run([tool, "-d", "--mcpu=gfx1100", str(path)], capture_output=True, text=True,
                             check=True, timeout=300).stdout
    rows = []
    for line in out.splitlines():
        m = _LINE.match(line)
        if m:
            name = m.group(1)
            if name.startswith("v_dual_"):
                y = m.group(2).split("::")[1].split()[0]
                name = f"v_{name[7:]}::v_{y[7:]}"
            rows.append((int(m.group(3), 16), re.sub(r"_e(32|64)$", "", name), 4 * len(m.group(4).split())))
    return rows


def mismatches(elf: bytes) -> list[str]:
    """Every instruction whose decoding differs from llvm-objdump's (or that we cannot decode)."""
    image = CodeObject(elf).image
    out = []
    for address, name, size in llvm_listing(elf):
        if name in _SKIP:
            continue
        try:
            ins = decode(image, address)
        except UnknownInstruction as e:
            out.append(f"{name} at {address:#x}: {e}")
            continue
        if (ins.name, ins.size) != (name, size) and not _undecodable_by_oracle(name, ins):
            out.append(f"{address:#x}: llvm-objdump says {name} ({size} bytes), decoded {ins.name} ({ins.size})")
    return out


if __name__ == "__main__":
    for problem in sorted(set(p.split(" at ")[0] if " at " in p else p for p in mismatches(Path(sys.argv[1]).read_bytes()))):
        print(problem)
