"""The manifest's schema (docs/bundle-format.md "Manifest", "Verification" 3 and 5): typed readers raising
BundleFormatError with the field's path (`variants[1].fixups[3]`; a bool is no integer), records, the plan's checks."""

import functools
import itertools
import math
import operator
from typing import Any, NamedTuple

from svodrt import format as fmt
from svodrt.errors import BundleFormatError
from svodrt.features import FEATURES, bit_of, to_bits
from svodrt.format import DTYPES, MAX_BYTES, MAX_ITEMS, MAX_NAME, MAX_RANK


def fail(where: str, msg: str) -> BundleFormatError:
    return BundleFormatError(f"manifest field {where}: {msg}")


def field(d: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if type(d) is dict and type(v := d.get(key)) is kind:  # the common case at a look-up (msgpack makes no subclasses)
        return v
    if not isinstance(d, dict):
        raise fail(where, f"is a {type(d).__name__}, expected a map")
    if key not in d:
        raise fail(f"{where}.{key}", "is missing")
    v, kinds = d[key], kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(v, bool) and bool not in kinds) or not isinstance(v, kind):
        raise fail(f"{where}.{key}", f"has type {type(v).__name__}, expected {'/'.join(k.__name__ for k in kinds)}")
    return v


def check_uint(v: Any, where: str, limit: int = MAX_BYTES) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise fail(where, f"has type {type(v).__name__}, expected an integer")
    if not 0 <= v <= limit:
        raise fail(where, f"= {v} is out of range [0, {limit}]")
    return v


def uint(d: Any, key: str, where: str, limit: int = MAX_BYTES) -> int:
    return check_uint(field(d, key, int, where), f"{where}.{key}", limit)


def name(d: Any, key: str, where: str) -> str:
    v = field(d, key, str, where)
    if len(v) > MAX_NAME or not v or "\x00" in v:
        raise fail(f"{where}.{key}", f"{v[:40]!r} must be 1..{MAX_NAME} characters without NUL")
    return v


def items(d: Any, key: str, where: str, limit: int = MAX_ITEMS) -> list:
    v = field(d, key, list, where)
    if len(v) > limit:
        raise fail(f"{where}.{key}", f"has {len(v)} items, over the limit {limit}")
    return v


def all_uints(v: list | tuple, limit: int = MAX_BYTES) -> bool:
    """Every item an int in [0, limit], checked by C-level calls: a generator per list costs more than they do."""
    return not set(map(type, v)) - {int} and min(v, default=0) >= 0 and max(v, default=0) <= limit


def uints(d: Any, key: str, where: str, limit: int = MAX_BYTES) -> list[int]:
    v = items(d, key, where)
    return v if all_uints(v, limit) else [check_uint(x, f"{where}.{key}[{i}]", limit) for i, x in enumerate(v)]


class Section(NamedTuple):
    index: int
    name: str
    kind: str
    offset: int
    length: int
    sha256: bytes


class Dim(NamedTuple):  # a bounded dim (format 1.5): its size is chosen per call in [lo, hi]; 1.7: or computed
    name: str
    lo: int
    hi: int
    computed: bool = False


class TensorInfo(NamedTuple):
    name: str
    dtype: str
    shape: tuple[int, ...]  # at the dims' upper bounds: the memory the code is laid out for
    dims: tuple[tuple[int, Dim, int], ...] = ()  # (axis, dim, factor): that axis is factor * the dim's value

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][1]

    def __str__(self) -> str:
        shown: list = list(self.shape)
        for axis, d, k in self.dims:
            shown[axis] = f"{d.name}={d.lo}..{d.hi}" if k == 1 else f"{k}*{d.name}={k * d.lo}..{k * d.hi}"
        return f"{self.name}: {self.dtype}[{', '.join(map(str, shown))}]"


