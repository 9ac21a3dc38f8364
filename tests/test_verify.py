"""Bundle verification: svodrt verify, test vectors, checksums, manifest schema, header, versions."""

from __future__ import annotations

import copy
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper

import svodc
import svodrt
from svodrt.format import FORMAT_MAJOR, FORMAT_MINOR, HEADER_SIZE, unpack_header
from svodrt_tools.verify import max_error, verify
from tests.bundle_tools import manifest_of, repack, vectors_of, with_test_vectors, with_wrong_test_vector
from tests.onnx_util import make_model

BIN = os.path.dirname(sys.executable)


def svodrt_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(BIN, "svodrt"), *args], capture_output=True, text=True, timeout=120)


def _flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x10]) + data[offset + 1:]


def test_verify_passes_on_a_good_bundle(fat_bundle):
    r = svodrt_cli("verify", str(fat_bundle[0]))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "verify: PASS"
    vectors = [ln for ln in lines if "test vector 0 on x86_64:" in ln]
    assert vectors and all(ln.startswith("ok") and "max error" in ln for ln in vectors), r.stdout


def test_verify_fails_on_a_tampered_test_vector(small_bundle, tmp_path):
    bad = tmp_path / "tampered.svod"
    bad.write_bytes(with_wrong_test_vector(small_bundle[0].read_bytes()))
    with svodrt.load(bad) as model:  # it still loads and runs: the vector is only checked by verify
        assert model.run(small_bundle[1])["y"].shape == (2, 10)
    r = svodrt_cli("verify", str(bad))
    assert r.returncode == 1
    assert any(ln.startswith("FAIL") and "test vector 0" in ln and "'y' max error 0.5" in ln
               for ln in r.stdout.splitlines()), r.stdout
    assert len(r.stderr.strip().splitlines()) == 1 and "failed verification: test vector 0" in r.stderr


@pytest.mark.parametrize("path,value,message", [
    (["inputs"], [], r"section 'test_vectors': test_vectors\[0\]\.inputs: has 0 arrays for 1 inputs"),
    (["outputs", 0], b"x", r"'y' must be 80 bytes"),
    (["tolerance"], [-1.0], r"tolerance: must hold one finite, non-negative number"),
], ids=["arity", "size", "tolerance"])
def test_a_malformed_test_vector_fails_verify_but_loads(small_bundle, path, value, message):
    """Only verify reads the test vectors (issue 13: not decoded at load), so it alone checks their shapes."""
    data = small_bundle[0].read_bytes()
    vectors = vectors_of(data)
    node = vectors[0]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    bad = with_test_vectors(data, vectors)
    with svodrt.load(bad) as model:
        assert model.run(small_bundle[1])["y"].shape == (2, 10)
    report = verify(bad)
    assert not report.ok and re.search(message, report.failures[0]), report.failures


def test_max_error_treats_nan_and_inf_exactly():
    a = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    assert max_error(a, a.copy()) == 0.0
    assert max_error(a, np.array([1.0, 0.0, np.inf, -np.inf], np.float32)) == np.inf
    assert max_error(a, np.array([1.0, np.nan, -np.inf, -np.inf], np.float32)) == np.inf
    assert max_error(a, np.array([1.25, np.nan, np.inf, -np.inf], np.float32)) == 0.25
    assert max_error(np.array([3, 4]), np.array([3, 7])) == 3.0


def test_damaged_code_is_never_run(small_bundle):
    data = small_bundle[0].read_bytes()
    code = manifest_of(data)["sections"][1]
    bad = _flip(data, code["offset"] + code["length"] // 2)
    with pytest.raises(svodrt.BundleFormatError, match=r"code section 'code\.x86_64\..*' at offset \d+ fails its sha256"):
        svodrt.load(bad)
    report = verify(bad)
    assert not report.ok and "fails its sha256" in report.failures[0]


def test_weights_checksum_policy(small_bundle, tmp_path):
    # Weights up to 16 MiB are checked at every load, larger ones on request and by verify
    # (docs/architecture.md "Runtime"): damage changes numbers, never memory safety.
    data = small_bundle[0].read_bytes()
    w = manifest_of(data)["sections"][0]
    damaged = _flip(data, w["offset"] + 5)
    with pytest.raises(svodrt.BundleFormatError, match="section 'weights' at offset 64 .* fails its sha256"):
        svodrt.load(damaged)
    svodrt.load(damaged, verify_weights=False).close()
    assert not verify(damaged).ok
    # Large ones only on request, through a file.
    n = (17 << 20) // 4
    big = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": (np.float32, [n])}, ["y"],
                     {"w": np.arange(n, dtype=np.float32)})
    data = svodc.compile(big, target="x86_64:x86-64")
    w = manifest_of(data)["sections"][0]
    assert w["length"] == n * 4 and not vectors_of(data)  # 34 MiB of I/O: no vectors
    path = tmp_path / "big.svod"
    path.write_bytes(_flip(data, w["offset"] + 4 * 1000 + 3))
    x = np.zeros(n, np.float32)
    with svodrt.load(path, threads=1) as m:
        y = m.run({"x": x})["y"]
        assert y[999] == 999 and y[1000] != 1000 and y[1001] == 1001
    with pytest.raises(svodrt.BundleFormatError, match="section 'weights' .* fails its sha256"):
        svodrt.load(path, verify_weights=True)
    assert not verify(path).ok


