"""Loading a gfx11 code object and dispatching its kernels as the HSA runtime does, in the emulator.

CodeObject reads the linked ELF (the bytes svodc puts in the bundle): the allocated sections at
their virtual addresses, the symbol table (kernel entry `NAME`, descriptor `NAME.kd`), the AMDGPU
metadata note (kernel arguments, hidden arguments) and the 64-byte kernel descriptor of each kernel
(the ABI of LLVM's AMDGPUUsage, code object v5). Dispatch sets each wave up from the descriptor's
bits, not from what our compiler happens to emit: the user SGPRs it enables (private segment buffer,
dispatch pointer, queue pointer, kernarg pointer, dispatch id, flat scratch init, private segment
size, in that order) from s0, USER_SGPR_COUNT of them; then the workgroup ids X/Y/Z it enables; the
workitem ids packed into v0 (X in bits 0-9, Y 10-19, Z 20-29: gfx11's packed layout); EXEC the lanes
the workgroup has. Waves run in lockstep batches (wave.py): the waves of up to WORKGROUPS_PER_BATCH
workgroups execute each instruction together; a scalar branch they disagree on splits the batch, the
lowest-PC batch runs first and batches meeting at a PC merge again; a batch at s_barrier waits
until every live wave of those workgroups is at one. That is one legal schedule of the waves (a GPU may
run them in any order between barriers), so a race-free kernel computes what it computes on
hardware. Features our kernels never use (scratch, dispatch/queue pointers, GDS) are refused with an EmulationError naming the kernel.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass

import numpy as np

from tests.gpu.rdna3 import salu, valu, vmem
from tests.gpu.rdna3.decode import Instr, UnknownInstruction, decode
from tests.gpu.rdna3.wave import EXEC, LANES, EmulationError, Memory, MemoryFault, Waves

SHT_SYMTAB, SHT_DYNSYM, SHF_ALLOC = 2, 11, 2
MAX_STEPS = 20_000_000  # instructions of one batch between switches: a runaway loop fails, not hangs
WORKGROUPS_PER_BATCH = 64  # waves of this many workgroups run in lockstep (bounds the register arrays)
# kernel_code_properties bits -> user SGPRs they take, in dispatch order
USER_SGPRS = [("private_segment_buffer", 4), ("dispatch_ptr", 2), ("queue_ptr", 2), ("kernarg_segment_ptr", 2),
              ("dispatch_id", 2), ("flat_scratch_init", 2), ("private_segment_size", 1)]
WAVE32_BIT = 10
LDS_FILL = 0xA5  # fresh LDS is not zero: code must not rely on it

HANDLERS = dict(salu.HANDLERS, VOP1=valu.execute_valu, VOP2=valu.execute_valu, VOPC=valu.execute_valu,
                VOP3=valu.execute_valu, VOPD=valu.execute_vopd, FLAT=vmem.execute_global, DS=vmem.execute_ds,
                MUBUF=vmem.execute_mubuf, VOP3P=valu.execute_vop3p)


@dataclass(frozen=True)
class Descriptor:
    group_segment_size: int
    private_segment_size: int
    kernarg_size: int
    entry: int  # address of the first instruction
    rsrc1: int
    rsrc2: int
    properties: int

    @property
    def user_sgpr_count(self) -> int:
        return (self.rsrc2 >> 1) & 0x1F

    @property
    def workgroup_ids(self) -> list[bool]:
        return [bool((self.rsrc2 >> b) & 1) for b in (7, 8, 9)]

    @property
    def vgprs(self) -> int:  # wave32 granule: 8 VGPRs
        return ((self.rsrc1 & 0x3F) + 1) * 8

    def enabled(self) -> list[tuple[str, int]]:
        return [(name, n) for bit, (name, n) in enumerate(USER_SGPRS) if (self.properties >> bit) & 1]


@dataclass
class Kernel:
    name: str
    descriptor: Descriptor
    args: list[dict]  # the metadata note's .args
    decoded: dict[int, tuple[object, Instr, int]]


class CodeObject:
    def __init__(self, elf: bytes):
        from svodc.codegen.gpu_tools import amd_metadata

        self.metadata = amd_metadata(elf)["metadata"]
        if not self.metadata["amdhsa.target"].endswith("gfx1100"):
            raise EmulationError(f"RDNA3 emulator: code object for {self.metadata['amdhsa.target']}, not gfx1100")
        self.image, symbols = self._load(elf)
        self.kernels: dict[str, Kernel] = {}
        for k in self.metadata["amdhsa.kernels"]:
            if k.get(".wavefront_size") != LANES:
                raise EmulationError(f"RDNA3 emulator: kernel {k['.name']} is not wave32")
            kd = symbols[k[".symbol"]]
            gs, ps, ks, _, entry_off = struct.unpack_from("<IIIIq", self.image, kd)
            _rsrc3, rsrc1, rsrc2, props = struct.unpack_from("<IIIH", self.image, kd + 44)
            d = Descriptor(gs, ps, ks, kd + entry_off, rsrc1, rsrc2, props)
            if d.entry != symbols.get(k[".name"], d.entry):
                raise EmulationError(f"RDNA3 emulator: {k['.name']}.kd does not point at {k['.name']}")
            if not (props >> WAVE32_BIT) & 1:
                raise EmulationError(f"RDNA3 emulator: {k['.name']}.kd does not enable wave32")
            self.kernels[k[".name"]] = Kernel(k[".name"], d, k[".args"], {})

    @staticmethod
    def _load(elf: bytes) -> tuple[bytearray, dict[str, int]]:
        shoff, = struct.unpack_from("<Q", elf, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
        end = max((s[3] + s[5] for s in sections if s[2] & SHF_ALLOC), default=0)
        image = bytearray(end)
        for _, typ, flags, addr, off, size, *_ in sections:
            if flags & SHF_ALLOC and typ != 8:  # SHT_NOBITS stays zero
                image[addr: addr + size] = elf[off: off + size]
        symbols = {}
        for _, typ, _, _, off, size, link, _, _, entsize in sections:
            if typ not in (SHT_SYMTAB, SHT_DYNSYM):
                continue
            stroff = sections[link][4]
            for p in range(off, off + size, entsize):
                name_at, _, _, _, value, _ = struct.unpack_from("<IBBHQQ", elf, p)
                name = elf[stroff + name_at: elf.index(b"\0", stroff + name_at)].decode()
                if name:
                    symbols[name] = value
        return image, symbols


def kernarg_segment(kernel: Kernel, explicit: list[bytes], grid: tuple[int, int, int],
                    block: tuple[int, int, int]) -> np.ndarray:
    """The kernarg segment a HIP dispatch builds: each explicit argument at its metadata offset, and
    the hidden arguments of code object v5 the metadata lists (block counts, group sizes, remainders,
    grid dimensions; every other hidden argument zero)."""
    seg = np.zeros(max(kernel.descriptor.kernarg_size, 8), np.uint8)
    values = {f"hidden_block_count_{a}": grid[i] for i, a in enumerate("xyz")}
    values |= {f"hidden_group_size_{a}": block[i] for i, a in enumerate("xyz")}
    values |= {f"hidden_remainder_{a}": 0 for a in "xyz"}
    values["hidden_grid_dims"] = 1 + (grid[1] > 1 or block[1] > 1) + (grid[2] > 1 or block[2] > 1)
    it = iter(explicit)
    for a in kernel.args:
        off, size, kind = a[".offset"], a[".size"], a[".value_kind"]
        data = next(it) if not kind.startswith("hidden_") else values.get(kind, 0).to_bytes(size, "little")
        seg[off: off + size] = np.frombuffer(data[:size], np.uint8)
    return seg


class Emulator:
    """lockstep=False: the reference schedule instead of batches -- each workgroup's waves one at a time,
    each to its next barrier or its end, in order (slow: tests compare the two on small models)."""

    def __init__(self, code: CodeObject, lockstep: bool = True):
        self.code = code
        self.lockstep = lockstep
        self.instructions = 0

    def _instr(self, k: Kernel, pc: int) -> tuple[object, Instr, int]:
        """(handler, instruction, address of the next one) of the first instruction with an effect at
        or after pc: scheduling hints and waits (salu.NO_EFFECT) are skipped once, when decoded."""
        got = k.decoded.get(pc)
        if got is None:
            at = pc
            ins = decode(self.code.image, at)
            while ins.enc == "SOPP" and ins.name in salu.NO_EFFECT:
                at += ins.size
                ins = decode(self.code.image, at)
            if ins.enc not in HANDLERS:
                raise UnknownInstruction(f"RDNA3 emulator: {ins.where()} has no implementation")
            got = k.decoded[pc] = (HANDLERS[ins.enc], ins, at + ins.size)
        return got

    def _run(self, k: Kernel, w: Waves, stop: int | None) -> str:
        """Run a batch until it ends ("done"), reaches a barrier ("barrier"), disagrees on a branch
        ("split") or reaches the PC `stop` of another ready batch or beyond ("yield")."""
        pc, steps = w.pc, 0
        try:
            while True:
                handler, ins, w.pc = self._instr(k, pc)
                steps += 1
                try:
                    handler(w, ins)
                except salu.Barrier:
                    return "barrier"
                if w.done:
                    return "done"
                if w.split is not None:
                    return "split"
                pc = w.pc
                if stop is not None and pc >= stop:
                    return "yield"
                if steps > MAX_STEPS:
                    raise EmulationError(f"RDNA3 emulator: {k.name} ran {steps} instructions without ending")
        except (UnknownInstruction, EmulationError, MemoryFault):
            raise
        except Exception as e:
            raise EmulationError(f"RDNA3 emulator: {k.name}: {ins.where()} failed: {e!r}") from e
        finally:
            self.instructions += steps * w.n

    def _schedule(self, k: Kernel, first: Waves) -> None:
        """Every batch to the end. The ready batch with the lowest PC runs first and batches meeting at
        one PC merge (so waves split by a branch reconverge); barriers release when every live wave
        waits at one."""
        if not self.lockstep:
            self._one_at_a_time(k, first)
            return
        ready, parked = [first], []
        while ready or parked:
            if not ready:
                ready, parked = parked, []
            ready.sort(key=lambda b: b.pc)
            merged: list[Waves] = []
            for b in ready:
                if merged and merged[-1].pc == b.pc:
                    merged[-1] = Waves.merge([merged[-1], b])
                else:
                    merged.append(b)
            w, ready = merged[0], merged[1:]
            status = self._run(k, w, ready[0].pc if ready else None)
            if status == "barrier":
                parked.append(w)
            elif status == "yield":
                ready.append(w)
            elif status == "split":
                taken, target = w.split, w.target
                w.split = None
                jumped = w.select(taken)
                jumped.pc = target
                ready += [w.select(~taken), jumped]

    def _one_at_a_time(self, k: Kernel, batch: Waves) -> None:
        waves = [batch.select(np.arange(batch.n) == i) for i in range(batch.n)]
        while waves:
            for w in waves:
                self._run(k, w, None)  # a batch of one wave never splits
            waves = [w for w in waves if not w.done]

    def _batch(self, k: Kernel, memory: Memory, kernarg: int, groups: list[tuple[int, int, int]],
               block: tuple[int, int, int]) -> Waves:
        """The waves of some workgroups, set up as the dispatcher does from the kernel descriptor."""
        d = k.descriptor
        threads = block[0] * block[1] * block[2]
        per_group = -(-threads // LANES)
        lds_size = max(d.group_segment_size, 4)
        lds = np.full(len(groups) * lds_size, LDS_FILL, np.uint8)
        lds_base = np.repeat(np.arange(len(groups), dtype=np.int64) * lds_size, per_group * LANES)
        w = Waves(d.vgprs, len(groups) * per_group, memory, lds, lds_size, lds_base)
        s = 0
        for name, n in d.enabled():
            if name != "kernarg_segment_ptr":
                raise EmulationError(f"RDNA3 emulator: {k.name} asks for the {name} user SGPRs (not provided)")
            w.s[s], w.s[s + 1] = kernarg & 0xFFFFFFFF, kernarg >> 32
            s += n
        s = d.user_sgpr_count
        ids = np.array(groups, np.uint64).reshape(-1, 3)
        for axis, enabled in enumerate(d.workgroup_ids):
            if enabled:
                w.s[s] = np.repeat(ids[:, axis], per_group)
                s += 1
        if (d.rsrc2 & 1) or (d.rsrc2 >> 10) & 1:
            raise EmulationError(f"RDNA3 emulator: {k.name} enables the private segment / workgroup info SGPRs")
        flat = np.tile(np.arange(per_group * LANES), len(groups))
        bx, by, _ = block
        w.v[0] = ((flat % bx) | (((flat // bx) % by) << 10) | ((flat // (bx * by)) << 20)).astype(np.uint32)
        w.s[EXEC] = w.to_bits(flat < threads)
        w.pc = d.entry
        return w

    def dispatch(self, name: str, grid: tuple[int, int, int], block: tuple[int, int, int], explicit: list[bytes],
                 memory: Memory) -> None:
        k = self.code.kernels[name]
        d = k.descriptor
        if d.private_segment_size:
            raise EmulationError(f"RDNA3 emulator: {name} uses {d.private_segment_size} bytes of scratch")
        kernarg = memory.add(kernarg_segment(k, explicit, grid, block))
        groups = [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
        with np.errstate(all="ignore"):  # IEEE results (inf, NaN) are what the hardware computes too
            step = WORKGROUPS_PER_BATCH if self.lockstep else 1
            for i in range(0, len(groups), step):
                self._schedule(k, self._batch(k, memory, kernarg, groups[i: i + step], block))


def stub_memory(lib: ctypes.CDLL) -> Memory:
    """Every live allocation of the stand-in driver, addressable by the emulator."""
    lib.svod_stub_allocation.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t)]
    memory = Memory()
    p, n = ctypes.c_uint64(), ctypes.c_size_t()
    for i in range(lib.svod_stub_live_allocations()):
        lib.svod_stub_allocation(i, ctypes.byref(p), ctypes.byref(n))
        memory.add(np.ctypeslib.as_array((ctypes.c_uint8 * n.value).from_address(p.value)))
    return memory