def dim_table(m: Any) -> dict[str, Dim]:
    """The manifest's `dims` (format 1.5) in `dims` array order ({} if absent); `inputs` is descriptive."""
    if "dims" not in m:
        return {}
    out: dict[str, Dim] = {}
    for i, d in enumerate(items(m, "dims", "manifest")):
        computed = "computed" in d and field(d, "computed", bool, f"dims[{i}]")
        dim = Dim(name(d, "name", f"dims[{i}]"), uint(d, "lo", f"dims[{i}]"), uint(d, "hi", f"dims[{i}]"), computed)
        if not int(not computed) <= dim.lo <= dim.hi or dim.name in out:  # a computed dim may be 0 (a count)
            raise fail(f"dims[{i}]", f"{dim.name!r} {dim.lo}..{dim.hi}: a new name, 1 <= lo <= hi (computed: 0 <= lo)")
        out[dim.name] = dim
    return out


def _dim_axis(v: str, dims: dict[str, Dim] | None, where: str) -> tuple[Dim, int]:
    if v in (dims or {}):  # a computed dim's name may hold a "*"
        return dims[v], 1
    dim_name, _, k = v.rpartition("*")
    if dim_name not in (dims or {}) or not (k.isdigit() and 0 < int(k) <= MAX_BYTES):
        raise fail(where, f"{v[:40]!r} is neither a size nor a bounded dim of the manifest's dims")
    return dims[dim_name], int(k)


def tensor(d: Any, where: str, dims: dict[str, Dim] | None = None) -> TensorInfo:
    t_name = name(d, "name", where)
    dtype = field(d, "dtype", str, where)
    if dtype not in DTYPES:
        raise fail(f"{where}.dtype", f"{dtype[:40]!r} is not one of {', '.join(DTYPES)}")
    raw = list(items(d, "shape", where))
    sym: tuple[tuple[int, Dim, int], ...] = ()
    if str in map(type, raw):
        sym = tuple((i, *_dim_axis(v, dims, f"{where}.shape[{i}]")) for i, v in enumerate(raw) if type(v) is str)
        for i, dim, k in sym:
            raw[i] = dim.hi * k
    shape = tuple(raw)
    if not all_uints(shape):
        shape = tuple(check_uint(x, f"{where}.shape[{i}]") for i, x in enumerate(raw))  # raises, naming the dim
    if len(shape) > MAX_RANK:
        raise fail(f"{where}.shape", f"has rank {len(shape)}, over the limit {MAX_RANK}")
    # Each dim is at most MAX_BYTES, and the running product is checked, so no product is huge.
    if max(itertools.accumulate(shape, operator.mul, initial=DTYPES[dtype][1])) > MAX_BYTES:
        raise fail(where, f"shape {list(shape)} is over {MAX_BYTES} bytes")
    return TensorInfo(t_name, dtype, shape, sym)


class Variant(NamedTuple):
    index: int
    arch: str
    cpu: str
    features: tuple[str, ...]
    section: Section  # the code image; GPU variants: the code object (PTX for cuda)
    entry: int
    kernels: tuple[int, ...]
    fixups: tuple[int, ...]
    kind: str = "cpu"  # "cpu", or a GPU kind: "cuda", "hip" (its launches and cubin: svodrt_gpu/plan.py)
    team: tuple[int, ...] = ()  # format 1.10: svod_serve, svod_lead (svodrt/abi.py); () in older bundles

    def describe(self) -> str:
        return f"{self.arch}:{self.cpu}" if self.kind == "cpu" else f"{self.kind}:{self.cpu}"


class KernelInfo(NamedTuple):
    name: str
    params: tuple[int, ...]
    provenance: tuple[str, ...]


def _edge(m: dict, key: str, parser: str, *args) -> tuple:
    """Formats 1.4-1.8's strings at the edge (`vocabulary`, `zipmaps`, `edge_outputs`): svodrt_strings parses them."""
    import svodrt_strings
    return getattr(svodrt_strings, parser)(items(m, key, "manifest"), *args)


class Packed(NamedTuple):
    """A value of the manifest's map left as msgpack at load: the plan, where a record stood for its checks."""
    raw: bytes
    file_size: int  # the budget of objects it may unpack into is the file's (unpack_bounded)


