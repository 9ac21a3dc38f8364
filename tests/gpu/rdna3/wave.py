"""The state of one wave32 wavefront and of the memory it sees, and operand reads and writes.

SGPRs are Python ints (s[0..105], VCC_LO/HI at 106/107, M0 at 125, EXEC_LO/HI at 126/127: the operand
numbers of the manual); VGPRs a (count, 32) uint32 array, one column per lane. Vector results are
written only to the lanes EXEC enables. Memory is a set of regions (host arrays at their own host
addresses: the stand-in driver's allocations, the kernarg segment); an access outside every region
is a MemoryFault naming the address and the PC.
"""

from __future__ import annotations

import bisect
import struct

import numpy as np

LANES = 32
LANE_BITS = np.uint64(1) << np.arange(LANES, dtype=np.uint64)
VCC, NULL, M0, EXEC, SCC_SRC, LITERAL = 106, 124, 125, 126, 253, 255
MASK32, MASK64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
_F32 = {240: 0.5, 241: -0.5, 242: 1.0, 243: -1.0, 244: 2.0, 245: -2.0, 246: 4.0, 247: -4.0, 248: 0.15915494309189535}


def _float_consts(fmt: str, mask: int) -> dict[int, int]:
    return {k: int.from_bytes(struct.pack(fmt, v), "little") & mask for k, v in _F32.items()}


INLINE = {16: _float_consts("<e", 0xFFFF), 32: _float_consts("<f", MASK32), 64: _float_consts("<d", MASK64)}


class MemoryFault(Exception):
    """A load or store outside every memory region the emulated kernel was given."""


class EmulationError(Exception):
    """The kernel did something the emulator refuses (an unsupported modifier, a runaway loop)."""


class Memory:
    """Regions of host memory addressed by their host address (what the stand-in driver hands out)."""

    def __init__(self):
        self._bases: list[int] = []
        self._arrays: list[np.ndarray] = []

    def add(self, array: np.ndarray) -> int:
        """Make a uint8 array addressable; returns its address."""
        assert array.dtype == np.uint8 and array.ndim == 1
        base = array.ctypes.data
        i = bisect.bisect(self._bases, base)
        self._bases.insert(i, base)
        self._arrays.insert(i, array)
        return base

    def region(self, lo: int, hi: int, where: str) -> tuple[int, np.ndarray]:
        """(base, array) of the region holding bytes [lo, hi)."""
        i = bisect.bisect(self._bases, lo) - 1
        if i >= 0 and hi <= self._bases[i] + self._arrays[i].size:
            return self._bases[i], self._arrays[i]
        raise MemoryFault(f"RDNA3 emulator: access to [{lo:#x}, {hi:#x}) by {where} is outside device memory")

    def gather(self, addr: np.ndarray, nbytes: int, where: str) -> np.ndarray:
        """(lanes, nbytes) uint8 of the bytes at each address (a uint64 array of the active lanes)."""
        if addr.size == 0:
            return np.zeros((0, nbytes), np.uint8)
        base, arr = self.region(int(addr.min()), int(addr.max()) + nbytes, where)
        return arr[(addr - np.uint64(base)).astype(np.int64)[:, None] + np.arange(nbytes)]

    def scatter(self, addr: np.ndarray, data: np.ndarray, where: str) -> None:
        if addr.size == 0:
            return
        base, arr = self.region(int(addr.min()), int(addr.max()) + data.shape[1], where)
        arr[(addr - np.uint64(base)).astype(np.int64)[:, None] + np.arange(data.shape[1])] = data

    def read(self, address: int, nbytes: int, where: str) -> bytes:
        base, arr = self.region(address, address + nbytes, where)
        return arr[address - base: address - base + nbytes].tobytes()


class Wave:
    def __init__(self, nvgpr: int, memory: Memory, lds: np.ndarray, code: bytes):
        self.s = [0] * 128
        self.v = np.zeros((nvgpr, LANES), np.uint32)
        self.scc = 0
        self.pc = 0
        self.memory, self.lds, self.code = memory, lds, code
        self.done = False
        self._mask_of, self._mask = -1, np.zeros(LANES, bool)

    # ------------------------------------------------------------------ EXEC and lane masks
    def exec_mask(self) -> np.ndarray:
        e = self.s[EXEC]
        if e != self._mask_of:
            self._mask_of, self._mask = e, ((np.uint64(e) & LANE_BITS) != 0)
        return self._mask

    @staticmethod
    def lane_mask(bits: int) -> np.ndarray:
        return (np.uint64(bits & MASK32) & LANE_BITS) != 0

    @staticmethod
    def to_bits(mask: np.ndarray) -> int:
        return int(LANE_BITS[mask].sum())

    # ------------------------------------------------------------------ scalar operands
    def sread(self, code: int, literal: int | None, width: int = 32) -> int:
        """A scalar operand (SGPR, special register, inline or literal constant) as an int."""
        if code < NULL or code in (M0, EXEC, EXEC + 1):
            lo = self.s[code]
            return lo if width == 32 else lo | (self.s[code + 1] << 32)
        if code == NULL:
            return 0
        if 128 <= code <= 192:
            return code - 128
        if 193 <= code <= 208:
            return (128 + 64 - code) & (MASK32 if width == 32 else MASK64)
        if code in INLINE[32]:
            return INLINE[64 if width == 64 else 32][code]
        if code == SCC_SRC:
            return self.scc
        if code == LITERAL:
            if width == 64 and literal >> 31:
                raise EmulationError(f"RDNA3 emulator: 64-bit operand with literal {literal:#x} (sign unclear)")
            return literal
        raise EmulationError(f"RDNA3 emulator: scalar operand {code} is not implemented")

    def swrite(self, code: int, value: int, width: int = 32) -> None:
        if code == NULL:
            return
        if code > EXEC + 1 or (code > VCC + 1 and code not in (M0, EXEC, EXEC + 1)):
            raise EmulationError(f"RDNA3 emulator: write to scalar operand {code}")
        self.s[code] = value & MASK32
        if width == 64:
            self.s[code + 1] = (value >> 32) & MASK32

    # ------------------------------------------------------------------ vector operands
    def vread(self, code: int, literal: int | None, width: int = 32) -> np.ndarray:
        """A vector-instruction source (9-bit code) for all lanes: uint32 (or uint64 for width 64)."""
        if code >= 256:
            r = code - 256
            if width == 64:
                return self.v[r].astype(np.uint64) | (self.v[r + 1].astype(np.uint64) << np.uint64(32))
            return self.v[r]
        if width == 16 and code in INLINE[16]:
            val = INLINE[16][code]
        else:
            val = self.sread(code, literal, width)
        return np.full(LANES, val, np.uint64 if width == 64 else np.uint32)

    def vwrite(self, reg: int, value: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Write a uint32 result to VGPR `reg` in the lanes of `mask` (default: EXEC)."""
        if mask is None and self.s[EXEC] == MASK32:
            self.v[reg] = value
            return
        m = self.exec_mask() if mask is None else mask
        np.copyto(self.v[reg], value.astype(np.uint32, copy=False), where=m)

    def vwrite64(self, reg: int, value: np.ndarray) -> None:
        value = value.astype(np.uint64, copy=False)
        self.vwrite(reg, (value & np.uint64(MASK32)).astype(np.uint32))
        self.vwrite(reg + 1, (value >> np.uint64(32)).astype(np.uint32))
