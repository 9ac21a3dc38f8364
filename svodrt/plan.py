"""Verifying the execution plan in a manifest: tensors, buffers, kernels, variants, test vectors.
Structural checks first (types, ranges, counts, unique names and ids, buffers inside their areas,
kernel parameters known, no two live scratch buffers overlapping, code offsets inside their section),
then each variant's binding digest (format.variant_binding): values in range but not what the code
was compiled for."""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

from svodrt import format as fmt
from svodrt import schema as sc
from svodrt.features import FEATURES, to_bits
from svodrt.schema import Dim, KernelInfo, Launch, Section, TensorInfo, TestVector, Variant


@dataclass(frozen=True)
class Plan:
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    kernels: list[KernelInfo]
    variants: list[Variant]
    arena_size: int
    weights_size: int
    test_vectors: list[TestVector]
    # buffer id -> (kind, position): ("input"|"output", slot) or ("weight"|"scratch", byte offset)
    placement: dict[int, tuple[str, int]]
    # Format 1.4: what string ids below len(vocabulary) stand for; () when no input or output is a string.
    vocabulary: tuple[str, ...]
    dims: tuple[Dim, ...]  # format 1.5: the bounded dims in the entry's `dims` order; () in a static bundle
    zipmaps: tuple[tuple[str, tuple], ...]  # format 1.6: (output, keys) returned as a list of dicts
    edge_outputs: tuple[tuple[str, str, dict], ...]  # format 1.6: (output, input, StringNormalizer attributes)


@dataclass(frozen=True)
class _Buffer:
    id: int
    kind: str
    info: TensorInfo
    offset: int


def _io(m: dict, group: str, dims: dict[str, Dim]) -> tuple[list[TensorInfo], list[int]]:
    tensors, ids = [], []
    for i, t in enumerate(sc.items(m, group, "manifest")):
        where = f"{group}[{i}]"
        tensors.append(sc.tensor(t, where, dims))
        if sc.uint(t, "slot", where) != i:
            raise sc.fail(f"{where}.slot", f"is {t['slot']}, must be its position {i}")
        ids.append(sc.uint(t, "id", where))
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise sc.fail(group, f"names repeat: {names}")
    return tensors, ids


def _buffers(m: dict, in_ids: list[int], out_ids: list[int], arena: int, weights_size: int) -> dict[int, _Buffer]:
    known: dict[int, _Buffer] = {}
    for kind, ids in (("input", in_ids), ("output", out_ids)):
        for slot, i in enumerate(ids):
            if i in known:
                raise sc.fail("inputs/outputs", f"buffer id {i} is used twice")
            known[i] = _Buffer(i, kind, TensorInfo("", "uint8", ()), slot)
    for i, b in enumerate(sc.items(m, "buffers", "manifest")):
        where = f"buffers[{i}]"
        t = sc.tensor(b, where)
        kind = sc.field(b, "kind", str, where)
        limit = {"weight": weights_size, "scratch": arena}.get(kind)
        if limit is None:
            raise sc.fail(f"{where}.kind", f"{kind[:40]!r} must be 'weight' or 'scratch'")
        off = sc.uint(b, "offset", where)
        if off + t.nbytes > limit:
            raise sc.fail(where, f"[{off}, {off + t.nbytes}) lies outside the {kind} area ({limit} bytes)")
        bid = sc.uint(b, "id", where)
        if bid in known:
            raise sc.fail(f"{where}.id", f"buffer id {bid} is used twice")
        known[bid] = _Buffer(bid, kind, t, off)
    return known


def _kernels(m: dict, buffers: dict[int, _Buffer]) -> list[KernelInfo]:
    kernels = []
    for i, k in enumerate(sc.items(m, "kernels", "manifest")):
        where = f"kernels[{i}]"
        params = sc.uints(k, "params", where)
        unknown = [p for p in params if p not in buffers]
        if not params or unknown:
            raise sc.fail(f"{where}.params", f"{params[:8]} must be known buffer ids, the first written"
                       + (f" (unknown: {unknown[:8]})" if unknown else ""))
        if buffers[params[0]].kind == "weight":
            raise sc.fail(f"{where}.params", f"the written buffer {params[0]} is a read-only weight")
        prov = sc.items(k, "provenance", where)
        if not all(isinstance(p, str) for p in prov):
            raise sc.fail(f"{where}.provenance", "must be a list of ONNX node names")
        kernels.append(KernelInfo(sc.name(k, "name", where), tuple(params), tuple(prov)))
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise sc.fail("kernels", "kernel names repeat")
    return kernels


