"""`svodrt verify`: every check a bundle can get on the machine that will run it: structure, the sha256
of every section, which variants this host runs, and each embedded test vector on each of them (max
error per output against the compiler's tolerance)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from svodrt import load
from svodrt.bundle import Bundle, Record, Source, TensorInfo, check_section, parse_bundle, unpack_bounded
from svodrt.errors import BundleFormatError, SvodError
from svodrt.format import BITS_OF, DTYPES, FLOAT_FORMATS, GPU_KINDS, MAX_TEST_VECTORS, STRING
from svodrt.host import Host, detect_host
from svodrt.model import select_variant, variant_problem
from svodrt.runner import Runner
from svodrt.schema import fail, items
from svodrt_gpu.plan import gpu_variant
from svodrt_strings.ids import StringTable
from svodrt_trust import TrustSpec, check_signature, trusted_keys

BIT_FLOATS = frozenset(BITS_OF.values())


@dataclass
class Report:
    lines: list[tuple[str, str]] = field(default_factory=list)  # (status: ok|FAIL|skip, what)

    def add(self, status: str, what: str) -> None:
        self.lines.append((status, what))

    @property
    def failures(self) -> list[str]:
        return [what for status, what in self.lines if status == "FAIL"]

    @property
    def ok(self) -> bool:
        return not self.failures

    def text(self) -> str:
        body = [f"{status:<5} {what}" for status, what in self.lines]
        return "\n".join([*body, f"verify: {'PASS' if self.ok else 'FAIL'}"])


def max_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want|; NaN matches only NaN, an infinity only the same infinity."""
    if got.size == 0:
        return 0.0
    if np.array_equal(got, want, equal_nan=got.dtype.kind in "fc"):
        return 0.0
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore"):
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        diff = np.where(same, 0.0, np.abs(g - w))
    return float(np.nan_to_num(diff, nan=np.inf, posinf=np.inf).max())


def _array(t: TensorInfo, blob: bytes) -> np.ndarray:
    dt = np.dtype(DTYPES[t.dtype][0])
    return np.frombuffer(blob, dtype=dt.newbyteorder("<")).astype(dt).reshape(t.shape)


def float_values(bits: np.ndarray, dtype: str) -> np.ndarray:
    """The float64 values of a float format that travels as its bits (bfloat16, float8, float4)."""
    nbits, mant, bias, kind = FLOAT_FORMATS[dtype]
    b = bits.astype(np.int64)
    if kind == "e8m0":
        return np.where(b == 0xFF, np.nan, np.ldexp(1.0, b - bias))
    sign, mag = (b >> (nbits - 1)) & 1, b & ((1 << (nbits - 1)) - 1)
    e, m = mag >> mant, mag & ((1 << mant) - 1)
    v = np.where(e == 0, np.ldexp(m.astype(np.float64), 1 - bias - mant), np.ldexp(1.0 + m / (1 << mant), e - bias))
    top = (1 << (nbits - 1 - mant)) - 1
    if kind == "ieee":
        v = np.where(e == top, np.where(m == 0, np.inf, np.nan), v)
    elif kind == "fn":
        v = np.where(mag == (1 << (nbits - 1)) - 1, np.nan, v)
    elif kind == "fnuz":
        v = np.where(b == 1 << (nbits - 1), np.nan, v)
    return np.where(sign == 1, -v, v)


def _values(t: TensorInfo, a: np.ndarray) -> np.ndarray:
    """Outputs as numbers to compare: bit-transported floats decoded."""
    return float_values(a, t.dtype) if t.dtype in BIT_FLOATS else a


def strings_for_ids(vocabulary: tuple[str, ...], ids: np.ndarray) -> np.ndarray:
    """An object array of strings that intern to ids equivalent to `ids` (a test vector's stored
    input; svodrt_strings/ids.py): the vocabulary's string for an id in it, and for each other id (a
    damaged vector may hold any) a string the vocabulary lacks, one per id."""
    known, unseen = set(vocabulary), {}

    def string(i: int) -> str:
        if 0 <= i < len(vocabulary):
            return vocabulary[i]
        if i not in unseen:
            s = f"<svod test string {i}>"
            while s in known:
                s += "'"
            unseen[i] = s
        return unseen[i]

    out = np.empty(ids.shape, dtype=object)
    out.reshape(-1)[:] = [string(int(i)) for i in ids.reshape(-1)]
    return out


