"""Vector memory instructions: GLOBAL loads and stores (flat memory, tests/gpu/rdna3/wave.py Memory),
DS (LDS, the workgroup's shared array) and the cache invalidation (a no-op: memory here is coherent).
Only the lanes EXEC enables access memory; addresses of the others are never looked at."""

from __future__ import annotations

import numpy as np

from tests.gpu.rdna3.decode import Instr
from tests.gpu.rdna3.wave import LANES, NULL, MemoryFault, Waves

U32, U64 = np.uint32, np.uint64
_LOADS = {"global_load_b32": 1, "global_load_b64": 2, "global_load_b96": 3, "global_load_b128": 4}


def _addresses(w: Waves, ins: Instr, m: np.ndarray) -> np.ndarray:
    """Per active lane: a 64-bit VGPR address, or (saddr) an SGPR-pair base plus a 32-bit VGPR offset."""
    fl = ins.f
    if fl["saddr"] == NULL:
        a = w.v[fl["addr"]][m].astype(U64) | (w.v[fl["addr"] + 1][m].astype(U64) << U64(32))
    else:
        base = np.repeat(w.s[fl["saddr"]] | (w.s[fl["saddr"] + 1] << U64(32)), LANES)
        a = base[m] + w.v[fl["addr"]][m].astype(U64)
    return a + U64(fl["offset"]) if fl["offset"] >= 0 else a - U64(-fl["offset"])


def execute_global(w: Waves, ins: Instr) -> None:
    m = w.exec_mask()
    addr = _addresses(w, ins, m)
    fl, name = ins.f, ins.name
    if name in _LOADS:
        n = _LOADS[name]
        data = w.memory.gather(addr, 4 * n, ins.where()).view(U32).reshape(-1, n)
        for i in range(n):
            w.v[fl["vdst"] + i][m] = data[:, i]
    elif name == "global_load_u16":  # zero-extended into the whole VGPR
        w.v[fl["vdst"]][m] = w.memory.gather(addr, 2, ins.where()).view("<u2")[:, 0].astype(U32)
    elif name == "global_load_d16_u8":  # the byte, zero-extended, into the low half; the high half kept
        data = w.memory.gather(addr, 1, ins.where())[:, 0].astype(U32)
        w.v[fl["vdst"]][m] = (w.v[fl["vdst"]][m] & U32(0xFFFF0000)) | data
    elif name in ("global_load_d16_b16", "global_load_d16_hi_b16"):  # one half loaded, the other kept
        data = w.memory.gather(addr, 2, ins.where()).view("<u2")[:, 0].astype(U32)
        old = w.v[fl["vdst"]][m]
        w.v[fl["vdst"]][m] = (old & U32(0xFFFF)) | (data << U32(16)) if name.endswith("hi_b16") else \
            (old & U32(0xFFFF0000)) | data
    elif name == "global_store_b32":
        w.memory.scatter(addr, w.v[fl["data"]][m].view(np.uint8).reshape(-1, 4), ins.where())


def _lds_index(w: Waves, ins: Instr, addr: np.ndarray, base: np.ndarray, nbytes: int) -> np.ndarray:
    """Byte indices into the batch's LDS array of each active lane's access (`base`: its workgroup's)."""
    if addr.size and (int(addr.max()) + nbytes > w.lds_size):
        raise MemoryFault(f"RDNA3 emulator: LDS access at {int(addr.max()):#x} + {nbytes} by {ins.where()} is "
                          f"outside the workgroup's {w.lds_size} bytes")
    return (base + addr.astype(np.int64))[:, None] + np.arange(nbytes)


def execute_ds(w: Waves, ins: Instr) -> None:
    fl, name = ins.f, ins.name
    if fl["gds"]:
        raise MemoryFault(f"RDNA3 emulator: GDS access by {ins.where()}")
    m = w.exec_mask()
    addr, base = w.v[fl["addr"]][m], w.lds_base[m]
    if name == "ds_store_2addr_stride64_b32":
        for off, src in ((fl["offset0"], fl["data0"]), (fl["offset1"], fl["data1"])):
            w.lds[_lds_index(w, ins, addr + U32(off * 256), base, 4)] = w.v[src][m].view(np.uint8).reshape(-1, 4)
        return
    if name in ("ds_load_b32", "ds_load_b128"):  # one address, a 16-bit offset
        n = 1 if name == "ds_load_b32" else 4
        off = fl["offset0"] | (fl["offset1"] << 8)
        data = w.lds[_lds_index(w, ins, addr + U32(off), base, 4 * n)].view(U32).reshape(-1, n)
        for i in range(n):
            w.v[fl["vdst"] + i][m] = data[:, i]
        return
    size, stride = (4, 4) if name == "ds_load_2addr_b32" else (8, 512)
    for k, off in enumerate((fl["offset0"], fl["offset1"])):
        data = w.lds[_lds_index(w, ins, addr + U32(off * stride), base, size)].view(U32).reshape(-1, size // 4)
        for i in range(size // 4):
            w.v[fl["vdst"] + k * (size // 4) + i][m] = data[:, i]


def execute_mubuf(w: Waves, ins: Instr) -> None:  # buffer_gl0_inv: caches are not modelled
    return
