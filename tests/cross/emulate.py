"""Run a bundle's code variant for another architecture under qemu-user, the way svodrt would.

The bundle is parsed by svodrt's own parser and the variant picked by svodrt's own selection
(`select_variant` for a host with the given features); inputs are validated by svodrt's
`check_input`. The native part, harness.c (built static by Debian's cross gcc), maps the code image
from the bundle file, applies the fixups, maps the weights, builds the buffer table and calls the
entry from several threads, exactly as svodrt/memory.py and svodrt/model.py do.

Inputs are written in the bundle's byte order (the target's host order) and outputs read back in it.
Tools: `make cross-tools` (scripts/install-cross-tools.sh) installs qemu-user and the cross gccs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from svodrt.bundle import check_section, parse_bundle
from svodrt.format import DTYPES
from svodrt.host import Host
from svodrt.model import check_input, select_variant

ROOT = Path(__file__).resolve().parents[2]
HARNESS_SRC = Path(__file__).with_name("harness.c")
BUILD = ROOT / "build" / "cross"


@dataclass(frozen=True)
class Emulator:
    arch: str
    gcc: str  # Debian cross compiler
    qemu: str  # qemu-user binary


EMULATORS = {
    "aarch64": Emulator("aarch64", "aarch64-linux-gnu-gcc", "qemu-aarch64"),
    "riscv64": Emulator("riscv64", "riscv64-linux-gnu-gcc", "qemu-riscv64"),
    "ppc64le": Emulator("ppc64le", "powerpc64le-linux-gnu-gcc", "qemu-ppc64le"),
    "s390x": Emulator("s390x", "s390x-linux-gnu-gcc", "qemu-s390x"),
    "x86_64": Emulator("x86_64", "gcc", "qemu-x86_64"),
}


def missing_tools(arch: str) -> list[str]:
    e = EMULATORS[arch]
    return [t for t in (e.gcc, e.qemu) if shutil.which(t) is None]


def harness(arch: str) -> Path:
    """The static harness for `arch`, rebuilt when harness.c is newer than it."""
    e = EMULATORS[arch]
    out = BUILD / f"harness-{arch}"
    if out.exists() and out.stat().st_mtime >= HARNESS_SRC.stat().st_mtime:
        return out
    BUILD.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    subprocess.run([e.gcc, "-O2", "-static", "-Wall", "-Werror", "-o", str(tmp), str(HARNESS_SRC), "-lpthread"],
                   check=True, capture_output=True, text=True)
    os.replace(tmp, out)
    return out


def run_emulated(bundle: bytes, arch: str, features: frozenset[str] | set[str], feeds: dict[str, np.ndarray],
                 qemu_cpu: str, threads: int = 2, timeout: float = 1800) -> dict[str, np.ndarray]:
    """One inference of `bundle` on an emulated `arch` host with `features`, under `qemu -cpu qemu_cpu`."""
    b = parse_bundle(bundle)
    variant = select_variant(b, Host(arch, frozenset(features)))
    check_section(bundle, variant.section)  # svodrt checks the code it runs (svodrt/memory.py map_code)
    order = "<" if b.manifest["byte_order"] == "little" else ">"
    arrays = [check_input(t, feeds[t.name]) for t in b.inputs]
    with tempfile.TemporaryDirectory(prefix="svod-cross-") as tmp:
        d = Path(tmp)
        path = d / "model.svod"
        path.write_bytes(bundle)
        lines = [f"{path} {variant.section.offset} {variant.section.length} {variant.entry} {b.weights.offset} "
                 f"{b.weights.length} {b.arena_size} {threads}", f"{len(variant.fixups)} " +
                 " ".join(map(str, variant.fixups)), str(len(arrays))]
        for i, a in enumerate(arrays):
            (d / f"in{i}").write_bytes(a.astype(a.dtype.newbyteorder(order)).tobytes())
            lines.append(f"{d / f'in{i}'} {a.nbytes}")
        lines.append(str(len(b.outputs)))
        for i, t in enumerate(b.outputs):
            lines.append(f"{d / f'out{i}'} {t.nbytes}")
        (d / "job").write_text("\n".join(lines) + "\n")
        cmd = [EMULATORS[arch].qemu, "-cpu", qemu_cpu, str(harness(arch)), str(d / "job")]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {r.returncode}: {r.stderr.strip()[-2000:]}")
        outs = {}
        for i, t in enumerate(b.outputs):
            dt = np.dtype(DTYPES[t.dtype][0])
            raw = np.frombuffer((d / f"out{i}").read_bytes(), dtype=dt.newbyteorder(order))
            outs[t.name] = raw.astype(dt).reshape(t.shape)
    return outs
