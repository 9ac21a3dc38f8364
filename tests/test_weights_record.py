"""Issue 13: a file's weights are checksummed at its first load and then trusted through a record of that very
file version (svodrt/bundle.py Record; docs/architecture.md "What is checksummed when"). A damaged weight
is still an error at load, never a wrong answer: damage written to the file changes its identity, so the record no
longer matches and the weights are checked again. The plan's checks (its buffers and kernels, the bindings) are
recorded the same way: a later load of that file version defers them to their first use."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

import svodrt
import svodrt.bundle
import svodrt.format
from svodrt.bundle import PLAN_KEYS, Program, Record, Source, parse_bundle, read_header
from svodrt.schema import Packed
from svodrt_tools.verify import verify
from tests.bundle_tools import manifest_of, repack


@pytest.fixture
def bundle_file(small_bundle, tmp_path, monkeypatch):
    """A private copy of the small bundle, a cache of its own, and records written however new the file is."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(svodrt.bundle, "RECORD_AGE_NS", 0)
    path, feeds = small_bundle
    copy = tmp_path / "m.svod"
    copy.write_bytes(path.read_bytes())
    return copy, feeds


def _checks(path, **kw) -> tuple[bool, bool]:
    """(hashed at this load, weights_verified)."""
    program = Program(path, **kw)
    try:
        return program.check_weights, program.weights_verified
    finally:
        program.close()


def _damage_weight(path) -> None:
    """Flip a weights byte in place (same inode and size), as a bad write would; the explicit mtime makes the
    change visible in the identity even where timestamps are coarser than the test."""
    w = parse_bundle(path.read_bytes()).weights
    with open(path, "r+b") as f:
        f.seek(w.offset + 8)
        byte = f.read(1)[0]
        f.seek(w.offset + 8)
        f.write(bytes([byte ^ 0x40]))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_the_first_load_checks_the_weights_and_later_loads_trust_its_record(bundle_file):
    path, feeds = bundle_file
    with svodrt.load(path) as m:
        assert m.weights_verified
        want = m.run(feeds)["y"]
    assert _checks(path) == (False, True)  # the record: verified, no sha256 this time
    with svodrt.load(path) as m:
        assert m.weights_verified and np.array_equal(m.run(feeds)["y"], want)


def test_a_weight_damaged_after_the_record_is_still_an_error_at_load(bundle_file):
    path, _ = bundle_file
    svodrt.load(path).close()
    assert _checks(path) == (False, True)
    _damage_weight(path)
    with pytest.raises(svodrt.BundleFormatError, match="'weights' .* fails its sha256"):
        svodrt.load(path)


def test_a_recently_changed_file_gets_no_record(bundle_file, monkeypatch):
    path, _ = bundle_file
    monkeypatch.setattr(svodrt.bundle, "RECORD_AGE_NS", 10**18)  # every file is "new"
    svodrt.load(path).close()
    assert _checks(path) == (True, True)  # checked again: a change within its timestamps' granule would not show


def test_a_file_new_when_opened_gets_no_record_however_long_its_check_takes(bundle_file, monkeypatch):
    """The file's age is taken at the open: a write during a slow read or hash (here: the clock moves 10 s while
    the weights are read) could keep the times a later record would trust (review of the first version)."""
    path, _ = bundle_file
    monkeypatch.setattr(svodrt.bundle, "RECORD_AGE_NS", 2_000_000_000)
    clock = {"skew": 0}
    real_ns = svodrt.bundle.time.time_ns
    monkeypatch.setattr(svodrt.bundle, "time", SimpleNamespace(time_ns=lambda: real_ns() + clock["skew"]))
    readinto = Source.readinto

    def slow_readinto(self, offset, buf):
        clock["skew"] = 10_000_000_000
        readinto(self, offset, buf)

    monkeypatch.setattr(Source, "readinto", slow_readinto)
    svodrt.load(path).close()
    assert _checks(path) == (True, True)  # no record: checked again


def test_a_record_of_another_version_of_the_file_is_ignored(bundle_file):
    path, _ = bundle_file
    svodrt.load(path).close()
    src = Source.open(path)
    src.close()
    b = parse_bundle(path.read_bytes())
    record = Record.of(src, b.header, "weights", b.weights.sha256)
    assert record is not None and record.exists()
    size = os.stat(path).st_size
    with open(record.path, "wb") as f:  # the same device and inode, another size
        f.write(record.content.replace(f" {size} ".encode(), f" {size + 1} ".encode(), 1))
    assert _checks(path) == (True, True)


