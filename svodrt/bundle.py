"""Reading and verifying a bundle before anything of it is mapped or run (docs/bundle-format.md "Verification",
steps 1-4; the plan: svodrt/schema.py), each failure a BundleFormatError naming field or section and offset. Bytes are
read by offset into private memory, but for large weights mapped under a read lease (docs/architecture.md "Runtime":
stable bytes, bounded parsing); then Program: the step every executor starts with."""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np

from svodrt import format as fmt
from svodrt import schema as sc
from svodrt.abi import BUFFER_ALIGN
from svodrt.errors import BundleFormatError, BundleVersionError, RuntimeFailure
from svodrt.features import BYTE_ORDER
from svodrt.schema import Bundle, KernelInfo, Section, TensorInfo, Variant

__all__ = ["Bundle", "KernelInfo", "Program", "Section", "Source", "TensorInfo", "Variant",
           "check_section", "parse_bundle"]

MANIFEST_EXPANSION, MANIFEST_FLOOR = 64, 4 << 20  # raw manifest <= 64 x stored + 4 MiB
OBJECTS_PER_BYTE, OBJECTS_FLOOR = 1, 1 << 16  # real bundles: < 0.1 msgpack objects per file byte
MAX_MAP = fmt.MAX_ITEMS  # keys in any manifest map (node_ops has one per ONNX node); the object budget bounds the sum
# Weights this large are mapped under a lease (64 KiB-aligned from MAP_ALIGN on); smaller ones are read: a copy
# is cheaper below (Zen 4: 100 KB read 8 us, mapped 16; 512 KB 23 against 15).
MAP_MIN = 256 << 10
RECORD_AGE_NS = 2_000_000_000  # a Record is written only for a file unchanged this long when opened (FAT: 2 s)
PLAN_KEYS = frozenset(("buffers", "kernels", "node_ops", "options"))  # what a load reads nothing of when deferred
TrustSpec = str | os.PathLike | bytes | Iterable[str | os.PathLike | bytes]  # keys: svodrt_trust.trusted_keys
RECORDS = {"weights": ("", "v1"), "plan": (".plan", "v1")}  # name suffix, version: new when what it checks changes


class Source:
    """A bundle's bytes, read by offset: from a regular file (pread) or a bytes object."""

    def __init__(self, data: bytes | memoryview | None = None, fd: int | None = None, name: str = "the bundle"):
        self.fd, self.name = fd, name
        self._data = memoryview(data) if data is not None else None
        self.opened_ns = time.time_ns()  # before the stat: a write after it gets a later timestamp
        self.stat = os.fstat(fd) if fd is not None else None  # a file's, when opened: a Record names it
        self.size = len(self._data) if self._data is not None else self.stat.st_size  # type: ignore[union-attr]

    @classmethod
    def open(cls, path: str | os.PathLike) -> Source:
        """O_NONBLOCK: a FIFO or device is refused here instead of blocking the open."""
        src = cls(fd=os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), name=repr(os.fspath(path)))
        if not stat.S_ISREG(src.stat.st_mode):  # type: ignore[union-attr]
            src.close()
            raise BundleFormatError(f"{os.fspath(path)!r} is not a regular file (a FIFO, device or directory): "
                                    "give the path of a .svod file")
        return src

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def read(self, offset: int, length: int) -> bytes | memoryview:
        if self._data is not None:
            return self._data[offset: offset + length]
        out = bytearray(length)
        self.readinto(offset, memoryview(out))
        return bytes(out)

    def readinto(self, offset: int, buf: memoryview) -> None:
        if self._data is not None:
            buf[:] = self._data[offset: offset + len(buf)]
            return
        done = 0
        while done < len(buf):
            n = os.preadv(self.fd, [buf[done:]], offset + done)  # type: ignore[arg-type]
            if n <= 0:
                raise BundleFormatError(f"{self.name} ended at byte {offset + done} while reading [{offset}, "
                                        f"{offset + len(buf)}): it was truncated or rewritten while in use")
            done += n


