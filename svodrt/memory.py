"""Mappings through libc (ctypes). Invariant (W^X): no mapping is ever writable and executable at once: code
is copied into anonymous read+write memory, checked, patched, then made read+execute and never written again (no icache
flush needed but riscv64's: docs/architecture.md "Cross targets"). Fixup words are native 64-bit (own byte order).
Weights are mapped read-only from the file under a read lease (FileWeights: "Stable bytes" there)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import signal
import threading
import weakref
from collections.abc import Callable

from svodrt.errors import BundleFormatError, RuntimeFailure

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_mprotect = _libc.mprotect
_mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_munmap = _libc.munmap
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_mremap = _libc.mremap
_mremap.restype = ctypes.c_void_p
_mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
MREMAP_MAYMOVE_FIXED = 3  # MREMAP_MAYMOVE | MREMAP_FIXED
MAP_FAILED = ctypes.c_void_p(-1).value
# statfs f_type of the file systems where every writer goes through this kernel, so breaks the lease (linux/magic.h:
# ext4, xfs, btrfs, f2fs, tmpfs, ramfs, overlay). Not NFS, FUSE, virtiofs, 9p, CIFS: a writer elsewhere breaks none.
LEASE_FILE_SYSTEMS = frozenset((0xEF53, 0x58465342, 0x9123683E, 0xF2F52010, 0x01021994, 0x858458F6, 0x794C7630))
PAGE = mmap.PAGESIZE

_RISCV_FLUSH_ICACHE = 259  # __NR_riscv_flush_icache (asm-generic numbering, riscv64 only)
_IS_RISCV64 = os.uname().machine.lower() == "riscv64"

# sched_yield, called by the barrier in generated code when it has spun long enough.
YIELD_FN = ctypes.cast(_libc.sched_yield, ctypes.c_void_p).value


class Mapping:
    """An anonymous read+write mapping of `length` bytes rounded up to pages, populated, unmapped on close()."""

    def __init__(self, length: int, what: str):
        self.size = max(PAGE, (length + PAGE - 1) // PAGE * PAGE)
        rw, private = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE
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


def map_code(data: bytes | memoryview | Callable[[memoryview], object], fixups: tuple[int, ...], sha256: bytes,
             what: str, length: int | None = None) -> Mapping:
    """Copy a code image (data(view) reads `length` bytes) into fresh anonymous memory, check its sha256 there, apply
    base fixups, make it read+execute: the bytes that run are the bytes checked, and no file change reaches them."""
    import hashlib  # here, not at `import svodrt`
    length = len(data) if length is None else length  # type: ignore[arg-type]
    m = Mapping(length, what)
    try:  # every failure unmaps before it raises
        view = memoryview((ctypes.c_char * length).from_address(m.address)).cast("B")
        data(view) if callable(data) else view.__setitem__(slice(None), data)  # read into it: one copy, no buffer
        if hashlib.sha256(view).digest() != sha256:
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



class FileWeights(Mapping):
    """A file's bytes [offset, offset + length) (offset page-aligned) mapped read-only while this process holds a read
    lease on the file (fcntl F_SETLEASE): the kernel holds back a process that opens the file to write or truncate it
    (`cp` over it) and signals this one (SIGIO), whose handler copies the bytes into private memory and moves the copy
    over the mapping (mremap: one step for threads reading it) before it lets go, so what was mapped never changes and
    a truncate is no SIGBUS. The handler runs on the main thread between bytecodes; the kernel waits for it up to
    /proc/sys/fs/lease-break-time (45 s). OSError or ValueError (off the main thread, before the handler is in place)
    where the lease cannot be had: the caller copies the bytes instead. lost: why the bytes are gone (runs refuse)."""

    def __init__(self, fd: int, offset: int, length: int, unchanged: Callable[[int], bool]):
        self.address, self.size, self.lock, self.fd = 0, length, threading.Lock(), None
        self.unchanged, self.pending, self.lost = unchanged, False, ""
        if not _PREVIOUS:
            _PREVIOUS.append(signal.signal(signal.SIGIO, _on_lease_break))
        try:  # OSError: not the file's owner (no CAP_LEASE), open for writing elsewhere, a file system without leases
            self.fd, fs = os.dup(fd), ctypes.create_string_buffer(256)  # its own descriptor: the lease's
            if _libc.fstatfs(self.fd, fs) != 0 or ctypes.c_uint32.from_buffer(fs).value not in LEASE_FILE_SYSTEMS:
                raise OSError("not on a file system whose writers all break leases")  # f_type: 4 bytes (LE, s390x)
            fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
            address = _mmap(None, length, mmap.PROT_READ, mmap.MAP_PRIVATE, self.fd, offset) or 0
            self.address = 0 if address == MAP_FAILED else address
            if not self.address or not unchanged(self.fd):  # unchanged: not written between its open and the lease
                raise OSError(f"bytes [{offset}, {offset + length}) not mapped, or the file changed since its open")
        except BaseException:
            self.close()
            raise
        global _LEASED
        with _REGISTERING:  # replaced, never changed in place: the handler iterates whichever tuple it finds
            _LEASED = (*(r for r in _LEASED if getattr(r(), "fd", None) is not None), weakref.ref(self))
        self.settle(blocking=True)  # a break that began before the registration found nothing to detach

    def settle(self, blocking: bool) -> None:
        """Detach if the lease is being broken. A break signalled while another caller holds the lock (pending set
        before the try) is followed by that caller once it lets go (pending cleared under the lock, then checked)."""
        self.pending = True
        while self.pending and self.lock.acquire(blocking):
            try:
                self.pending = False
                if self.fd is not None and fcntl.fcntl(self.fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK:
                    self.detach()
            finally:
                self.lock.release()

    def detach(self) -> None:
        """Put a private copy where the file's bytes are mapped, then let the file go (self.lock held). Not a file
        already changed: the kernel's wait ran out before the handler ran (a main thread held in native code)."""
        if not self.unchanged(self.fd):  # fstat: copying a truncated file's pages would be a SIGBUS
            self.lost = "its file was rewritten while loaded and the lease's 45 s ran out before its bytes were copied"
        else:
            copy = Mapping(self.size, "the weights' private copy")
            ctypes.memmove(copy.address, self.address, self.size)
            _mprotect(copy.address, copy.size, mmap.PROT_READ)
            if _mremap(copy.address, copy.size, copy.size, MREMAP_MAYMOVE_FIXED, self.address) != self.address:
                raise RuntimeFailure(f"cannot move the weights' copy over their file mapping: "
                                     f"{os.strerror(ctypes.get_errno())}")
            copy.address, self.size = 0, copy.size  # moved: the copy is this mapping now
        self._let_go()

    def _let_go(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):  # explicitly: a forked child's mapping keeps the open file alive
                fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        with self.lock:
            self._let_go()
            super().close()