def test_a_file_rewritten_while_its_recorded_weights_are_read_is_an_error(bundle_file, monkeypatch):
    path, _ = bundle_file
    svodrt.load(path).close()
    readinto = Source.readinto

    def rewriting_readinto(self, offset, buf):
        if offset == parse_bundle(path.read_bytes()).weights.offset:
            os.utime(path, ns=(1, 1))  # a writer changes the file after the record was consulted
        readinto(self, offset, buf)

    monkeypatch.setattr(Source, "readinto", rewriting_readinto)
    with pytest.raises(svodrt.BundleFormatError, match="rewritten while it was read"):
        svodrt.load(path)


def test_asking_always_checks_and_refusing_never_does(bundle_file):
    path, _ = bundle_file
    svodrt.load(path).close()
    assert _checks(path, verify_weights=True) == (True, True)
    assert _checks(path, verify_weights=False) == (False, False)


def test_verify_records_weights_over_the_load_limit(bundle_file, monkeypatch):
    path, _ = bundle_file
    monkeypatch.setattr(svodrt.format, "WEIGHTS_CHECK_LIMIT", 0)  # as if the weights were large
    assert _checks(path) == (False, False)
    assert verify(path).ok
    assert _checks(path) == (False, True)


def test_an_unwritable_cache_costs_only_the_record(bundle_file, monkeypatch, tmp_path):
    path, feeds = bundle_file
    (tmp_path / "a_file").write_bytes(b"")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a_file"))  # no directory can be made under it
    with svodrt.load(path) as m:
        assert m.weights_verified and m.run(feeds)["y"].shape
    assert _checks(path) == (True, True)


def _deferred(path, **kw) -> bool:
    """Whether this load deferred the plan's checks (a record of them stood for them)."""
    program = Program(path, **kw)
    try:
        return program.bundle.deferred
    finally:
        program.close()


def test_the_first_load_checks_the_plan_and_later_loads_defer_it_to_its_first_use(bundle_file):
    path, feeds = bundle_file
    first = Program(path)
    assert not first.bundle.deferred
    kernels, placement = first.bundle.kernels, first.bundle.placement
    first.close()
    later = Program(path)
    try:
        assert later.bundle.deferred and "_plan" not in vars(later.bundle)  # nothing of the plan read yet
        assert later.bundle.kernels == kernels and later.bundle.placement == placement  # read and checked now
    finally:
        later.close()
    with svodrt.load(path) as m:
        assert m.bundle.deferred and m.run(feeds)["y"].shape


def test_a_plan_record_of_another_version_of_the_file_or_under_a_policy_is_ignored(bundle_file):
    path, _ = bundle_file
    svodrt.load(path).close()
    assert _deferred(path) and _deferred(path, verify_weights=False)
    assert not _deferred(path, verify_weights=True) and not _deferred(path.read_bytes())
    os.utime(path, ns=(1, 1))  # another version of the file: its identity moved
    assert not _deferred(path)


def _forge_plan_record(path) -> None:
    src = Source.open(path)
    src.close()
    forged = Record.of(src, read_header(path.read_bytes()), "plan")
    os.makedirs(os.path.dirname(forged.path), exist_ok=True)
    with open(forged.path, "wb") as f:
        f.write(forged.content)


def test_svodrt_verify_records_the_plans_checks(bundle_file):
    path, _ = bundle_file
    assert verify(path).ok and _deferred(path)


def test_a_plan_record_never_stands_for_the_binding_of_the_code_to_the_plan(bundle_file):
    """The binding is what ties the code to the arena size it writes within: checked at every load."""
    path, _ = bundle_file
    m = manifest_of(path.read_bytes())
    m["arena_size"] = 64  # the code writes more: without the binding check, heap corruption
    path.write_bytes(repack(path.read_bytes(), m))  # not rebound
    _forge_plan_record(path)
    with pytest.raises(svodrt.BundleFormatError, match=r"variants\[0\]\.binding: does not match"):
        svodrt.load(path)


def test_a_deferred_plan_is_still_checked_when_it_is_used(bundle_file):
    """A record that lies (a manifest edited and made consistent, its record forged) defers nothing away: the
    plan's checks run at its first use and fail there, naming the field."""
    path, _ = bundle_file
    m = manifest_of(path.read_bytes())
    m["buffers"][0]["offset"] = m["arena_size"] + m["weights_size"]  # outside either area
    _refused_at_load_and_at_first_use(path, m, r"buffers\[0\].*lies outside",
                                      r"buffers\[0\].*lies outside.*\(manifest at offset")


