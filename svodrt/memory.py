"""Memory mappings through libc (ctypes): code read+execute (nothing is mapped from the bundle file).

Invariant (W^X): no mapping is ever writable and executable at once. Code is copied into anonymous
read+write memory, checked, patched, then made read+execute; it is never written again, so no
instruction-cache flush is needed (Linux makes a page coherent when it first maps it executable);
on riscv64 we still make the riscv_flush_icache call its ABI asks for (docs/architecture.md "Cross
targets"). Fixup words are native 64-bit integers: a bundle only runs on its own byte order."""

from __future__ import annotations

import ctypes
import mmap
import os
import platform

from svodrt.errors import BundleFormatError, RuntimeFailure

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_mprotect = _libc.mprotect
_mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_munmap = _libc.munmap
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE

_RISCV_FLUSH_ICACHE = 259  # __NR_riscv_flush_icache (asm-generic numbering, riscv64 only)
_IS_RISCV64 = platform.machine().lower() == "riscv64"

# sched_yield, called by the barrier in generated code when it has spun long enough.
YIELD_FN = ctypes.cast(_libc.sched_yield, ctypes.c_void_p).value


def _round(n: int) -> int:
    return max(PAGE, (n + PAGE - 1) // PAGE * PAGE)


class Mapping:
    """One mapping of `size` bytes at `address`, unmapped on close()."""

    def __init__(self, address: int, size: int):
        self.address = address
        self.size = size

    def close(self) -> None:
        if self.address:
            _munmap(self.address, self.size)
            self.address = 0

    def __del__(self) -> None:
        self.close()


def _map(length: int, prot: int, flags: int, fd: int, offset: int, what: str) -> Mapping:
    size = _round(length)
    addr = _mmap(None, size, prot, flags, fd, offset)
    if addr in (None, MAP_FAILED):
        err = ctypes.get_errno()
        raise RuntimeFailure(f"cannot map {what} ({size} bytes at file offset {offset}): {os.strerror(err)}")
    return Mapping(addr, size)


def _protect(m: Mapping, prot: int, what: str) -> None:
    if _mprotect(m.address, m.size, prot) != 0:
        err = ctypes.get_errno()
        m.close()
        raise RuntimeFailure(f"cannot make {what} {'executable' if prot & mmap.PROT_EXEC else 'read-only'}: "
                             f"{os.strerror(err)} (is the filesystem mounted noexec, or W^X enforced?)")


def map_code(data: bytes | memoryview, fixups: tuple[int, ...], sha256: bytes, what: str) -> Mapping:
    """Copy a code image into fresh anonymous memory, check its sha256 there, apply base fixups,
    then make it read+execute. Checking the copy means the bytes that run are the bytes that were
    verified: nothing can change them afterwards (another process rewriting the file), and a file
    truncated after loading cannot fault the code pages (SIGBUS)."""
    import hashlib  # here, not at `import svodrt`
    length = len(data)
    m = _map(length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0, what)
    ctypes.memmove(m.address, bytes(data), length)
    image = (ctypes.c_char * length).from_address(m.address)
    if hashlib.sha256(memoryview(image)).digest() != sha256:
        m.close()
        raise BundleFormatError(f"{what} fails its sha256 checksum: the file is damaged; nothing of it was run")
    for off in fixups:  # verified earlier: inside the image, 8 bytes apart
        word = ctypes.c_uint64.from_address(m.address + off)
        value = word.value  # read before any close(): `word` points into the mapping
        if value > length:
            m.close()
            raise BundleFormatError(f"{what}: fixup at offset {off} holds {value}, not an offset inside "
                                    f"the {length}-byte image")
        word.value = value + m.address
    _protect(m, mmap.PROT_READ | mmap.PROT_EXEC, what)
    if _IS_RISCV64:  # all harts (flags 0), before any thread runs the code
        _libc.syscall(ctypes.c_long(_RISCV_FLUSH_ICACHE), ctypes.c_void_p(m.address),
                      ctypes.c_void_p(m.address + m.size), ctypes.c_ulong(0))
    return m