class TestVector(NamedTuple):
    """A reference input and the outputs the compiler expects, with a tolerance per output."""

    __test__ = False  # not a pytest class

    inputs: tuple[bytes, ...]
    outputs: tuple[bytes, ...]
    tolerance: tuple[float, ...]


def read_test_vectors(data: bytes, bundle: Bundle) -> list[TestVector]:
    """The test vectors, checked against the inputs and outputs (here, not at load: only verify reads them, and a
    bad vector does not stop the model from loading): format 1.9's `tests` section, or older formats' manifest."""
    m = bundle.manifest
    if tests := [s for s in bundle.sections if s.kind == "tests"]:
        s = tests[0]
        if len(tests) > 1 or s.name != "test_vectors" or "test_vectors" in m:  # docs/bundle-format.md: one, named so
            raise BundleFormatError(f"the bundle has {len(tests)} 'tests' sections ({', '.join(t.name for t in tests)})"
                                    f"{' and test vectors in its manifest' if 'test_vectors' in m else ''}: a "
                                    "bundle carries one, named 'test_vectors'; rebuild it with svodc")
        try:  # bounded like the manifest (svodrt/bundle.py)
            m = {"test_vectors": unpack_bounded(data[s.offset: s.offset + s.length], len(data))}
        except Exception as e:  # msgpack raises several types for malformed input
            raise BundleFormatError(f"section {s.name!r} at offset {s.offset} is not valid msgpack: "
                                    f"{type(e).__name__} {e}") from None
        try:
            return _test_vectors(m, bundle.inputs, bundle.outputs)
        except BundleFormatError as e:  # the schema's readers name manifest fields
            raise BundleFormatError(str(e).replace("manifest field ", f"section {s.name!r}: ", 1)) from None
    return _test_vectors(m, bundle.inputs, bundle.outputs)


def _test_vectors(m: dict, inputs: list[TensorInfo], outputs: list[TensorInfo]) -> list[TestVector]:
    if "test_vectors" not in m:
        return []
    out = []
    for i, tv in enumerate(items(m, "test_vectors", "manifest", MAX_TEST_VECTORS)):
        where = f"test_vectors[{i}]"
        blobs = {}
        for group, tensors in (("inputs", inputs), ("outputs", outputs)):
            arrays = items(tv, group, where)
            if len(arrays) != len(tensors):
                raise fail(f"{where}.{group}", f"has {len(arrays)} arrays for {len(tensors)} {group}")
            for t, b in zip(tensors, arrays, strict=True):
                if not isinstance(b, bytes) or len(b) != t.nbytes:
                    raise fail(f"{where}.{group}", f"the array for {t.name!r} must be {t.nbytes} bytes")
            blobs[group] = tuple(arrays)
        tol = items(tv, "tolerance", where)
        if len(tol) != len(outputs) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                               and 0 <= x < math.inf for x in tol):
            raise fail(f"{where}.tolerance", "must hold one finite, non-negative number per output")
        out.append(TestVector(blobs["inputs"], blobs["outputs"], tuple(float(x) for x in tol)))
    return out


def run_test_vector(model: Runner, tv: TestVector) -> list[tuple[str, float, float]]:
    """(output name, max error, tolerance) per output."""
    b = model.bundle
    feeds = {t.name: _array(t, x) for t, x in zip(b.inputs, tv.inputs, strict=True)}
    for t in b.inputs:  # string inputs are stored as ids: run() takes strings (svodrt_strings/ids.py)
        if t.dtype == STRING:
            feeds[t.name] = strings_for_ids(b.vocabulary, feeds[t.name])
    got, zipmaps = model.run(feeds), dict(b.zipmaps)
    out = []
    for t, want, tol in zip(b.outputs, tv.outputs, tv.tolerance, strict=True):
        g, w = got[t.name], _values(t, _array(t, want))
        if t.name in zipmaps:  # format 1.5: a list of {label: score}; compare the scores
            g = np.array([list(row.values()) for row in g], np.float32).reshape(t.shape)
        if t.dtype == STRING:  # the vector stores ids; run() returns strings
            w = StringTable(b.vocabulary).decode(w, [i for i in b.inputs if i.dtype == STRING], feeds)
            out.append((t.name, 0.0 if np.array_equal(g, w) else float("inf"), tol))
        else:
            out.append((t.name, max_error(_values(t, g), w), tol))
    return out