def test_a_deferred_load_leaves_the_plan_packed_and_unpacks_it_whole_when_asked(bundle_file):
    """What a CPU load reads nothing of (the plan's buffers and kernels, node_ops, options) stays msgpack: skipped,
    not built, at load; Bundle.manifest is then the map a full parse gives, key for key and in order."""
    path, _ = bundle_file
    svodrt.load(path).close()
    program = Program(path)
    try:
        head = program.bundle.head
        assert program.bundle.deferred and {k for k, v in head.items() if type(v) is Packed} == set(PLAN_KEYS) & set(head)
        assert "kernels" in head and "manifest" not in vars(program.bundle)
        full = parse_bundle(path.read_bytes()).manifest  # bytes: never deferred
        assert program.bundle.manifest == full and list(program.bundle.manifest) == list(full)
    finally:
        program.close()


def _refused_at_load_and_at_first_use(path, manifest: dict, at_load: str, at_use: str) -> None:
    """The edited manifest (rebound) is refused by a full load; under a forged plan record the load defers and the
    plan's first use refuses it."""
    path.write_bytes(repack(path.read_bytes(), manifest, rebind=True))
    with pytest.raises(svodrt.BundleFormatError, match=at_load):
        svodrt.load(path)
    _forge_plan_record(path)
    program = Program(path)
    try:
        assert program.bundle.deferred
        with pytest.raises(svodrt.BundleFormatError, match=at_use):
            program.bundle.kernels  # noqa: B018
    finally:
        program.close()


def test_a_packed_plan_that_is_not_valid_msgpack_fails_at_its_first_use(bundle_file):
    """Under a forged record the plan is not even unpacked at load: unpacking it is then a check like the others."""
    path, _ = bundle_file
    m = manifest_of(path.read_bytes())
    m["kernels"] = {1: 2}  # an integer map key: refused by the runtime's msgpack (strict_map_key)
    _refused_at_load_and_at_first_use(path, m, "not valid msgpack", r"manifest at offset \d+: ValueError")


def test_a_variant_without_an_entry_point_per_kernel_fails_when_the_plan_is_used(bundle_file):
    path, _ = bundle_file
    m = manifest_of(path.read_bytes())
    m["variants"][0]["kernels"].pop()
    _refused_at_load_and_at_first_use(path, m, r"variants\[0\]\.kernels: has \d+ offsets for \d+ kernels",
                                      r"variants\[0\]\.kernels: has \d+ offsets")


def _with_padding_byte(path) -> None:
    """A non-zero byte in the first padding after a section (a rewrite: the identity moves). Where every
    section happens to end on the next one's alignment (their sizes follow the code), zero padding is
    first put before the manifest, which a bundle may have."""
    data = path.read_bytes()
    sections = parse_bundle(data).sections
    ends = [s.offset + s.length for s in sections]
    starts = [s.offset for s in sections[1:]] + [read_header(data).manifest_offset]
    gap = next((end for end, start in zip(ends, starts, strict=True) if end < start), None)
    if gap is None:
        gap = read_header(data).manifest_offset
        data = repack(data, manifest_of(data), body=data[:gap] + bytes(64))
        with svodrt.load(data):  # zero padding is valid
            pass
    data = bytearray(data)
    data[gap] = 1
    path.write_bytes(bytes(data))


def test_padding_is_checked_at_a_first_load_and_by_verify_not_under_a_record(bundle_file):
    """Nothing reads padding: a record of the file version's checks stands for it, as for the plan."""
    path, feeds = bundle_file
    _with_padding_byte(path)
    with pytest.raises(svodrt.BundleFormatError, match=r"padding \[\d+, \d+\) before .* is not zero"):
        svodrt.load(path)
    assert not verify(path).ok
    _forge_plan_record(path)
    with svodrt.load(path) as m:
        assert m.bundle.deferred and m.run(feeds)["y"].shape
    assert not verify(path).ok


def test_small_manifests_are_stored_plain_and_compressed_ones_still_load(bundle_file):
    path, feeds = bundle_file
    data = path.read_bytes()
    assert read_header(data).flags == 0  # svodc: up to MANIFEST_PLAIN_MAX plain
    with svodrt.load(data) as plain, svodrt.load(repack(data, manifest_of(data))) as compressed:
        assert compressed.bundle.header.flags == 1
        assert np.array_equal(plain.run(feeds)["y"], compressed.run(feeds)["y"])
