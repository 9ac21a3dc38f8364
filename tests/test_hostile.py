"""Issue 18: each attack of the adversarial pass, reproduced, with its clean outcome. Item numbers are
the issue's: 1 fork, 2 files changing underneath, 3 bundle bombs, 4 trust, 5 paths, 6 large weights,
7 profile after close and signals during run()."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import svodrt
from svodrt.bundle import Source, parse_bundle
from svodrt.format import WEIGHTS_CHECK_LIMIT
from svodrt_tools.profile import kernel_times
from svodrt_tools.verify import verify
from tests.bundle_tools import manifest_bytes, manifest_of, repack

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts" / "v1.4"


def _threaded(path) -> svodrt.Model:
    """A model whose next run() uses its helpers (the automatic one-thread choice skipped)."""
    m = svodrt.load(path, threads=2)
    m._solo_runs = 2  # as if timed: use the helpers
    return m


def _wait_child(pid: int, seconds: float = 60) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child's run() hung")


# 1 ---------------------------------------------------------------- fork
def test_1_a_forked_child_runs_a_model_its_parent_ran_multithreaded(small_bundle):
    path, feeds = small_bundle
    m = _threaded(path)
    want = m.run(feeds)["y"]
    assert m._helpers is not None  # the attack: helper threads exist, and a child has none of them
    pid = os.fork()
    if pid == 0:  # the child: run twice (helpers restarted), report by exit code only
        try:
            ok = all(np.array_equal(m.run(feeds)["y"], want) for _ in range(2)) and m._helpers is not None
            os._exit(0 if ok else 3)
        except BaseException:
            os._exit(4)
    assert _wait_child(pid) == 0
    assert np.array_equal(m.run(feeds)["y"], want)  # the parent is unaffected
    m.close()


_FORKED: svodrt.Model | None = None


def _run_inherited(feeds):
    return _FORKED.run(feeds)["y"]


def test_1_multiprocessing_fork_workers_run_an_inherited_model(small_bundle):
    global _FORKED
    path, feeds = small_bundle
    _FORKED = _threaded(path)
    try:
        want = _FORKED.run(feeds)["y"]
        with multiprocessing.get_context("fork").Pool(2) as pool:
            got = pool.map_async(_run_inherited, [feeds] * 4).get(timeout=60)
        assert all(np.array_equal(g, want) for g in got)
    finally:
        _FORKED.close()
        _FORKED = None


# 2 ---------------------------------------------------------------- files changing underneath
def test_2_rewriting_or_truncating_the_file_after_load_changes_nothing(small_bundle, tmp_path):
    path, feeds = small_bundle
    copy = tmp_path / "m.svod"
    copy.write_bytes(path.read_bytes())
    m = svodrt.load(copy, threads=1)
    want = m.run(feeds)["y"]
    with open(copy, "r+b") as f:  # `cp other.svod m.svod` writes in place: same inode, new bytes
        f.write(bytes(len(path.read_bytes())))
    assert np.array_equal(m.run(feeds)["y"], want)
    os.truncate(copy, 0)  # once: SIGBUS at the next run
    assert np.array_equal(m.run(feeds)["y"], want)
    m.close()


def test_2_a_file_truncated_while_being_read_is_a_format_error(small_bundle, tmp_path):
    path, _ = small_bundle
    copy = tmp_path / "m.svod"
    copy.write_bytes(path.read_bytes())
    src = Source.open(copy)
    os.truncate(copy, copy.stat().st_size // 2)  # after open, before the manifest is read
    with pytest.raises(svodrt.BundleFormatError, match="truncated or rewritten while in use"):
        parse_bundle(src)
    src.close()


# 3 ---------------------------------------------------------------- bundle bombs
def _bounded_load(data: bytes, match: str) -> int:
    """Load `data`, expect a BundleFormatError matching `match`; the peak of Python allocations."""
    tracemalloc.start()
    try:
        with pytest.raises(svodrt.BundleFormatError, match=match):
            svodrt.load(data)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("item", [b"\x90", b"\x00"], ids=["empty-lists", "fixints"])
def test_3_a_manifest_that_expands_past_its_file_is_refused_unread(small_bundle, item):
    data = path_bytes(small_bundle)
    bomb = b"\xdd" + (1 << 25).to_bytes(4, "big") + item * (1 << 25)  # array32 of 2^25 items: 32 MiB raw
    peak = _bounded_load(repack(data, _raw(bomb)), "exceeds the limit")
    assert peak < 20 << 20


def test_3_a_manifest_of_many_small_objects_stops_before_they_are_built(small_bundle):
    data = path_bytes(small_bundle)
    bomb = b"\xdd" + (1 << 20).to_bytes(4, "big") + b"\x90" * (1 << 20)  # 1 MiB raw: within every length limit
    peak = _bounded_load(repack(data, _raw(bomb)), "more msgpack objects than a")
    assert peak < 100 << 20


def test_3_a_bundle_with_a_quarter_million_kernels_is_refused_cheaply(small_bundle):
    data = path_bytes(small_bundle)
    m = manifest_of(data)
    k = m["kernels"][0]
    m["kernels"] = [{**k, "name": f"k{i}"} for i in range(1 << 18)]
    peak = _bounded_load(repack(data, m), "more msgpack objects than a")
    assert peak < 100 << 20


@pytest.mark.parametrize("raw", [b"\x99" + b"\x90" * 9, b"\x91" * 8 + b"\x90", b"\x81\xa1k" * 4 + b"\x90", b"\x92\x90\x80", None],
                         ids=["empty-lists", "nested-lists", "nested-maps", "mixed", "a-real-manifest"])
def test_3_the_hooks_count_at_most_two_objects_per_manifest_byte(small_bundle, raw):
    """Why unpack_bounded leaves its counting hooks out when 2 * len(raw) is within the budget: they count each
    container's items and the container itself, and every object takes at least one byte, so they could not fire."""
    import msgpack

    if raw is None:
        raw = manifest_bytes(path_bytes(small_bundle))
    counted = [0]

    def count(x):
        counted[0] += len(x) + 1
        return x

    msgpack.unpackb(raw, list_hook=count, object_hook=count, strict_map_key=False)
    assert 0 < counted[0] <= 2 * len(raw)


