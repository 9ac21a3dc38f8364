"""Code mappings through libc (ctypes). Invariant (W^X): no mapping is ever writable and executable at once: code
is copied into anonymous read+write memory, checked, patched, then made read+execute and never written again (no icache
flush needed but riscv64's: docs/architecture.md "Cross targets"). Fixup words are native 64-bit (own byte order)."""

from __future__ import annotations

import ctypes
import mmap
import os

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
_IS_RISCV64 = os.uname().machine.lower() == "riscv64"

# sched_yield, called by the barrier in generated code when it has spun long enough.
YIELD_FN = ctypes.cast(_libc.sched_yield, ctypes.c_void_p).value


class Mapping:
    """An anonymous read+write mapping of `length` bytes rounded up to pages, unmapped on close()."""

    def __init__(self, length: int, what: str):
        self.size = max(PAGE, (length + PAGE - 1) // PAGE * PAGE)
        rw, private = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        self.address = _mmap(None, self.size, rw, private, -1, 0) or 0
        if self.address in (0, MAP_FAILED):
            self.address = 0
            raise RuntimeFailure(f"cannot map {what} ({self.size} bytes at file offset 0): "
                                 f"{os.strerror(ctypes.get_errno())}")

    def close(self) -> None:
        if self.address:
            _munmap(self.address, self.size)
            self.address = 0

    def __del__(self) -> None:
        self.close()


def map_code(data: bytes | memoryview, fixups: tuple[int, ...], sha256: bytes, what: str) -> Mapping:
    """Copy a code image into fresh anonymous memory, check its sha256 there, apply base fixups, make it
    read+execute: the bytes that run are the bytes checked, and no file change can reach them (no SIGBUS)."""
    import hashlib  # here, not at `import svodrt`
    length = len(data)
    m = Mapping(length, what)
    try:  # every failure unmaps before it raises
        ctypes.memmove(m.address, bytes(data), length)
        if hashlib.sha256(memoryview((ctypes.c_char * length).from_address(m.address))).digest() != sha256:
            raise BundleFormatError(f"{what} fails its sha256 checksum: the file is damaged; nothing of it was run")
        for off in fixups:  # verified earlier: inside the image, 8 bytes apart
            word = ctypes.c_uint64.from_address(m.address + off)
            if word.value > length:  # the message reads it before m.close(): `word` points into the mapping
                raise BundleFormatError(f"{what}: fixup at offset {off} holds {word.value}, not an offset inside "
                                        f"the {length}-byte image")
            word.value += m.address
        if _mprotect(m.address, m.size, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
            raise RuntimeFailure(f"cannot make {what} executable: {os.strerror(ctypes.get_errno())} (is the "
                                 "filesystem mounted noexec, or W^X enforced?)")
    except BaseException:
        m.close()
        raise
    if _IS_RISCV64:  # all harts (flags 0), before any thread runs the code
        _libc.syscall(ctypes.c_long(_RISCV_FLUSH_ICACHE), ctypes.c_void_p(m.address),
                      ctypes.c_void_p(m.address + m.size), ctypes.c_ulong(0))
    return m
