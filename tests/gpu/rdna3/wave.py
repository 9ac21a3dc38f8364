"""The state of a batch of wave32 waves that stand at the same PC, and of the memory they see.

A batch holds W waves of one dispatch executed in lockstep: each instruction runs for every wave
of the batch at once (NumPy over W x 32 lanes), which is one legal interleaving of waves that
synchronize only at barriers. A scalar branch the waves disagree on splits the batch (runner.py).
SGPRs are a (128, W) uint64 array of 32-bit values indexed by the manual's operand numbers
(s0..s105, VCC_LO/HI 106/107, M0 125, EXEC_LO/HI 126/127); SCC a (W,) array; VGPRs a
(count, W * 32) uint32 array, lane l of wave w in column 32 w + l. Vector results are written only
to the lanes EXEC enables. Memory is a set of regions (host arrays at their own host addresses: the
stand-in driver's allocations, the kernarg segment); an access outside every region is a
MemoryFault naming the address and the instruction.
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
U32, U64 = np.uint32, np.uint64


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

    def _groups(self, addr: np.ndarray, nbytes: int, where: str):
        """(lane selector, region array, byte offsets) per region the addresses fall in."""
        lo, hi = int(addr.min()), int(addr.max())
        i = bisect.bisect(self._bases, lo) - 1
        if i >= 0 and hi + nbytes <= self._bases[i] + self._arrays[i].size:  # the usual case: one buffer
            yield slice(None), self._arrays[i], (addr - U64(self._bases[i])).astype(np.int64)
            return
        which = np.searchsorted(np.array(self._bases, U64), addr, "right") - 1
        for r in np.unique(which):
            sel = which == r
            a = addr[sel]
            if r < 0 or int(a.max()) + nbytes > self._bases[r] + self._arrays[r].size:
                bad = int(a.min()) if r < 0 else int(a.max())
                raise MemoryFault(f"RDNA3 emulator: access to {bad:#x} (+{nbytes}) by {where} is outside device "
                                  "memory")
            yield sel, self._arrays[r], (a - U64(self._bases[r])).astype(np.int64)

    def gather(self, addr: np.ndarray, nbytes: int, where: str) -> np.ndarray:
        """(len(addr), nbytes) uint8: the bytes at each address (uint64)."""
        out = np.empty((addr.size, nbytes), np.uint8)
        if addr.size:
            for sel, arr, off in self._groups(addr, nbytes, where):
                out[sel] = arr[off[:, None] + np.arange(nbytes)]
        return out

    def scatter(self, addr: np.ndarray, data: np.ndarray, where: str) -> None:
        if addr.size:
            for sel, arr, off in self._groups(addr, data.shape[1], where):
                arr[off[:, None] + np.arange(data.shape[1])] = data[sel]


class Waves:
    """W waves in lockstep (see the module docstring)."""

    def __init__(self, nvgpr: int, nwaves: int, memory: Memory, lds: np.ndarray, lds_size: int,
                 lds_base: np.ndarray):
        self.n = nwaves
        self.s = np.zeros((128, nwaves), U64)
        self.v = np.zeros((nvgpr, nwaves * LANES), U32)
        self.scc = np.zeros(nwaves, U64)
        self.pc = 0
        self.memory, self.lds, self.lds_size = memory, lds, lds_size
        self.lds_base = lds_base  # per lane: where its workgroup's LDS starts in `lds`
        self.done = False
        self.split: np.ndarray | None = None  # set by a branch the waves disagree on: the waves that take it
        self.target = 0
        self._mask_of: np.ndarray | None = None
        self._mask = np.zeros(nwaves * LANES, bool)
        self._full = False

    def select(self, waves: np.ndarray) -> Waves:
        """A new batch of some of these waves (a boolean selector over W), sharing memory and LDS."""
        lanes = np.repeat(waves, LANES)
        b = Waves.__new__(Waves)
        b.n = int(waves.sum())
        b.s, b.v, b.scc = self.s[:, waves].copy(), self.v[:, lanes].copy(), self.scc[waves].copy()
        b.pc, b.memory, b.lds, b.lds_size = self.pc, self.memory, self.lds, self.lds_size
        b.lds_base = self.lds_base[lanes]
        b.done, b.split, b.target, b._mask_of, b._mask, b._full = False, None, 0, None, self._mask, False
        return b

    @staticmethod
    def merge(batches: list[Waves]) -> Waves:
        b = batches[0]
        if len(batches) > 1:
            b.s = np.concatenate([x.s for x in batches], 1)
            b.v = np.concatenate([x.v for x in batches], 1)
            b.scc = np.concatenate([x.scc for x in batches])
            b.lds_base = np.concatenate([x.lds_base for x in batches])
            b.n = sum(x.n for x in batches)
            b._mask_of = None
        return b

    # ------------------------------------------------------------------ EXEC and lane masks
    def exec_mask(self) -> np.ndarray:
        e = self.s[EXEC]
        if self._mask_of is None or not np.array_equal(e, self._mask_of):
            self._mask_of = e.copy()
            self._mask = self.lane_mask(e)
            self._full = bool(self._mask.all())
        return self._mask

    def exec_full(self) -> bool:
        self.exec_mask()
        return self._full

    @staticmethod
    def lane_mask(bits: np.ndarray) -> np.ndarray:
        """Per-wave 32-bit masks (W,) -> per-lane booleans (W * 32,)."""
        return ((bits[:, None] & LANE_BITS) != 0).reshape(-1)

    @staticmethod
    def to_bits(mask: np.ndarray) -> np.ndarray:
        """Per-lane booleans -> per-wave 32-bit masks (W,) uint64."""
        return np.packbits(mask.reshape(-1, LANES), axis=1, bitorder="little").view("<u4")[:, 0].astype(U64)

    # ------------------------------------------------------------------ scalar operands
    def sread(self, code: int, literal: int | None, width: int = 32) -> np.ndarray:
        """A scalar operand (SGPR, special register, inline or literal constant): (W,) uint64."""
        if code < NULL or code in (M0, EXEC, EXEC + 1):
            lo = self.s[code]
            return lo if width == 32 else lo | (self.s[code + 1] << U64(32))
        if code == SCC_SRC:
            return self.scc
        return np.full(self.n, self.constant(code, literal, width), U64)

    @staticmethod
    def constant(code: int, literal: int | None, width: int) -> int:
        if code == NULL or code == 128:
            return 0
        if 129 <= code <= 192:
            return code - 128
        if 193 <= code <= 208:
            return (128 + 64 - code) & (0xFFFF if width == 16 else MASK32 if width == 32 else MASK64)
        if code in INLINE[32]:
            return INLINE[width][code]
        if code == LITERAL:
            if width == 64 and literal >> 31:
                raise EmulationError(f"RDNA3 emulator: 64-bit operand with literal {literal:#x} (sign unclear)")
            return literal & (0xFFFF if width == 16 else MASK32)
        raise EmulationError(f"RDNA3 emulator: operand {code} is not implemented")

    def swrite(self, code: int, value: np.ndarray, width: int = 32) -> None:
        if code == NULL:
            return
        if code > EXEC + 1 or (code > VCC + 1 and code not in (M0, EXEC, EXEC + 1)):
            raise EmulationError(f"RDNA3 emulator: write to scalar operand {code}")
        value = np.asarray(value, U64)
        self.s[code] = value & U64(MASK32)
        if width == 64:
            self.s[code + 1] = value >> U64(32)

    # ------------------------------------------------------------------ vector operands
    def vread(self, code: int, literal: int | None, width: int = 32) -> np.ndarray:
        """A vector-instruction source (9-bit code) for all lanes: uint32 (uint64 for width 64)."""
        if code >= 256:
            r = code - 256
            if width == 64:
                return self.v[r].astype(U64) | (self.v[r + 1].astype(U64) << U64(32))
            return self.v[r]
        if code < NULL or code in (M0, EXEC, EXEC + 1, SCC_SRC):
            x = np.repeat(self.sread(code, literal, 64 if width == 64 else 32), LANES)
            return x if width == 64 else x.astype(U32)
        return np.full(self.n * LANES, self.constant(code, literal, width), U64 if width == 64 else U32)

    def vwrite(self, reg: int, value: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Write a uint32 result to VGPR `reg` in the lanes of `mask` (default: EXEC)."""
        if mask is None and self.exec_full():
            self.v[reg] = value
            return
        m = self.exec_mask() if mask is None else mask
        np.copyto(self.v[reg], value.astype(U32, copy=False), where=m, casting="unsafe")

    def vwrite64(self, reg: int, value: np.ndarray) -> None:
        value = value.astype(U64, copy=False)
        self.vwrite(reg, (value & U64(MASK32)).astype(U32))
        self.vwrite(reg + 1, (value >> U64(32)).astype(U32))