def test_3_the_hooks_are_left_out_only_where_they_cannot_fire(small_bundle, monkeypatch):
    import msgpack

    from svodrt.bundle import OBJECTS_FLOOR, unpack_bounded

    seen, unpacker = [], msgpack.Unpacker
    monkeypatch.setattr(msgpack, "Unpacker", lambda **kw: seen.append("list_hook" in kw) or unpacker(**kw))
    svodrt.load(path_bytes(small_bundle)).close()  # a real manifest: far within its budget
    n = (OBJECTS_FLOOR >> 1) - 2  # n + 1 lists in n + 3 bytes: 2 * (n + 3) is over the budget of a 0-byte file
    unpack_bounded(b"\xdc" + n.to_bytes(2, "big") + b"\x90" * n, 0)  # so counted (2n + 1), and within it
    with pytest.raises(ValueError, match="more msgpack objects than a 0-byte bundle"):
        unpack_bounded(b"\xdd" + (1 << 16).to_bytes(4, "big") + b"\x90" * (1 << 16), 0)
    assert seen == [False, True, True]


def test_3_an_arena_larger_than_the_host_is_a_clear_error_at_load(small_bundle):
    data = path_bytes(small_bundle)
    m = manifest_of(data)
    m["arena_size"] = 1 << 40  # inside the format's limit
    with pytest.raises(svodrt.RuntimeFailure, match="more than this host's .* bytes of memory"):
        svodrt.load(repack(data, m, rebind=True))


def test_3_svodrt_info_is_bounded_too(small_bundle, tmp_path, capsys):
    from svodrt_tools.cli import main

    data = path_bytes(small_bundle)
    bomb = tmp_path / "bomb.svod"
    bomb.write_bytes(repack(data, _raw(b"\xdd" + (1 << 25).to_bytes(4, "big") + b"\x90" * (1 << 25))))
    with pytest.raises(SystemExit):
        main(["info", str(bomb)])
    assert "exceeds the limit" in capsys.readouterr().err


class _raw:
    """A manifest given as its raw msgpack bytes (repack packs anything else)."""

    def __init__(self, raw: bytes):
        self.raw = raw


def path_bytes(bundle) -> bytes:
    return bundle[0].read_bytes()


@pytest.fixture(autouse=True)
def _raw_manifests(monkeypatch):
    import msgpack

    pack = msgpack.packb
    monkeypatch.setattr(msgpack, "packb", lambda o, **kw: o.raw if isinstance(o, _raw) else pack(o, **kw))