def _duplicate_id(m: dict) -> None:
    m["buffers"][1]["id"] = m["buffers"][0]["id"]


def _write_a_weight(m: dict) -> None:
    m["kernels"][0]["params"][0] = next(b["id"] for b in m["buffers"] if b["kind"] == "weight")


def _overlap_live_buffers(m: dict) -> None:
    """Move a scratch buffer onto another that a kernel uses at the same time."""
    scratch = {b["id"]: b for b in m["buffers"] if b["kind"] == "scratch"}
    for k in m["kernels"]:
        live = [scratch[p] for p in k["params"] if p in scratch]
        for a in live:
            for b in live:
                size = 4 * int(np.prod(b["shape"]))  # float32 model
                if a is not b and a["offset"] != b["offset"] and a["offset"] + size <= m["arena_size"]:
                    b["offset"] = a["offset"]
                    return
    raise AssertionError("no kernel uses two scratch buffers")


def _small_manifest_edits():
    """(id, edit of the manifest dict, message the runtime must give)."""
    def set_(path, value):
        def edit(m):
            *parents, last = path
            node = m
            for p in parents:
                node = node[p]
            node[last] = value(node[last]) if callable(value) else value
        return edit

    return [
        ("input shape", set_(["inputs", 0, "shape", 0], 1), r"variants\[0\]\.binding: does not match"),
        ("output name", set_(["outputs", 0, "name"], "z"), r"variants\[0\]\.binding"),
        ("arena too small", set_(["arena_size"], 64), r"buffers\[\d+\]: .* outside the scratch area \(64 bytes\)"),
        ("arena absurd", set_(["arena_size"], 1 << 50), r"arena_size: = \d+ is out of range"),
        ("bool as int", set_(["arena_size"], True), r"arena_size: has type bool"),
        ("entry outside", set_(["variants", 0, "entry"], 10 ** 9), r"variants\[0\]\.entry: offset \d+ is outside"),
        ("fixups unsorted", set_(["variants", 0, "fixups"], [16, 8]), r"fixups: must be sorted"),
        ("feature dropped", set_(["variants", 0, "features"], lambda f: f[1:]), r"feature_bits: .* disagrees"),
        ("duplicate id", _duplicate_id, r"buffer id \d+ is used twice"),
        ("unknown param", set_(["kernels", 0, "params"], [999]), r"kernels\[0\]\.params: .*unknown: \[999\]"),
        ("writes a weight", _write_a_weight, r"written buffer \d+ is a read-only weight"),
        ("live overlap", _overlap_live_buffers, r"scratch buffers \d+ and \d+ overlap in the arena"),
        ("section over header", set_(["sections", 0, "offset"], 0), r"'weights' \[0, \d+\) overlaps the header"),
        ("section misaligned", set_(["sections", 1, "offset"], lambda o: o + 1), r"is not 64-aligned"),
        ("section too long", set_(["sections", 1, "length"], lambda n: n + 4096), r"overlaps .* the manifest"),
        ("weights_size", set_(["weights_size"], 10 ** 6), r"more than the weights section holds"),
        ("dtype", set_(["inputs", 0, "dtype"], "complex64"), r"inputs\[0\]\.dtype: 'complex64' is not one of"),
        ("rank", set_(["inputs", 0, "shape"], [1] * 65), r"rank 65, over the limit 64"),
        ("huge tensor", set_(["inputs", 0, "shape"], [1 << 30, 1 << 30]), r"is over 1099511627776 bytes"),
        ("slot", set_(["inputs", 0, "slot"], 3), r"inputs\[0\]\.slot: is 3, must be its position 0"),
        ("format", set_(["format"], [1, 99]), rf"format \[1, 99\] disagrees with the header version 1\.{FORMAT_MINOR}"),
        ("byte order", set_(["byte_order"], "big"), r"variants\[0\] is for x86_64, whose data is little-endian, but the bundle's byte_order is 'big'"),
        ("section name", set_(["sections", 1, "name"], "weights"), r"section name 'weights' .* repeats"),
        ("no variants", set_(["variants"], []), r"no code variant"),
        ("kernel name", lambda m: m["kernels"][1].update(name=m["kernels"][0]["name"]), r"kernel names repeat"),
        ("missing key", lambda m: m.pop("kernels"), r"manifest\.kernels: is missing"),
        ("not a map", set_(["variants", 0], [1, 2]), r"variants\[0\]: is a list, expected a map"),
    ]