def check_arena_liveness(kernels: list[KernelInfo], buffers: dict[int, _Buffer]) -> None:
    """No two scratch buffers may share arena bytes while both are live (from the first kernel that
    uses one to the last). Sweep over kernels keeping the live byte ranges sorted and disjoint:
    O(n log n) comparisons whatever the manifest says."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, kernel in enumerate(kernels):
        for p in kernel.params:
            if buffers[p].kind == "scratch" and buffers[p].info.nbytes:
                first.setdefault(p, k)
                last[p] = k
    starting: dict[int, list[int]] = {}
    ending: dict[int, list[int]] = {}
    for b in first:
        starting.setdefault(first[b], []).append(b)
        ending.setdefault(last[b], []).append(b)
    starts: list[int] = []  # offsets of live buffers, sorted; owner[i] is the buffer at starts[i]
    owner: list[int] = []
    for k in range(len(kernels)):
        for b in starting.get(k, ()):
            lo, hi = buffers[b].offset, buffers[b].offset + buffers[b].info.nbytes
            i = bisect.bisect_left(starts, lo)
            for j in (i - 1, i):
                if 0 <= j < len(starts):
                    other = buffers[owner[j]]
                    if other.offset < hi and lo < other.offset + other.info.nbytes:
                        raise sc.fail("buffers", f"scratch buffers {b} and {owner[j]} overlap in the arena "
                                   f"while both are live (kernel {k}, {kernels[k].name})")
            starts.insert(i, lo)
            owner.insert(i, b)
        for b in ending.get(k, ()):
            i = bisect.bisect_left(starts, buffers[b].offset)
            del starts[i], owner[i]


def _variant(m: dict, i: int, sections: list[Section], n_kernels: int) -> Variant:
    v = m["variants"][i]
    where = f"variants[{i}]"
    si = sc.uint(v, "section", where, len(sections))
    if si >= len(sections) or sections[si].kind != "code":
        raise sc.fail(f"{where}.section", f"{si} is not a code section")
    sec = sections[si]
    arch, cpu = sc.name(v, "arch", where), sc.name(v, "cpu", where)
    feats = sc.items(v, "features", where, 1024)
    if not all(isinstance(f, str) and f for f in feats) or len(set(feats)) != len(feats):
        raise sc.fail(f"{where}.features", "must be a list of distinct feature names")
    bits = sc.uint(v, "feature_bits", where, (1 << 64) - 1)
    if arch in FEATURES and all(f in {x.name for x in FEATURES[arch]} for f in feats) \
            and bits != to_bits(arch, feats):
        raise sc.fail(f"{where}.feature_bits", f"{bits:#x} disagrees with features {feats}")
    entry = sc.uint(v, "entry", where)
    kernels = sc.uints(v, "kernels", where)
    fixups = sc.uints(v, "fixups", where)
    for what, offs, width in (("entry", [entry], 1), ("kernels", kernels, 1), ("fixups", fixups, 8)):
        for o in offs:
            if o + width > sec.length:
                raise sc.fail(f"{where}.{what}", f"offset {o} is outside code section {sec.name!r} "
                           f"({sec.length} bytes at offset {sec.offset})")
    if any(b - a < 8 for a, b in itertools.pairwise(fixups)):
        raise sc.fail(f"{where}.fixups", "must be sorted and at least 8 bytes apart")
    if len(kernels) != n_kernels:
        raise sc.fail(f"{where}.kernels", f"has {len(kernels)} offsets for {n_kernels} kernels")
    binding = sc.field(v, "binding", bytes, where)
    if binding != fmt.variant_binding(v, sec.sha256, m):
        raise sc.fail(f"{where}.binding", f"does not match {arch}:{cpu}'s code, entry points, features and "
                   "the plan they were compiled for: the manifest is damaged or was edited")
    kind = sc.field(v, "kind", str, where) if "kind" in v else "cpu"
    launches, cubin = _gpu(v, where, sections, n_kernels) if kind in fmt.GPU_KINDS else ((), None)
    return Variant(i, arch, cpu, tuple(feats), sec, entry, tuple(kernels), tuple(fixups), kind, launches, cubin)


def _gpu(v: dict, where: str, sections: list[Section], n_kernels: int) -> tuple[tuple[Launch, ...], Section | None]:
    """A GPU variant's launch list and cubin section, bound to the rest by `gpu_binding`."""
    launches = []
    for j, x in enumerate(sc.items(v, "launches", where)):
        w = f"{where}.launches[{j}]"
        kernel = sc.uint(x, "kernel", w)
        grid, block = sc.uints(x, "grid", w, fmt.MAX_GRID), sc.uints(x, "block", w, fmt.MAX_BLOCK)
        if kernel >= n_kernels or len(grid) != 3 or len(block) != 3 or 0 in grid or math.prod(block) > fmt.MAX_BLOCK \
                or 0 in block:
            raise sc.fail(w, f"kernel {kernel} of {n_kernels}, grid {grid}, block {block}: expected a kernel index, "
                       f"3 positive grid sizes and 3 positive block sizes of at most {fmt.MAX_BLOCK} threads in all")
        launches.append(Launch(kernel, sc.name(x, "symbol", w), tuple(grid), tuple(block)))  # type: ignore[arg-type]
    cubin = None
    if "cubin" in v:
        ci = sc.uint(v, "cubin", where, len(sections))
        if ci >= len(sections) or sections[ci].kind != "code":
            raise sc.fail(f"{where}.cubin", f"{ci} is not a code section")
        cubin = sections[ci]
    if sc.field(v, "gpu_binding", bytes, where) != fmt.gpu_binding(v, cubin.sha256 if cubin else None):
        raise sc.fail(f"{where}.gpu_binding", "does not match the variant's launch list and code: the manifest is "
                   "damaged or was edited")
    return tuple(launches), cubin