# 4 ---------------------------------------------------------------- trust
@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    pytest.importorskip("cryptography", reason="signing needs the svod[sign] extra")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    d = tmp_path_factory.mktemp("keys")
    out = {}
    for who in ("ours", "theirs"):
        k = ed25519.Ed25519PrivateKey.generate()
        (d / f"{who}.pem").write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
        (d / f"{who}.pub").write_bytes(k.public_key().public_bytes(serialization.Encoding.PEM,
                                                                   serialization.PublicFormat.SubjectPublicKeyInfo))
        out[who] = (d / f"{who}.pem", d / f"{who}.pub")
    return out


@pytest.fixture(scope="module")
def signed(keys, small_model):
    import svodc

    model, feeds = small_model
    return {who: svodc.compile(model, sign_key=str(keys[who][0]), test_vectors=True) for who in keys}, feeds


@pytest.fixture
def no_code_mapped(monkeypatch):
    """Fails the test if native code is mapped: a refusal must come before."""
    import svodrt.memory

    def refuse(*a, **kw):
        raise AssertionError("code was mapped for an untrusted bundle")

    monkeypatch.setattr(svodrt.memory, "map_code", refuse)


def test_4_a_signed_bundle_loads_under_its_trust_policy_and_names_its_signer(signed, keys, small_bundle):
    bundles, feeds = signed
    with svodrt.load(bundles["ours"], trust=keys["ours"][1]) as m:
        assert m.signer and m.signer.startswith("ed25519:")
        assert m.weights_verified  # a policy checks every byte that will be used
        with svodrt.load(small_bundle[0]) as plain:
            assert np.array_equal(m.run(feeds)["y"], plain.run(feeds)["y"])
    with svodrt.load(bundles["ours"], trust=[keys["theirs"][1], keys["ours"][1].read_bytes()]) as m:
        assert m.signer


def test_4_unsigned_other_key_and_modified_bundles_are_refused_before_code(signed, keys, small_bundle,
                                                                         no_code_mapped):
    bundles, _ = signed
    policy = keys["ours"][1]
    with pytest.raises(svodrt.UntrustedBundleError, match="not signed"):
        svodrt.load(small_bundle[0], trust=policy)
    with pytest.raises(svodrt.UntrustedBundleError, match="a key this trust policy does not trust"):
        svodrt.load(bundles["theirs"], trust=policy)
    m = manifest_of(bundles["ours"])
    m["outputs"][0]["name"] = "z"  # a consistent forgery: bindings recomputed, signature kept
    with pytest.raises(svodrt.UntrustedBundleError, match="was modified after signing"):
        svodrt.load(repack(bundles["ours"], m, rebind=True), trust=policy)
    re_signed = manifest_of(bundles["ours"])
    re_signed["signature"]["key"] = manifest_of(bundles["theirs"])["signature"]["key"]
    with pytest.raises(svodrt.UntrustedBundleError, match="does not trust"):
        svodrt.load(repack(bundles["ours"], re_signed), trust=policy)


def test_4_verify_reports_the_signer_and_runs_nothing_untrusted(signed, keys):
    bundles, _ = signed
    text = verify(bundles["ours"], trust=[keys["ours"][1]]).text()
    assert "signed by ed25519:" in text and "test vector 0" in text and text.endswith("PASS")
    assert "no trust policy given" in verify(bundles["ours"]).text()
    report = verify(bundles["theirs"], trust=[keys["ours"][1]])
    assert not report.ok and "does not trust" in report.failures[0]
    assert "test vector" not in report.text() and "loads on" not in report.text()


def test_4_cli_trust_and_sign_flags(signed, keys, tmp_path, capsys, small_model):
    from svodrt_tools.cli import main

    bundles, feeds = signed
    theirs = tmp_path / "theirs.svod"
    theirs.write_bytes(bundles["theirs"])
    np.savez(tmp_path / "in.npz", **feeds)
    with pytest.raises(SystemExit) as e:
        main(["run", str(theirs), "-i", str(tmp_path / "in.npz"), "--trust", str(keys["ours"][1])])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.count("\n") == 1 and "does not trust" in err
    main(["run", str(theirs), "-i", str(tmp_path / "in.npz"), "--trust", str(keys["theirs"][1])])
    from svodc.cli import main as svodc_main

    src = tmp_path / "m.onnx"
    src.write_bytes(small_model[0].SerializeToString())
    svodc_main(["compile", str(src), "--sign", str(keys["ours"][0]), "-o", str(tmp_path / "s.svod"), "-q"],
               standalone_mode=False)
    main(["verify", str(tmp_path / "s.svod"), "--trust", str(keys["ours"][1])])
    assert "signed by ed25519:" in capsys.readouterr().out