_LEASED: tuple[weakref.ref[FileWeights], ...] = ()  # weak: a model dropped unclosed unmaps and lets go
_REGISTERING = threading.Lock()
_PREVIOUS: list[object] = []  # [the SIGIO handler ours replaced] once ours is in place


def _on_lease_break(signum: int, frame: object) -> None:
    for ref in _LEASED:
        if (w := ref()) is not None:
            with contextlib.suppress(OSError, RuntimeFailure):  # never raise into the code the signal interrupted
                w.settle(blocking=False)
    if callable(_PREVIOUS[0]):
        _PREVIOUS[0](signum, frame)


def _lease_in_child() -> None:
    """A forked child shares its parent's open file, whose lease signals the parent: the child takes its own on a new
    open of the same file (/proc/self/fd names the file itself, even renamed or unlinked), or copies the bytes."""
    global _REGISTERING
    _REGISTERING = threading.Lock()  # a parent's thread may have held it
    for w in filter(None, (r() for r in _LEASED)):
        if w.fd is None:
            continue
        inherited, w.fd, w.lock, leased = w.fd, None, threading.Lock(), False  # a parent's thread may hold the lock
        with contextlib.suppress(OSError):
            w.fd = os.open(f"/proc/self/fd/{inherited}", os.O_RDONLY | os.O_CLOEXEC)
            leased = fcntl.fcntl(w.fd, fcntl.F_SETLEASE, fcntl.F_RDLCK) == 0
        os.close(inherited)  # not unlocked: the lease is the parent's
        if not leased:
            w.detach()


os.register_at_fork(after_in_child=_lease_in_child)