class _Fields(NamedTuple):
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    variants: list[Variant]
    arena_size: int
    weights_size: int
    # Format 1.4: what string ids below len(vocabulary) stand for; () when no input or output is a string.
    vocabulary: tuple[str, ...]
    dims: tuple[Dim, ...]  # format 1.5: the bounded dims in the entry's `dims` order; () in a static bundle
    zipmaps: tuple[tuple[str, tuple], ...]  # format 1.6: (output, keys) returned as a list of dicts
    edge_outputs: tuple[tuple, ...]  # formats 1.6/1.8: the string program's steps (svodrt_strings)
    header: fmt.Header
    head: dict  # the manifest's map, the plan's values still Packed where `deferred`
    sections: list[Section]
    weights: Section
    deferred: bool  # the plan's buffers and kernels not checked yet: a record of an earlier load's checks stood for it


class Bundle(_Fields):
    """A verified bundle: the execution plan, read here, and where it came from (svodrt/bundle.py). Its buffers and
    kernels are read and checked at load, or where a record stood for that (`deferred`) when first used: a CPU
    variant's code needs neither, the GPU executor and the tools do."""

    @functools.cached_property
    def manifest(self) -> dict:
        """The manifest's map whole: its Packed values unpacked (svodrt/bundle.py unpack_bounded)."""
        from svodrt.bundle import unpack_bounded
        try:
            return {k: unpack_bounded(v.raw, v.file_size) if type(v) is Packed else v for k, v in self.head.items()}
        except Exception as e:  # msgpack raises several types for malformed input
            raise BundleFormatError(f"manifest at offset {self.header.manifest_offset}: {e!r}") from None

    @functools.cached_property
    def _plan(self) -> tuple[list[KernelInfo], dict[int, tuple[str, int]]]:
        try:
            return entry_per_kernel(checked_plan(self.manifest, self.arena_size, self.weights_size), self.variants)
        except BundleFormatError as e:  # as at load (svodrt/bundle.py parse_bundle)
            raise BundleFormatError(f"{e} (manifest at offset {self.header.manifest_offset})") from None

    kernels = property(lambda self: self._plan[0], doc="list[KernelInfo]: the plan's kernels, in order")
    placement = property(lambda self: self._plan[1], doc='id -> ("input"|"output", slot), ("weight"|"scratch", offset)')


class _Buffer(NamedTuple):
    id: int
    kind: str
    info: TensorInfo
    offset: int
    end: int  # offset + the tensor's bytes


def _io(m: dict, group: str, dims: dict[str, Dim]) -> tuple[list[TensorInfo], list[int]]:
    tensors, ids = [], []
    for i, t in enumerate(items(m, group, "manifest")):
        where = f"{group}[{i}]"
        tensors.append(tensor(t, where, dims))
        if uint(t, "slot", where) != i:
            raise fail(f"{where}.slot", f"is {t['slot']}, must be its position {i}")
        ids.append(uint(t, "id", where))
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise fail(group, f"names repeat: {names}")
    return tensors, ids


def _buffers(m: dict, in_ids: list[int], out_ids: list[int], arena: int, weights_size: int) -> dict[int, _Buffer]:
    known: dict[int, _Buffer] = {}
    for kind, ids in (("input", in_ids), ("output", out_ids)):
        for slot, i in enumerate(ids):
            if i in known:
                raise fail("inputs/outputs", f"buffer id {i} is used twice")
            known[i] = _Buffer(i, kind, TensorInfo("", "uint8", ()), slot, slot)
    for i, b in enumerate(items(m, "buffers", "manifest")):
        where = f"buffers[{i}]"
        t = tensor(b, where)
        kind = field(b, "kind", str, where)
        limit = {"weight": weights_size, "scratch": arena}.get(kind)
        if limit is None:
            raise fail(f"{where}.kind", f"{kind[:40]!r} must be 'weight' or 'scratch'")
        off = uint(b, "offset", where)
        if (end := off + t.nbytes) > limit:
            raise fail(where, f"[{off}, {end}) lies outside the {kind} area ({limit} bytes)")
        bid = uint(b, "id", where)
        if bid in known:
            raise fail(f"{where}.id", f"buffer id {bid} is used twice")
        known[bid] = _Buffer(bid, kind, t, off, end)
    return known