@pytest.mark.parametrize("edit,message", [e[1:] for e in _small_manifest_edits()],
                         ids=[e[0] for e in _small_manifest_edits()])
def test_manifest_edits_are_refused_by_name(small_bundle, edit, message):
    data = small_bundle[0].read_bytes()
    m = copy.deepcopy(manifest_of(data))
    edit(m)
    with pytest.raises(svodrt.BundleFormatError, match=message) as e:
        svodrt.load(repack(data, m))
    assert "(manifest at offset" in str(e.value)


def test_manifest_that_is_not_a_map(small_bundle):
    data = small_bundle[0].read_bytes()
    with pytest.raises(svodrt.BundleFormatError, match=r"manifest at offset \d+ is not a map"):
        svodrt.load(repack(data, [1, 2, 3]))


def _header_edit(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    return data[:offset] + struct.pack(fmt, value) + data[offset + struct.calcsize(fmt):]


@pytest.mark.parametrize("offset,fmt,value,message", [
    (8, "<H", FORMAT_MAJOR + 1, rf"bundle format 2\.{FORMAT_MINOR} is newer than this runtime's 1\.{FORMAT_MINOR} "
                                r"\(it reads 1\.x"),
    (8, "<H", 0, r"major version 0 at offset 8 is invalid"),
    (12, "<I", 8, r"header size 8 at offset 12"),
    (16, "<I", 3, r"flags 0x3 .* at offset 16 hold unknown bits"),
    (20, "<I", 1, r"reserved 0x1 at offset 16"),
    (24, "<Q", 12345, r"says the file is 12345 bytes"),
    (32, "<Q", 1 << 62, r"manifest \[\d+, \d+\) .* must lie after the header and end the file"),
    (40, "<Q", 3, r"must lie after the header and end the file"),
    (48, "<Q", 1 << 40, r"manifest size 1099511627776 \(header offset 48\) exceeds the limit"),
    (48, "<Q", 100, r"is \d+ bytes, header says 100"),
    (56, "<Q", 0, r"fails its checksum \(header offset 56\)"),
])
def test_header_fields_are_checked(small_bundle, offset, fmt, value, message):
    data = small_bundle[0].read_bytes()
    with pytest.raises(svodrt.BundleFormatError, match=message):
        svodrt.load(_header_edit(data, offset, fmt, value))


def test_newer_minor_version_with_unknown_fields_loads(small_bundle):
    data, feeds = small_bundle[0].read_bytes(), small_bundle[1]
    m = manifest_of(data)
    m["format"] = [1, 7]
    m["a_field_from_the_future"] = {"anything": [1, 2]}
    m["kernels"][0]["future_kernel_field"] = True
    newer = _header_edit(repack(data, m), 10, "<H", 7)
    assert unpack_header(newer[:HEADER_SIZE])[1].minor == 7
    with svodrt.load(newer) as a, svodrt.load(data) as b:
        np.testing.assert_array_equal(a.run(feeds)["y"], b.run(feeds)["y"])


def test_bad_magic_truncation_and_empty_file(small_bundle, tmp_path):
    data = small_bundle[0].read_bytes()
    with pytest.raises(svodrt.BundleFormatError, match="bad magic b'XXXX"):
        svodrt.load(b"XXXX" + data[4:])
    with pytest.raises(svodrt.BundleFormatError, match="truncated"):
        svodrt.load(data[:-10])
    empty = tmp_path / "empty.svod"
    empty.write_bytes(b"")
    with pytest.raises(svodrt.BundleFormatError, match="file is 0 bytes"):
        svodrt.load(empty)
    r = svodrt_cli("verify", str(empty))
    assert r.returncode == 1 and r.stdout.startswith("FAIL") and len(r.stderr.strip().splitlines()) == 1
