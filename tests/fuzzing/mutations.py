"""Mutations of a valid bundle, each a deterministic function of (seed, index).

Blind ones (bit flips, byte overwrites, truncation, extension, splices, header fields) test the
checks that stand at the door; structure-aware ones edit one value of the decoded manifest (or of
its raw msgpack bytes) and re-pack it with a valid digest, so they reach the deeper checks: schema,
ranges, cross-references, the memory plan, the variant binding. Structural attacks (issue 18) are
well-formed manifests that ask for much: object bombs, huge counts, huge sizes, many kernels; the
worker holds every load to a time and memory budget.
"""

from __future__ import annotations

import copy
import random
import struct
from collections.abc import Callable
from typing import Any

from svodrt.format import FLAG_MANIFEST_ZSTD, HEADER, HEADER_SIZE, unpack_header
from tests.bundle_tools import manifest_of, repack

INT_EDGES = [0, 1, 2, 7, 8, 63, 64, 65, 4095, 4096, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
             2**40, 2**40 + 1, 2**62, 2**63 - 1, -1, -2, -(2**31), -(2**63)]
STR_POOL = ["", "x", "weights", "code", "weight", "scratch", "input", "output", "float64", "bool", "x86_64",
            "aarch64", "avx512f", "sse3", "k0_c", "y", "little", "big", "\x00", "é" * 3, "w" * 5000]
OTHER_VALUES: list[Any] = [None, True, False, 0, -1, 1.5, float("nan"), "s", b"", b"\x00" * 32, [], {}, [0], {"a": 1}]
HEADER_FIELDS = [(8, "<H"), (10, "<H"), (12, "<I"), (16, "<I"), (20, "<I"), (24, "<Q"), (32, "<Q"), (40, "<Q"),
                 (48, "<Q"), (56, "<Q")]


class Target:
    """One valid bundle and what the mutators need to know about it."""

    def __init__(self, data: bytes):
        self.data = data
        self.manifest = manifest_of(data)
        self.header = unpack_header(data[:HEADER_SIZE])[1]
        self.paths = list(_paths(self.manifest, ()))


def _paths(node: Any, path: tuple) -> Any:
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*path, i))