def _check_variants(data: bytes, bundle: Bundle, vectors: list[TestVector], host: Host, threads: int, report: Report,
                    device: str, trust: TrustSpec | None) -> None:
    runnable, seen = 0, {}  # code -> the variant that ran it: a bundle may repeat one code image many times
    for v in bundle.variants:
        label = f"variant {v.index} {v.describe()}"
        problem = variant_problem(v, host) if device == "cpu" else \
            (None if device.startswith(v.kind) else f"not a {device} variant")
        if problem is not None:
            report.add("skip", f"{label}: cannot run on this host ({problem})")
            continue
        runnable += 1
        gpu = gpu_variant(bundle, v)[1:] if v.kind in GPU_KINDS else ()  # (launches, cubin)
        code = (v.kind, v.section.sha256, v.entry, v.kernels, v.fixups, gpu)
        if code in seen:
            report.add("ok", f"{label}: the same code as variant {seen[code]}, checked there")
            continue
        seen[code] = v.index
        try:
            with load(data, threads=threads, host=host, verify_weights=True, variant=v.index, device=device,
                      trust=trust) as m:
                report.add("ok", f"{label}: loads on {'this host' if device == 'cpu' else device}")
                for i, tv in enumerate(vectors):
                    for name, err, tol in run_test_vector(m, tv):
                        status = "ok" if err <= tol else "FAIL"
                        report.add(status, f"test vector {i} on {v.describe()}: output {name!r} max error "
                                           f"{err:.3g} (tolerance {tol:.3g})")
        except SvodError as e:
            report.add("FAIL", f"{label}: {e}")
    if not runnable and device != "cpu":
        report.add("FAIL", f"no variant of this bundle is for {device}")
    elif not runnable:
        try:
            select_variant(bundle, host)
        except SvodError as e:  # names what each variant lacks
            report.add("FAIL", str(e))
    if not vectors:
        report.add("skip", "no test vectors in this bundle (compile with --test-vectors to embed them)")


def _check_signer(bundle: Bundle, trust: TrustSpec | None, report: Report) -> None:
    """Who signed the bundle; under a trust policy a FAIL unless a trusted key did."""
    try:
        signer = check_signature(bundle.manifest, None if trust is None else trusted_keys(trust))
    except SvodError as e:
        report.add("FAIL", f"signature: {e}")
        return
    policy = "a trusted key" if trust is not None else "no trust policy given (--trust)"
    report.add("ok" if signer else "skip", f"signature: signed by {signer} (valid; {policy})" if signer
               else "signature: the bundle is not signed (svodc compile --sign KEY)")


def verify(source: str | os.PathLike | bytes, host: Host | None = None, threads: int = 1,
           device: str = "cpu", trust: TrustSpec | None = None) -> Report:
    """Run every check; never raises for a bad bundle (the report says what failed). device: run the
    test vectors on that GPU's variants instead of the CPU's. trust: a trust policy (svodrt.load's);
    under one, nothing of a bundle no trusted key signed is run."""
    host = host or detect_host()
    report = Report()
    try:
        opened = None  # the file as opened: the weights' record names it
        if isinstance(source, (bytes, bytearray)):
            data = bytes(source)
        else:
            src = Source.open(source)
            try:
                data, opened = bytes(src.read(0, src.size)), src
            finally:
                src.close()
        bundle = parse_bundle(data)
    except (SvodError, OSError) as e:
        report.add("FAIL", str(e))
        return report
    h = bundle.header
    report.add("ok", f"structure: format {h.major}.{h.minor}, {len(data)} bytes, {len(bundle.sections)} sections, "
                     f"{len(bundle.variants)} variants, {len(bundle.kernels)} kernels")
    if opened is not None:
        Record.of(opened, h, "plan").write()  # every check of the plan ran: later loads defer them
    for s in bundle.sections:
        try:
            check_section(data, s)
            report.add("ok", f"section {s.name!r}: {s.length} bytes at offset {s.offset}, sha256 matches")
            if s == bundle.weights and opened is not None:  # later loads of this file version trust its weights
                Record.of(opened, h, "weights", s.sha256).write()  # (docs/architecture.md "What is checksummed when")
        except SvodError as e:
            report.add("FAIL", str(e))
    _check_signer(bundle, trust, report)
    vectors: list[TestVector] = []
    try:
        vectors = read_test_vectors(data, bundle)
    except SvodError as e:  # the model still loads: like a vector's wrong outputs, this fails verify alone
        report.add("FAIL", f"test vectors: {e}")
    if report.ok:
        _check_variants(data, bundle, vectors, host, threads, report, device, trust)
    return report
