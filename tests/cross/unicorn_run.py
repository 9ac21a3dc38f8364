"""Run a bundle's aarch64 or riscv64 code in-process with unicorn (PyPI; no SVE/RVV), for `make test`,
where CI has no qemu-user: it proves on every run that the linker's relocations and fixups and the
entry ABI work, on the real bundle bytes (ppc64le, s390x and the vector extensions: the qemu tier).

What svodrt does, in an emulated address space: svodrt's parser and variant selection, the code
image at a 4 KiB-aligned base with every fixup word (bundle byte order) plus that base, the weights
section as stored, the buffer table [arena, weights, inputs..., outputs...], a zeroed sync block,
and one call svod_entry(bufs, dims, 0, 1, sync) per the platform's C calling convention (dims: NULL,
or the values of a bundle's bounded dims, with inputs and outputs at the bounds, as svodrt/runner.py), returning
to an address where emulation stops. One thread: unicorn runs one CPU (the barrier returns at once
for nthreads = 1; the qemu tier runs two threads).
"""

from __future__ import annotations

import struct

import numpy as np

from svodrt.bundle import check_section, parse_bundle
from svodrt.format import DTYPES
from svodrt.host import Host
from svodrt.model import check_input, select_variant
from svodrt.runner import at_bound, dim_values, real_output

PAGE = 4096
CODE, DATA, STACK, STACK_SIZE = 0x1000_0000, 0x4000_0000, 0x7000_0000, 1 << 20
RETURN = 0x7F00_0000  # the entry returns here; emulation stops


def _up(n: int) -> int:
    return max(PAGE, (n + PAGE - 1) // PAGE * PAGE)


def _engine(arch: str, features: set[str]):
    import unicorn as uc
    from unicorn import arm64_const, riscv_const

    if arch == "aarch64":
        mu = uc.Uc(uc.UC_ARCH_ARM64, uc.UC_MODE_ARM)
        if "dotprod" in features:  # the default CPU (Cortex-A72) lacks it; "max" has it
            mu.ctl_set_cpu_model(arm64_const.UC_CPU_ARM64_MAX)
        mu.reg_write(arm64_const.UC_ARM64_REG_CPACR_EL1, 3 << 20)  # FP/SIMD on at EL0/EL1, as Linux sets it
        regs = [arm64_const.UC_ARM64_REG_X0 + i for i in range(5)]
        return mu, regs, arm64_const.UC_ARM64_REG_SP, arm64_const.UC_ARM64_REG_LR, arm64_const.UC_ARM64_REG_PC
    if arch == "riscv64":
        mu = uc.Uc(uc.UC_ARCH_RISCV, uc.UC_MODE_RISCV64)
        fs_dirty = 3 << 13  # mstatus.FS: the FPU is off until the OS turns it on
        mu.reg_write(riscv_const.UC_RISCV_REG_MSTATUS, mu.reg_read(riscv_const.UC_RISCV_REG_MSTATUS) | fs_dirty)
        regs = [riscv_const.UC_RISCV_REG_A0 + i for i in range(5)]
        return mu, regs, riscv_const.UC_RISCV_REG_SP, riscv_const.UC_RISCV_REG_RA, riscv_const.UC_RISCV_REG_PC
    raise ValueError(f"unicorn runs aarch64 and riscv64 here, not {arch} (s390x and ppc64le: the qemu tier)")


def run_unicorn(bundle: bytes, arch: str, features: set[str], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    b = parse_bundle(bundle)
    v = select_variant(b, Host(arch, frozenset(features)))
    check_section(bundle, v.section)  # svodrt checks the code it runs (svodrt/memory.py map_code)
    order = "<" if b.manifest["byte_order"] == "little" else ">"
    mu, arg_regs, sp_reg, ret_reg, pc_reg = _engine(arch, features)

    code = bytearray(bundle[v.section.offset: v.section.offset + v.section.length])
    for off in v.fixups:  # what svodrt/memory.py map_code does, at the emulated base
        (word,) = struct.unpack_from(order + "Q", code, off)
        if word > len(code):
            raise ValueError(f"fixup at {off} holds {word}, not an offset inside the image")
        struct.pack_into(order + "Q", code, off, word + CODE)
    mu.mem_map(CODE, _up(len(code)))
    mu.mem_write(CODE, bytes(code))

    arrays = [check_input(t, feeds[t.name]) for t in b.inputs]
    dims = dim_values(b.inputs, arrays, b.dims) if b.dims else None
    if dims is not None:
        arrays = [at_bound(t, a) for t, a in zip(b.inputs, arrays, strict=True)]
    blobs = [bytes(bundle[b.weights.offset: b.weights.offset + b.weights.length])]
    blobs += [a.astype(a.dtype.newbyteorder(order)).tobytes() for a in arrays]
    sizes = [b.arena_size, b.weights.length, *(t.nbytes for t in b.inputs), *(t.nbytes for t in b.outputs)]
    addrs, at = [], DATA
    for size in sizes:
        addrs.append(at)
        at += _up(size)
    table, sync, dims_at = at, at + PAGE, at + 2 * PAGE
    mu.mem_map(DATA, at + 3 * PAGE - DATA)
    if dims is not None:
        mu.mem_write(dims_at, struct.pack(f"{order}{len(dims)}q", *dims))
    for addr, blob in zip(addrs[1:], blobs, strict=False):
        mu.mem_write(addr, blob)
    mu.mem_write(table, struct.pack(f"{order}{len(addrs)}Q", *addrs))
    mu.mem_map(STACK, STACK_SIZE)
    mu.mem_map(RETURN, PAGE)

    for reg, value in zip(arg_regs, (table, 0 if dims is None else dims_at, 0, 1, sync), strict=True):
        mu.reg_write(reg, value)
    mu.reg_write(sp_reg, STACK + STACK_SIZE - 256)
    mu.reg_write(ret_reg, RETURN)
    mu.emu_start(CODE + v.entry, RETURN, timeout=600 * 1_000_000)  # microseconds
    if mu.reg_read(pc_reg) != RETURN:  # emu_start also stops silently on its timeout
        raise RuntimeError(f"{arch} entry did not return (stopped at {mu.reg_read(pc_reg):#x})")
    outs = {}
    for t, addr in zip(b.outputs, addrs[2 + len(arrays):], strict=True):
        dt = np.dtype(DTYPES[t.dtype][0])
        raw = np.frombuffer(bytes(mu.mem_read(addr, t.nbytes)), dtype=dt.newbyteorder(order))
        outs[t.name] = raw.astype(dt).reshape(t.shape)
        if dims is not None:
            outs[t.name] = real_output(t, outs[t.name], dims, {d.name: i for i, d in enumerate(b.dims)})
    return outs
