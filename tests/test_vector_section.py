"""Format 1.9 (issue 13): test vectors live in a `tests` section that no load reads (a load never decompresses or
hashes them); svodrt verify reads them there, and from the manifest in older bundles."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import svodrt
from svodrt.bundle import parse_bundle
from svodrt.format import FORMAT_MINOR
from svodrt_tools.verify import verify
from tests.bundle_tools import manifest_of, repack, run_old_runtime, vectors_of

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
FORMAT_1_8_COMMIT = "700a808"  # main just before format 1.9: a format 1.8 runtime


def _tests_section(data: bytes):
    return next(s for s in parse_bundle(data).sections if s.kind == "tests")


def test_vectors_are_a_section_of_their_own(small_bundle):
    data = small_bundle[0].read_bytes()
    m = manifest_of(data)
    assert FORMAT_MINOR >= 9 and "test_vectors" not in m
    assert _tests_section(data).name == "test_vectors" and len(vectors_of(data)) == 1
    assert any(line.startswith("test vector 0 on") for _, line in verify(data).lines)


def test_a_load_never_reads_the_vectors_and_verify_names_their_damage(small_bundle):
    data = small_bundle[0].read_bytes()
    s = _tests_section(data)
    bad = bytearray(data)
    bad[s.offset + s.length // 2] ^= 0x10
    with svodrt.load(data) as good, svodrt.load(bytes(bad)) as damaged:
        assert np.array_equal(good.run(small_bundle[1])["y"], damaged.run(small_bundle[1])["y"])
    failures = verify(bytes(bad)).failures
    assert failures and "section 'test_vectors'" in failures[0] and "sha256" in failures[0]


def test_verify_reads_older_bundles_vectors_from_the_manifest():
    path = ARTIFACTS / "v1.8" / "small_cnn.svod"
    assert "test_vectors" in manifest_of(path.read_bytes())
    report = verify(path)
    assert report.ok and any(status == "ok" and what.startswith("test vector 0 on") for status, what in report.lines)


def test_a_format_1_8_runtime_runs_a_1_9_bundle(small_bundle, tmp_path):
    """A new section kind is what a minor bump may add: the 1.8 runtime from this repository's history checks its
    bounds and padding, ignores it, and gives the same outputs."""
    path, feeds = small_bundle
    (tmp_path / "b.svod").write_bytes(path.read_bytes())
    np.savez(tmp_path / "in.npz", **feeds)
    run_old_runtime(FORMAT_1_8_COMMIT, 8, """
import numpy as np
with svodrt.load(sys.argv[1] + "/b.svod", threads=1) as m:
    np.savez(sys.argv[1] + "/out.npz", **m.run(dict(np.load(sys.argv[1] + "/in.npz"))))
""", tmp_path)
    with svodrt.load(path, threads=1) as m, np.load(tmp_path / "out.npz") as old:
        assert np.array_equal(old["y"], m.run(feeds)["y"])


def test_verify_refuses_vectors_in_two_places(small_bundle):
    """One `tests` section named test_vectors, and no vectors in the manifest beside it: verify reads one copy,
    so another copy (which it would not check) is a format error, not something silently ignored."""
    data = small_bundle[0].read_bytes()
    renamed = manifest_of(data)
    next(s for s in renamed["sections"] if s["kind"] == "tests")["name"] = "other"
    doubled = manifest_of(data)
    doubled["test_vectors"] = vectors_of(data)
    for bad, what in ((renamed, r"1 'tests' sections \(other\)"), (doubled, "and test vectors in its manifest")):
        failures = verify(repack(data, bad)).failures
        assert failures and re.search(what, failures[-1]), failures