def as_source(data: bytes | memoryview | Source) -> Source:
    return data if isinstance(data, Source) else Source(data)


_fail = BundleFormatError


def read_header(data: bytes | memoryview | Source) -> fmt.Header:
    size = (src := as_source(data)).size
    if size < fmt.HEADER_SIZE:
        raise _fail(f"file is {size} bytes, shorter than the {fmt.HEADER_SIZE}-byte header: not a .svod bundle "
                    "or truncated")
    magic, h = fmt.unpack_header(bytes(src.read(0, fmt.HEADER_SIZE)))
    if magic != fmt.MAGIC:
        raise _fail(f"bad magic {magic!r} at offset 0: not a .svod bundle")
    if h.major > fmt.FORMAT_MAJOR:
        raise BundleVersionError(f"bundle format {h.major}.{h.minor} is newer than this runtime's {fmt.FORMAT_MAJOR}."
                                 f"{fmt.FORMAT_MINOR} (it reads {fmt.FORMAT_MAJOR}.x; header offset 8): upgrade svodrt")
    if h.major < 1:
        raise _fail(f"bundle format major version {h.major} at offset 8 is invalid")
    if not fmt.HEADER_SIZE <= h.header_size <= fmt.MAX_HEADER_SIZE:
        raise _fail(f"header size {h.header_size} at offset 12 is outside [{fmt.HEADER_SIZE}, {fmt.MAX_HEADER_SIZE}]")
    if h.flags & ~fmt.FLAG_MANIFEST_ZSTD or h.reserved:
        raise _fail(f"header flags {h.flags:#x} / reserved {h.reserved:#x} at offset 16 hold unknown bits")
    if h.file_size != size:
        raise _fail(f"header (offset 24) says the file is {h.file_size} bytes, it is {size} bytes "
                    "(truncated or extended)")
    end = h.manifest_offset + h.manifest_size
    if h.manifest_offset < h.header_size or end != size or h.manifest_size == 0:
        raise _fail(f"manifest [{h.manifest_offset}, {end}) (header offsets 32, 40) must lie after the header "
                    f"and end the file ({size} bytes)")
    limit = min(fmt.MAX_MANIFEST_RAW, MANIFEST_EXPANSION * h.manifest_size + MANIFEST_FLOOR)
    if h.manifest_raw_size > limit:
        raise _fail(f"manifest size {h.manifest_raw_size} (header offset 48) exceeds the limit {limit} for "
                    f"{h.manifest_size} stored bytes")
    return h


def unpack_bounded(raw: bytes | memoryview, file_size: int, packed: frozenset[str] = frozenset()) -> object:
    """msgpack with every length capped and at most OBJECTS_PER_BYTE objects per file byte: the hooks
    count each list and map as it is built (with its items), so a bomb stops before it is built. packed: keys of
    the top map whose values are skipped, not built, and kept as msgpack (sc.Packed: Bundle.manifest unpacks them)."""
    import msgpack  # here, not at `import svodrt`: imports are most of a cold start
    budget = [OBJECTS_PER_BYTE * file_size + OBJECTS_FLOOR]

    def count(x):
        budget[0] -= len(x) + 1
        if budget[0] < 0:
            raise ValueError(f"more msgpack objects than a {file_size}-byte bundle may hold")
        return x

    # Each object takes a byte at least and is counted at most twice (an item of its container, a container
    # itself): within the budget the hooks cannot fire, and (a Python call per container) cost 30 % of the unpack.
    hooks = {} if 2 * len(raw) <= budget[0] else {"list_hook": count, "object_hook": count}
    u = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=len(raw), max_str_len=4 * fmt.MAX_STRING,
                         max_bin_len=len(raw), max_array_len=fmt.MAX_ITEMS, max_map_len=MAX_MAP, max_ext_len=0, **hooks)
    u.feed(raw)
    if not packed:
        out = u.unpack()
    else:  # the map's values one by one: those packed skipped (no objects made: a deferred load's plan)
        out = {}
        for _ in range(u.read_map_header()):
            if (key := u.unpack()) in packed:
                start = u.tell()
                u.skip()
                out[key] = sc.Packed(bytes(raw[start: u.tell()]), file_size)
            else:
                out[key] = u.unpack()
    if u.tell() != len(raw):
        raise ValueError(f"{len(raw) - u.tell()} bytes follow the manifest's map")
    return out


