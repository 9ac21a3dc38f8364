"""Fat bundles: the runtime picks the first variant the host can run, and refuses (never SIGILL) a
bundle with none, listing what is missing. Hosts are passed explicitly (svodrt.load(host=...))."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import svodc
import svodrt
from svodrt.features import X86_64_LEVELS
from svodrt.host import Host
from tests.bundle_tools import manifest_of, repack

BIN = os.path.dirname(sys.executable)
V4_ONLY = ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")


def level(name: str) -> Host:
    return Host("x86_64", frozenset(X86_64_LEVELS[name]))


@pytest.fixture(scope="module")
def v4_bundle(small_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("v4") / "v4.svod"
    path.write_bytes(svodc.compile(small_model[0], target="x86_64-linux-gnu:x86-64-v4"))
    return path


@pytest.mark.parametrize("host_level,chosen", [
    ("x86-64-v4", "x86-64-v4"), ("x86-64-v3", "x86-64-v3"), ("x86-64-v2", "x86-64"), ("x86-64", "x86-64"),
])
def test_first_runnable_variant_is_chosen(fat_bundle, host_level, chosen):
    path, feeds = fat_bundle
    host = level(host_level)
    if not host.features <= svodrt.detect_host().features:
        pytest.skip(f"this machine cannot execute {host_level} code")
    with svodrt.load(path, host=host, threads=1) as m, svodrt.load(path, variant=2, threads=1) as baseline:
        assert m.variant.cpu == chosen
        np.testing.assert_allclose(m.run(feeds)["y"], baseline.run(feeds)["y"], rtol=1e-5, atol=1e-6)


def test_a_bundle_with_no_runnable_variant_is_refused_with_missing_features(v4_bundle):
    with pytest.raises(svodrt.UnsupportedHostError) as e:
        svodrt.load(v4_bundle, host=level("x86-64-v3"))
    msg = str(e.value)
    assert f"x86_64:x86-64-v4 (missing {', '.join(V4_ONLY)})" in msg and "--target x86_64-linux-gnu:x86-64" in msg
    with pytest.raises(svodrt.UnsupportedHostError, match=r"x86_64:x86-64-v4 \(architecture x86_64\)"):
        svodrt.load(v4_bundle, host=Host("aarch64", frozenset()))


def test_refusal_through_the_cli(v4_bundle, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 3, 8, 8), np.float32))
    for args in (["run", str(v4_bundle), "-i", f"x={tmp_path / 'x.npy'}"], ["verify", str(v4_bundle)]):
        r = subprocess.run([os.path.join(BIN, "svodrt"), *args, "--as-cpu", "x86-64-v3"], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and all(f in err[0] for f in V4_ONLY), r.stderr


def test_a_feature_unknown_to_this_runtime_is_refused(small_bundle):
    data = small_bundle[0].read_bytes()
    m = manifest_of(data)
    m["variants"][0]["features"].append("avx1024")  # from a newer compiler's table; binding recomputed
    with pytest.raises(svodrt.UnsupportedHostError, match=r"missing avx1024; avx1024 unknown to this runtime"):
        svodrt.load(repack(data, m, rebind=True))


def test_forced_variant_and_host_limits(fat_bundle):
    path, _ = fat_bundle
    with svodrt.load(path, variant=2) as m:
        assert m.variant.cpu == "x86-64"
    with pytest.raises(svodrt.UnsupportedHostError, match=r"variant 0 does not run .*missing avx"):
        svodrt.load(path, variant=0, host=level("x86-64-v2"))
    with pytest.raises(ValueError, match="variant 3 does not exist"):
        svodrt.load(path, variant=3)
    small = Host("x86_64", frozenset({"avx2", "sse3"}))
    assert small.limited_to("x86-64-v4").features == small.features  # limiting never adds features
    assert small.limited_to("x86-64").features == frozenset()
    with pytest.raises(ValueError, match="cannot limit"):
        small.limited_to("pentium")