def _kernels(m: dict, buffers: dict[int, _Buffer]) -> list[KernelInfo]:
    kernels = []
    for i, k in enumerate(items(m, "kernels", "manifest")):
        where = f"kernels[{i}]"
        params = uints(k, "params", where)
        unknown = [p for p in params if p not in buffers]
        if (not params and k.get("kind") != "dims") or unknown:  # 1.7: the computed dims' kernel writes `dims` only
            raise fail(f"{where}.params", f"{params[:8]} must be known buffer ids, the first written"
                       + (f" (unknown: {unknown[:8]})" if unknown else ""))
        if params and buffers[params[0]].kind == "weight":
            raise fail(f"{where}.params", f"the written buffer {params[0]} is a read-only weight")
        prov = items(k, "provenance", where)
        if set(map(type, prov)) - {str}:
            raise fail(f"{where}.provenance", "must be a list of ONNX node names")
        kernels.append(KernelInfo(name(k, "name", where), tuple(params), tuple(prov)))
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise fail("kernels", "kernel names repeat")
    return kernels


def check_arena_liveness(kernels: list[KernelInfo], buffers: dict[int, _Buffer]) -> None:
    """No two scratch buffers may share arena bytes while both are live (from the first kernel that
    uses one to the last). Sweep over kernels keeping the live byte ranges sorted and disjoint:
    O(n log n) comparisons whatever the manifest says."""
    import bisect  # here, not at `import svodrt`
    span: dict[int, list[int]] = {}  # buffer -> [first kernel, last kernel], in order of first use
    for k, kernel in enumerate(kernels):
        for p in kernel.params:
            if buffers[p].kind == "scratch" and buffers[p].end > buffers[p].offset:
                span.setdefault(p, [k, k])[1] = k
    # At each kernel, its new buffers (in order of first use) start before the buffers it ends are dropped.
    events = sorted([(f, 0, b) for b, (f, _) in span.items()] + [(la, 1, b) for b, (_, la) in span.items()],
                    key=lambda e: e[:2])
    starts: list[int] = []  # offsets of live buffers, sorted; owner[i] is the buffer at starts[i]
    owner: list[int] = []
    for k, ending, b in events:
        lo, hi = buffers[b].offset, buffers[b].end
        i = bisect.bisect_left(starts, lo)
        if ending:
            del starts[i], owner[i]
            continue
        for j in (i - 1, i):
            if 0 <= j < len(starts):
                other = buffers[owner[j]]
                if other.offset < hi and lo < other.end:
                    raise fail("buffers", f"scratch buffers {b} and {owner[j]} overlap in the arena "
                               f"while both are live (kernel {k}, {kernels[k].name})")
        starts.insert(i, lo)
        owner.insert(i, b)


def _variant(m: dict, i: int, sections: list[Section]) -> Variant:
    v = m["variants"][i]
    where = f"variants[{i}]"
    si = uint(v, "section", where, len(sections))
    if si >= len(sections) or sections[si].kind != "code":
        raise fail(f"{where}.section", f"{si} is not a code section")
    sec = sections[si]
    arch, cpu = name(v, "arch", where), name(v, "cpu", where)
    feats = items(v, "features", where, 1024)
    if not set(map(type, feats)) <= {str} or not all(feats) or len(set(feats)) != len(feats):
        raise fail(f"{where}.features", "must be a list of distinct feature names")
    bits = uint(v, "feature_bits", where, (1 << 64) - 1)
    if arch in FEATURES and set(feats) <= bit_of(arch).keys() and bits != to_bits(arch, feats):
        raise fail(f"{where}.feature_bits", f"{bits:#x} disagrees with features {feats}")
    entry = uint(v, "entry", where)
    kernels = uints(v, "kernels", where)
    fixups = uints(v, "fixups", where)
    for what, offs, width in (("entry", [entry], 1), ("kernels", kernels, 1), ("fixups", fixups, 8)):
        for o in offs:
            if o + width > sec.length:
                raise fail(f"{where}.{what}", f"offset {o} is outside code section {sec.name!r} "
                           f"({sec.length} bytes at offset {sec.offset})")
    if any(b - a < 8 for a, b in itertools.pairwise(fixups)):
        raise fail(f"{where}.fixups", "must be sorted and at least 8 bytes apart")
    if field(v, "binding", bytes, where) != fmt.variant_binding(v, sec.sha256, m):  # the code's tie to the plan: always
        raise fail(f"{where}.binding", f"does not match {arch}:{cpu}'s code, entry points, features and "
                   "the plan they were compiled for: the manifest is damaged or was edited")
    kind = field(v, "kind", str, where) if "kind" in v else "cpu"
    team = _team(v, where, sec) if "team" in v and kind == "cpu" else ()
    return Variant(i, arch, cpu, tuple(feats), sec, entry, tuple(kernels), tuple(fixups), kind, team)