def read_manifest(data: bytes | memoryview | Source, h: fmt.Header, packed: frozenset[str] = frozenset()) -> dict:
    import hashlib
    src = as_source(data)
    raw = stored = src.read(h.manifest_offset, h.manifest_size)
    if h.flags & fmt.FLAG_MANIFEST_ZSTD:
        import zstandard
        try:  # max_output_size bounds the memory a lying frame header can make us allocate
            raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=h.manifest_raw_size)
        except zstandard.ZstdError as e:
            raise _fail(f"manifest at offset {h.manifest_offset} does not decompress: {e}") from None
    if len(raw) != h.manifest_raw_size:
        raise _fail(f"manifest at offset {h.manifest_offset} is {len(raw)} bytes, header says {h.manifest_raw_size}")
    if hashlib.sha256(raw).digest()[:8] != h.manifest_digest:
        raise _fail(f"manifest at offset {h.manifest_offset} fails its checksum (header offset 56): the file is "
                    "damaged")
    try:
        m = unpack_bounded(raw, src.size, packed)
    except Exception as e:  # msgpack raises several types for malformed input
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__  # StackError says nothing more
        raise _fail(f"manifest at offset {h.manifest_offset} is not valid msgpack: {why}") from None
    if not isinstance(m, dict):
        raise _fail(f"manifest at offset {h.manifest_offset} is not a map")
    return m


def _zero_gap(src: Source, start: int, end: int, where: str) -> None:
    """Padding must be zero, so that every byte of a bundle is covered by some check."""
    if start < end and bytes(src.read(start, end - start)) != bytes(end - start):
        raise _fail(f"padding [{start}, {end}) {where} is not zero: the file is damaged")


def _sections(m: dict, h: fmt.Header, src: Source, deferred: bool) -> list[Section]:
    """deferred: a record stood for the checks of this file version, its zero padding's too (nothing reads it)."""
    gap = (lambda *_: None) if deferred else _zero_gap
    out: list[Section] = []
    prev_end = h.header_size
    for i, s in enumerate(sc.items(m, "sections", "manifest", 1024)):
        where = f"sections[{i}]"
        sec = Section(i, sc.name(s, "name", where), sc.name(s, "kind", where), sc.uint(s, "offset", where),
                      sc.uint(s, "length", where), sc.field(s, "sha256", bytes, where))
        align = fmt.section_align(sec.length)
        if sec.offset % align:
            raise _fail(f"section {sec.name!r} at offset {sec.offset} ({sec.length} bytes) is not {align}-aligned")
        if sec.offset < prev_end or sec.offset + sec.length > h.manifest_offset:
            raise _fail(f"section {sec.name!r} [{sec.offset}, {sec.offset + sec.length}) overlaps the header, "
                        "the previous section or the manifest")
        if len(sec.sha256) != 32:
            raise _fail(f"section {sec.name!r} checksum has {len(sec.sha256)} bytes, expected 32")
        if any(o.name == sec.name for o in out):
            raise _fail(f"section name {sec.name!r} ({where}) repeats")
        gap(src, prev_end, sec.offset, f"before section {sec.name!r}")
        prev_end = sec.offset + sec.length
        out.append(sec)
    gap(src, prev_end, h.manifest_offset, "before the manifest")
    return out


def check_section(data: bytes | memoryview | Source, sec: Section, content: bytes | memoryview | None = None) -> None:
    """sha256 of one section (`content`: its bytes, already read); costs about 0.6 ms per MB."""
    import hashlib
    if content is None:
        content = as_source(data).read(sec.offset, sec.length)
    if hashlib.sha256(content).digest() != sec.sha256:
        raise _fail(f"section {sec.name!r} at offset {sec.offset} ({sec.length} bytes) fails its sha256 "
                    "checksum: the file is damaged")


def identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns  # any write to the file moves ctime


class Record(NamedTuple):
    """That a check ("plan": the manifest's, "weights": their sha256) passed on a file: a file in the user's cache named
    by the file's device, inode and the check, holding the rest of its identity and the digests checked
    (docs/architecture.md "What is checksummed when")."""

    path: str
    content: bytes
    quiet_ns: int  # how long before it was opened the file had last changed

    @classmethod
    def of(cls, src: Source, h: fmt.Header, check: str, digest: bytes = b"") -> Record:
        if (st := src.stat) is None:  # bytes: no file to name, a record that never exists and is never written
            return cls("", b"", 0)
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        key, (suffix, version) = " ".join(map(str, identity(st)[2:])) + f" {digest.hex()} {h.manifest_digest.hex()}", \
            RECORDS[check]
        return cls(os.path.join(cache, "svodrt", "verified", f"{st.st_dev:x}-{st.st_ino:x}{suffix}"),
                   f"svodrt {check} {version} {key}\n".encode(), src.opened_ns - max(st.st_mtime_ns, st.st_ctime_ns))

    def exists(self) -> bool:
        with contextlib.suppress(OSError):  # os.open, not open(): no buffered file object (half the time)
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                return os.read(fd, 512) == self.content
            finally:
                os.close(fd)
        return False

    def write(self) -> None:
        """Only for a file unchanged for RECORD_AGE_NS before it was opened: a change after the open (while it was
        read or hashed) then gets a later timestamp than the recorded one, which a change within the same timestamp
        granule might not. A cache: where it cannot be written, the next load checks the sha256 again."""
        with contextlib.suppress(OSError):
            if self.path and self.quiet_ns >= RECORD_AGE_NS:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                with open(tmp := f"{self.path}.{os.getpid()}", "wb") as f:
                    f.write(self.content)
                os.replace(tmp, self.path)


def parse_bundle(data: bytes | memoryview | Source, recorded: Callable[[fmt.Header], bool] | None = None) -> Bundle:
    """Every structural check; recorded(header): a record says this file's plan passed them (svodrt/schema.py
    parse_plan defers those). Section checksums are left to the caller (check_section)."""
    src = as_source(data)
    h = read_header(src)
    deferred = recorded is not None and recorded(h)
    m = read_manifest(src, h, PLAN_KEYS if deferred else frozenset())
    try:
        fmt = sc.field(m, "format", list, "manifest")
        if fmt != [h.major, h.minor]:
            raise _fail(f"manifest format {fmt!r} disagrees with the header version {h.major}.{h.minor}")
        # [cross] format 1.1: "big" for s390x; all variants share the bundle's byte order
        byte_order = sc.field(m, "byte_order", str, "manifest")
        if byte_order not in ("little", "big"):
            raise _fail(f"manifest byte_order {byte_order[:20]!r} must be 'little' or 'big'")
        sections = _sections(m, h, src, deferred)
        weights = [s for s in sections if s.kind == "weights"]
        if len(weights) != 1:
            raise _fail(f"manifest sections: expected one weights section, found {len(weights)}")
        bundle = sc.parse_plan(m, h, sections, weights[0], deferred)
        for i, v in enumerate(bundle.variants):
            if BYTE_ORDER.get(v.arch, byte_order) != byte_order:
                raise _fail(f"manifest variants[{i}] is for {v.arch}, whose data is {BYTE_ORDER[v.arch]}-endian, "
                            f"but the bundle's byte_order is {byte_order!r}")
    except BundleFormatError as e:
        raise BundleFormatError(f"{e} (manifest at offset {h.manifest_offset})") from None
    return bundle