# 5 ---------------------------------------------------------------- paths and inputs
def _in_thread(fn, seconds: float = 30):
    out: list = []
    t = threading.Thread(target=lambda: out.append(_outcome(fn)), daemon=True)
    t.start()
    t.join(seconds)
    assert out, "blocked"
    return out[0]


def _outcome(fn):
    try:
        return fn()
    except Exception as e:
        return e


def test_5_a_fifo_is_refused_at_once_by_load_info_and_verify(tmp_path):
    fifo = tmp_path / "model.svod"
    os.mkfifo(fifo)
    e = _in_thread(lambda: svodrt.load(fifo))
    assert isinstance(e, svodrt.BundleFormatError) and "not a regular file" in str(e)
    report = _in_thread(lambda: verify(fifo))
    assert "not a regular file" in report.failures[0]
    from svodrt_tools.describe import describe

    assert "not a regular file" in str(_in_thread(lambda: describe(fifo)))


def test_5_a_corrupt_npz_input_is_one_line(small_bundle, tmp_path, capsys):
    from svodrt_tools.cli import main

    bad = tmp_path / "in.npz"
    bad.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(SystemExit):
        main(["run", str(small_bundle[0]), "-i", str(bad)])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a readable .npy/.npz" in err


def test_5_dims_are_checked_before_strings_are_interned(monkeypatch):
    from svodrt_strings.ids import StringTable

    def refuse(*a, **kw):
        raise AssertionError("interned before the dims were checked")

    monkeypatch.setattr(StringTable, "intern", refuse)
    with svodrt.load(ARTIFACTS / "string_codes.svod") as m:
        feeds = {"color": np.full((2, 3), "red"), "other": np.array(["x"] * 2_000_000)}
        with pytest.raises(svodrt.InputError, match="input 'other' dim 0: got 2000000, expected 3"):
            m.run(feeds)


# 6 ---------------------------------------------------------------- large weights
def test_6_unchecked_weights_are_a_visible_decision(small_bundle):
    data = bytearray(path_bytes(small_bundle))
    w = parse_bundle(bytes(data)).weights
    data[w.offset + 8] ^= 0x40
    # The default checks weights up to WEIGHTS_CHECK_LIMIT at every load: a damaged byte is an error.
    assert w.length <= WEIGHTS_CHECK_LIMIT
    with pytest.raises(svodrt.BundleFormatError, match="'weights' .* fails its sha256"):
        svodrt.load(bytes(data))
    with svodrt.load(bytes(data), verify_weights=False) as m:  # skipped on request (as above the limit): says so
        assert not m.weights_verified
    with svodrt.load(path_bytes(small_bundle)) as m:
        assert m.weights_verified


# 7 ---------------------------------------------------------------- close and signals
def test_7_profile_after_close_raises_model_closed(small_bundle):
    path, feeds = small_bundle
    m = svodrt.load(path)
    m.close()
    with pytest.raises(svodrt.ModelClosedError):
        kernel_times(m, feeds)


def test_7_run_returns_only_after_every_helper_left_the_call(small_bundle):
    """A signal handler raises while a call runs: run() raises only once every helper has finished the call or
    it was taken back (svod_lead posts, runs and joins in one native call: no handler runs in between)."""
    from svodrt.abi import TEAM_POSTED, TEAM_TAKEN

    path, feeds = small_bundle
    m = _threaded(path)
    m.run(feeds)  # the helpers exist

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)  # every 0.5 ms: lands during calls and between them
        with pytest.raises(KeyboardInterrupt):
            for _ in range(10_000):
                m.run(feeds)
        signal.setitimer(signal.ITIMER_REAL, 0)
        box = m._helpers._first
        posted, taken = (ctypes.c_uint32.from_address(box + o).value for o in (TEAM_POSTED, TEAM_TAKEN))
        assert posted == taken  # no call left for a helper to take after run() returned
        np.testing.assert_array_equal(m.run(feeds)["y"], m.run(feeds)["y"])  # and the model still runs
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        m.close()