def _team(v: dict, where: str, sec: Section) -> tuple[int, ...]:  # format 1.10, bound by `team_binding`
    if len(team := uints(v, "team", where)) != 2 or any(o >= sec.length for o in team):
        raise fail(f"{where}.team", f"{team}: expected the offsets of 2 functions in code section {sec.name!r}")
    if field(v, "team_binding", bytes, where) != fmt.team_binding(v):
        raise fail(f"{where}.team_binding", "does not match the variant's team offsets: the manifest was edited")
    return tuple(team)


def parse_plan(m: dict, h: fmt.Header, sections: list[Section], weights: Section, deferred: bool = False) -> Bundle:
    dims = dim_table(m)
    inputs, outputs = _io(m, "inputs", dims)[0], _io(m, "outputs", dims)[0]
    sized = {d.name for t in inputs for _, d, _ in t.dims}
    if {n for n, d in dims.items() if not d.computed} - sized:
        raise fail("dims", "a dim sizes no input: no call could give its value")
    arena = uint(m, "arena_size", "manifest", fmt.MAX_BYTES)
    weights_size = uint(m, "weights_size", "manifest", fmt.MAX_BYTES)
    if weights.length < weights_size:
        raise fail("weights_size", f"{weights_size} is more than the weights section holds ({weights.length})")
    plan = None if deferred else checked_plan(m, arena, weights_size)  # before the variants' bindings
    # Read before the variants: their bindings cover it.
    vocab = _edge(m, "vocabulary", "parse_vocabulary") if any(t.dtype == fmt.STRING for t in inputs + outputs) else ()
    variants = [_variant(m, i, sections) for i in range(len(items(m, "variants", "manifest")))]
    if not variants:
        raise fail("variants", "the bundle has no code variant")
    zipmaps = _edge(m, "zipmaps", "parse_zipmaps", outputs) if "zipmaps" in m else ()
    steps = _edge(m, "edge_outputs", "parse_steps", inputs, outputs) if "edge_outputs" in m else ()
    bundle = Bundle(inputs, outputs, variants, arena, weights_size, vocab, tuple(dims.values()), zipmaps, steps, h, m,
                    sections, weights, deferred)
    if plan is not None:
        bundle.__dict__["_plan"] = entry_per_kernel(plan, variants)  # the cached_property's value
    return bundle


def entry_per_kernel(plan: tuple[list[KernelInfo], dict], variants: list[Variant]) -> tuple[list[KernelInfo], dict]:
    """The plan, once each variant is seen to have an entry point per kernel (a check of the plan's)."""
    for v in variants:
        if len(v.kernels) != len(plan[0]):
            raise fail(f"variants[{v.index}].kernels", f"has {len(v.kernels)} offsets for {len(plan[0])} kernels")
    return plan


def checked_plan(m: dict, arena: int, weights_size: int) -> tuple[list[KernelInfo], dict[int, tuple[str, int]]]:
    """The plan's buffers and kernels, checked: (kernels, buffer id -> placement)."""
    dims = dim_table(m)
    buffers = _buffers(m, _io(m, "inputs", dims)[1], _io(m, "outputs", dims)[1], arena, weights_size)
    kernels = _kernels(m, buffers)
    check_arena_liveness(kernels, buffers)
    return kernels, {b.id: (b.kind, b.offset) for b in buffers.values()}