def _test_vectors(m: dict, inputs: list[TensorInfo], outputs: list[TensorInfo]) -> list[TestVector]:
    if "test_vectors" not in m:
        return []
    out = []
    for i, tv in enumerate(sc.items(m, "test_vectors", "manifest", fmt.MAX_TEST_VECTORS)):
        where = f"test_vectors[{i}]"
        blobs = {}
        for group, tensors in (("inputs", inputs), ("outputs", outputs)):
            data = sc.items(tv, group, where)
            if len(data) != len(tensors):
                raise sc.fail(f"{where}.{group}", f"has {len(data)} arrays for {len(tensors)} {group}")
            for t, b in zip(tensors, data, strict=True):
                if not isinstance(b, bytes) or len(b) != t.nbytes:
                    raise sc.fail(f"{where}.{group}", f"the array for {t.name!r} must be {t.nbytes} bytes")
            blobs[group] = tuple(data)
        tol = sc.items(tv, "tolerance", where)
        if len(tol) != len(outputs) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                               and 0 <= x < math.inf for x in tol):
            raise sc.fail(f"{where}.tolerance", "must hold one finite, non-negative number per output")
        out.append(TestVector(blobs["inputs"], blobs["outputs"], tuple(float(x) for x in tol)))
    return out


def parse_plan(m: dict, sections: list[Section], weights: Section) -> Plan:
    dims = sc.dim_table(m)
    inputs, in_ids = _io(m, "inputs", dims)
    outputs, out_ids = _io(m, "outputs", dims)
    if set(dims) - {d.name for t in inputs for _, d, _ in t.dims}:
        raise sc.fail("dims", "a dim sizes no input: no call could give its value")
    arena = sc.uint(m, "arena_size", "manifest", fmt.MAX_BYTES)
    weights_size = sc.uint(m, "weights_size", "manifest", fmt.MAX_BYTES)
    if weights.length < weights_size:
        raise sc.fail("weights_size", f"{weights_size} is more than the weights section holds ({weights.length})")
    buffers = _buffers(m, in_ids, out_ids, arena, weights_size)
    kernels = _kernels(m, buffers)
    check_arena_liveness(kernels, buffers)
    placement = {b.id: (b.kind, b.offset) for b in buffers.values()}
    # Read before the variants: their bindings cover it.
    vocab = sc.vocabulary(m) if any(t.dtype == fmt.STRING for t in inputs + outputs) else ()
    variants = [_variant(m, i, sections, len(kernels)) for i in range(len(sc.items(m, "variants", "manifest")))]
    if not variants:
        raise sc.fail("variants", "the bundle has no code variant")
    return Plan(inputs, outputs, kernels, variants, arena, weights_size, _test_vectors(m, inputs, outputs), placement,
                vocab, tuple(dims.values()), sc.zipmaps(m, outputs), sc.edge_outputs(m, inputs, outputs))