def aligned_empty(nbytes: int, what: str) -> tuple[np.ndarray, int]:
    """A BUFFER_ALIGN-aligned buffer of nbytes (and its address); RuntimeFailure if the host cannot give it."""
    try:
        raw = np.empty(nbytes + BUFFER_ALIGN, dtype=np.uint8)
    except MemoryError:
        raise RuntimeFailure(f"cannot allocate the {what} ({nbytes} bytes): this host has not that much memory "
                             "free") from None
    return raw, raw.ctypes.data + (-raw.ctypes.data) % BUFFER_ALIGN


def host_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class Program:
    """A bundle opened, verified, its signer checked under a trust policy before any code is read; close() closes
    its source (the executor's job)."""

    def __init__(self, source: str | os.PathLike | bytes, verify_weights: bool | None = None,
                 trust: TrustSpec | None = None, variant: int | None = None):
        is_bytes = isinstance(source, (bytes, bytearray, memoryview))
        self.source = Source(bytes(source)) if is_bytes else Source.open(source)
        ordinary = verify_weights is None and trust is None  # else the weights' record is not consulted

        def recorded(h: fmt.Header) -> bool:  # a record of this file version's plan checks, unless asked to verify
            return trust is None and not verify_weights and Record.of(self.source, h, "plan").exists()
        try:
            self.bundle: Bundle = parse_bundle(self.source, recorded)
            self.signer = None  # unsigned, no policy: nothing to check
            if trust is not None or "signature" in self.bundle.head:
                from svodrt_trust import check_signature, trusted_keys
                self.signer = check_signature(self.bundle.manifest, None if trust is None else trusted_keys(trust))
            if variant is not None and not 0 <= variant < (n := len(self.bundle.variants)):
                raise ValueError(f"variant {variant} does not exist (the bundle has {n})")
            # Weights up to fmt.WEIGHTS_CHECK_LIMIT are checked at a file's first load (damage is an error, not a
            # wrong answer) and then trusted by its record; any by svodrt verify, when asked, or under a trust policy.
            small = self.bundle.weights.length <= fmt.WEIGHTS_CHECK_LIMIT
            self.record = Record.of(self.source, self.bundle.header, "weights", self.bundle.weights.sha256)
            trusted = ordinary and self.record.exists()
            self.check_weights = trust is not None or (small and not trusted if verify_weights is None
                                                       else bool(verify_weights))
            self.weights_verified = self.check_weights or trusted
            if not self.bundle.deferred:  # it passed: later loads of this file version defer the plan's checks
                Record.of(self.source, self.bundle.header, "plan").write()
        except BaseException:
            self.close()
            raise

    def weights(self) -> tuple[object, int]:
        """The weights section, checked if check_weights: mapped from the file under a read lease (svodrt/memory.py
        FileWeights) where it has one, is at least MAP_MIN (so page-aligned) and the lease can be had, else read into
        private, aligned memory. (what keeps them, their address)"""
        from svodrt.memory import FileWeights
        w, fd, keep = self.bundle.weights, self.source.fd, None
        if fd is not None and w.length >= MAP_MIN:
            with contextlib.suppress(OSError, ValueError):
                keep = FileWeights(fd, w.offset, w.length, self._unchanged)
        if isinstance(keep, FileWeights):
            addr, view = keep.address, memoryview((ctypes.c_char * w.length).from_address(keep.address))
        else:
            keep, addr = aligned_empty(w.length, "weights")
            view = memoryview(keep)[addr - keep.ctypes.data:][: w.length]
            self.source.readinto(w.offset, view)
        try:
            if self.check_weights:
                check_section(self.source, w, view)
                self.record.write()
            elif self.weights_verified and not self._unchanged(fd):
                # the record named the file as opened; what was read since may be another version's bytes
                raise _fail(f"{self.source.name} was rewritten while it was read: load it again")
        except BaseException:
            if isinstance(keep, FileWeights):  # now, not when the traceback goes
                keep.close()
            raise
        return keep, addr

    def _unchanged(self, fd: int | None) -> bool:
        return fd is None or identity(os.fstat(fd)) == identity(self.source.stat)  # type: ignore[arg-type]

    def close(self) -> None:
        self.source.close()