def _get(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


def _set(root: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    _get(root, path[:-1])[path[-1]] = value
    return root


def _new_int(v: int, rng: random.Random) -> int:
    choice = rng.random()
    if choice < 0.4:
        return rng.choice(INT_EDGES)
    if choice < 0.8:
        return v + rng.choice([-65536, -4096, -64, -8, -1, 1, 8, 64, 4096, 65536])
    return rng.randrange(0, max(2, 2 * v + 2))


def _new_value(v: Any, rng: random.Random) -> Any:
    if rng.random() < 0.15:
        return copy.deepcopy(rng.choice(OTHER_VALUES))  # type confusion
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        n = _new_int(v, rng)
        return max(-(2**63), min(2**64 - 1, n))  # what msgpack can carry
    if isinstance(v, float):
        return rng.choice([0.0, -1.0, 1e300, float("inf"), float("nan"), v * 2])
    if isinstance(v, str):
        return rng.choice([*STR_POOL, v + "x", v[:-1], v.upper()])
    if isinstance(v, bytes):
        if not v or rng.random() < 0.3:
            return rng.choice([b"", v[:-1], v + b"\x00", v * 2])
        i = rng.randrange(len(v))
        return v[:i] + bytes([v[i] ^ (1 << rng.randrange(8))]) + v[i + 1:]
    if isinstance(v, list):
        v = list(v)
        op = rng.randrange(6)
        if v and op == 0:
            del v[rng.randrange(len(v))]
        elif v and op == 1:
            v.insert(rng.randrange(len(v) + 1), copy.deepcopy(rng.choice(v)))
        elif len(v) > 1 and op == 2:
            i, j = rng.sample(range(len(v)), 2)
            v[i], v[j] = v[j], v[i]
        elif op == 3:
            v.reverse()
        elif op == 4:
            v = []
        else:
            v.append(copy.deepcopy(rng.choice(OTHER_VALUES)))
        return v
    if isinstance(v, dict):
        v = dict(v)
        if v and rng.random() < 0.6:
            del v[rng.choice(list(v))]
        else:
            v[rng.choice(["extra", "name", "id", "offset"])] = copy.deepcopy(rng.choice(OTHER_VALUES))
        return v
    return copy.deepcopy(rng.choice(OTHER_VALUES))


def _region(t: Target, rng: random.Random) -> int:
    """An offset: the header, the manifest or anywhere, so flips are not all lost in section bytes."""
    r = rng.random()
    if r < 0.3:
        return rng.randrange(HEADER_SIZE)
    if r < 0.6:
        return rng.randrange(t.header.manifest_offset, len(t.data))
    return rng.randrange(len(t.data))


def bit_flips(t: Target, rng: random.Random) -> tuple[str, bytes]:
    out = bytearray(t.data)
    offsets = [_region(t, rng) for _ in range(rng.choice([1, 1, 2, 3, 8]))]
    for o in offsets:
        out[o] ^= 1 << rng.randrange(8)
    return f"bit flips at {offsets}", bytes(out)


def byte_writes(t: Target, rng: random.Random) -> tuple[str, bytes]:
    out = bytearray(t.data)
    o = _region(t, rng)
    n = min(rng.choice([1, 2, 4, 8]), len(out) - o)
    out[o:o + n] = bytes(rng.choice([0, 0xFF, rng.randrange(256)]) for _ in range(n))
    return f"{n} bytes written at {o}", bytes(out)


def truncate(t: Target, rng: random.Random) -> tuple[str, bytes]:
    n = rng.choice([rng.randrange(len(t.data)), rng.randrange(HEADER_SIZE + 1), len(t.data) - 1,
                    t.header.manifest_offset + rng.randrange(t.header.manifest_size)])
    return f"truncated to {n}", t.data[:n]


def extend(t: Target, rng: random.Random) -> tuple[str, bytes]:
    extra = bytes(rng.randrange(256) for _ in range(rng.choice([1, 8, 100])))
    return f"{len(extra)} bytes appended", t.data + extra


def splice(t: Target, rng: random.Random) -> tuple[str, bytes]:
    n = rng.choice([8, 64, 512])
    src, dst = rng.randrange(len(t.data) - n), _region(t, rng)
    out = bytearray(t.data)
    out[dst:dst + n] = t.data[src:src + n]
    return f"{n} bytes from {src} copied to {dst}", bytes(out[:len(t.data)])


def header_field(t: Target, rng: random.Random) -> tuple[str, bytes]:
    offset, fmt = rng.choice(HEADER_FIELDS)
    old = struct.unpack_from(fmt, t.data, offset)[0]
    bits = struct.calcsize(fmt) * 8
    new = _new_int(old, rng) % (1 << bits)
    return f"header offset {offset}: {old} -> {new}", t.data[:offset] + struct.pack(fmt, new) + t.data[
        offset + struct.calcsize(fmt):]


def manifest_value(t: Target, rng: random.Random) -> tuple[str, bytes]:
    path = rng.choice(t.paths)
    m = copy.deepcopy(t.manifest)
    old = _get(m, path)
    new = _new_value(old, rng)
    m = _set(m, path, new)
    shown = repr(new)[:60]
    return f"manifest {'.'.join(map(str, path)) or '<root>'} = {shown}", repack(t.data, m)


def manifest_raw(t: Target, rng: random.Random) -> tuple[str, bytes]:
    """Flip bytes of the raw msgpack (then a valid digest): malformed msgpack, odd types, lengths."""
    import msgpack

    raw = bytearray(msgpack.packb(t.manifest, use_bin_type=True))
    offsets = [rng.randrange(len(raw)) for _ in range(rng.choice([1, 2, 4]))]
    for o in offsets:
        raw[o] = rng.choice([raw[o] ^ (1 << rng.randrange(8)), 0xC1, 0xDD, 0xDF, 0xC6, 0xFF, 0x00])
    return f"raw manifest bytes at {offsets}", _repack_raw(t, bytes(raw))


def _repack_raw(t: Target, raw: bytes) -> bytes:
    import hashlib

    import zstandard

    h = t.header
    stored = zstandard.ZstdCompressor(level=3).compress(raw)
    body = t.data[:h.manifest_offset]
    fields = (h.major, h.minor, h.header_size, FLAG_MANIFEST_ZSTD, h.reserved, len(body) + len(stored), h.manifest_offset,
              len(stored), len(raw), hashlib.sha256(raw).digest()[:8])
    return HEADER.pack(t.data[:8], *fields) + body[HEADER_SIZE:] + stored


BOMB_ITEMS = {"empty lists": b"\x90", "fixints": b"\x00", "empty maps": b"\x80", "empty strings": b"\xa0"}
MARKER = "\x00svod-fuzz-bomb\x00"


def _with_raw(t: Target, field: str | None, raw_value: bytes) -> bytes:
    """The bundle with manifest[field] (or the whole manifest) replaced by raw msgpack bytes."""
    import msgpack

    if field is None:
        return _repack_raw(t, raw_value)
    m = copy.deepcopy(t.manifest)
    m[field] = MARKER
    packed = msgpack.packb(m, use_bin_type=True)
    marker = msgpack.packb(MARKER)
    return _repack_raw(t, packed.replace(marker, raw_value, 1))


def manifest_bomb(t: Target, rng: random.Random) -> tuple[str, bytes]:
    """Millions of tiny objects (or deep nesting) where a list or the manifest should be."""
    field = rng.choice([None, "kernels", "buffers", "sections", "variants"])
    if rng.random() < 0.2:
        depth = rng.choice([1000, 1 << 16])
        return f"{depth} nested lists at {field or '<root>'}", _with_raw(t, field, b"\x91" * depth + b"\xc0")
    n = rng.choice([1 << 16, 1 << 20, 1 << 24])
    what, item = rng.choice(list(BOMB_ITEMS.items()))
    return f"{n} {what} at {field or '<root>'}", _with_raw(t, field, b"\xdd" + n.to_bytes(4, "big") + item * n)


def huge_count(t: Target, rng: random.Random) -> tuple[str, bytes]:
    """A list of the plan repeated to a huge length (bindings recomputed where they still can be)."""
    m = copy.deepcopy(t.manifest)
    lists = [(k,) for k in ("kernels", "buffers", "inputs", "outputs", "sections", "variants", "test_vectors")
             if k in m] + [("variants", 0, "kernels"), ("variants", 0, "fixups"), ("kernels", 0, "params")]
    path = rng.choice(lists)
    old = _get(m, path)
    n = rng.choice([1 << 10, 1 << 14, 1 << 18])
    _set(m, path, [old[i % len(old)] if old else 0 for i in range(n)])  # shared items: msgpack packs each
    return f"{'.'.join(map(str, path))} repeated to {n} items", repack(t.data, m, rebind=rng.random() < 0.5)


def huge_size(t: Target, rng: random.Random) -> tuple[str, bytes]:
    """An arena, weights area or tensor larger than any host (or just larger than this one), kept
    consistent: the bindings are recomputed, so only the size checks stand in the way."""
    m = copy.deepcopy(t.manifest)
    size = rng.choice([1 << 34, 1 << 38, 1 << 40, (1 << 40) + 1, 1 << 63])
    what = rng.choice(["arena_size", "weights_size", "output dim", "buffer dim"])
    if what in ("arena_size", "weights_size"):
        m[what] = size
    else:
        t_ = m["outputs"][0] if what == "output dim" else rng.choice(m["buffers"])
        t_["shape"] = [size, *t_["shape"][1:]] if t_["shape"] else [size]
    return f"{what} = {size}", repack(t.data, m, rebind=True)


def kernel_count(t: Target, rng: random.Random) -> tuple[str, bytes]:
    """Thousands of kernels, each variant given as many entry points: a consistent, huge plan."""
    m = copy.deepcopy(t.manifest)
    n = rng.choice([1 << 10, 1 << 12, 1 << 15, 1 << 18])
    ks = m["kernels"]
    m["kernels"] = [{**ks[i % len(ks)], "name": f"k{i}"} for i in range(n)]
    for v in m["variants"]:
        v["kernels"] = [v["kernels"][i % len(ks)] for i in range(n)]
    return f"{n} kernels", repack(t.data, m, rebind=True)


MUTATORS: list[tuple[Callable[[Target, random.Random], tuple[str, bytes]], int]] = [
    (bit_flips, 20), (byte_writes, 8), (truncate, 6), (extend, 2), (splice, 4), (header_field, 10),
    (manifest_value, 40), (manifest_raw, 10), (manifest_bomb, 1), (huge_count, 1), (huge_size, 2),
    (kernel_count, 1),
]


def mutate(t: Target, seed: int, index: int) -> tuple[str, str, bytes]:
    """(mutator name, description, mutated bytes) for attempt `index` of run `seed`."""
    rng = random.Random(f"{seed}:{index}")
    fn = rng.choices([f for f, _ in MUTATORS], weights=[w for _, w in MUTATORS])[0]
    what, data = fn(t, rng)
    return fn.__name__, what, data
