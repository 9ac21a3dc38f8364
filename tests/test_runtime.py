"""svodrt: loading, running, input validation, format errors, variant selection, memory protection,
isolation from the compiler, threads."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest

import svodrt
from tests.onnx_util import reference


def test_run_matches_onnxruntime(small_model, small_bundle):
    model, feeds = small_model
    path, _ = small_bundle
    want = reference(model, feeds)[0]
    with svodrt.load(path, threads=1) as m:
        assert [t.name for t in m.inputs] == ["x"] and m.outputs[0].shape == (2, 10)
        np.testing.assert_allclose(m.run(feeds)["y"], want, rtol=1e-5, atol=1e-6)
    with svodrt.load(path.read_bytes(), threads=2) as m:  # from bytes, two threads
        np.testing.assert_allclose(m.run(feeds)["y"], want, rtol=1e-5, atol=1e-6)


def _corrupt(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value):]


def test_format_errors_name_what_is_wrong(small_bundle):
    data = small_bundle[0].read_bytes()
    with pytest.raises(svodrt.BundleFormatError, match="bad magic"):
        svodrt.load(_corrupt(data, 0, b"XXXX"))
    with pytest.raises(svodrt.BundleFormatError, match="truncated"):
        svodrt.load(data[:-10])
    with pytest.raises(svodrt.BundleVersionError, match="format 2.0 is newer"):
        svodrt.load(_corrupt(data, 8, struct.pack("<HH", 2, 0)))
    manifest_offset = struct.unpack_from("<Q", data, 32)[0]
    with pytest.raises(svodrt.BundleFormatError, match="manifest"):
        svodrt.load(_corrupt(data, manifest_offset + 5, bytes([data[manifest_offset + 5] ^ 0x40])))
    code = svodrt.load(data).variant.section.offset
    with pytest.raises(svodrt.BundleFormatError, match="code.x86_64.* fails its sha256"):
        svodrt.load(_corrupt(data, code + 3, bytes([data[code + 3] ^ 1])))


MAPS = r"""
import sys, numpy as np, svodrt
m = svodrt.load(sys.argv[1], threads=2)
m.run(dict(np.load(sys.argv[2])))
code = m._code.address
maps = [line.split() for line in open("/proc/self/maps")]
mine = [mp for mp in maps if int(mp[0].split("-")[0], 16) <= code < int(mp[0].split("-")[1], 16)]
assert mine and mine[0][1] == "r-xp", mine
wx = [mp for mp in maps if "w" in mp[1] and "x" in mp[1]]
assert not wx, wx
print("ok")
"""


def test_code_is_mapped_read_execute_and_nothing_is_writable_and_executable(small_bundle, tmp_path):
    # In a process of its own: the compiler's process has libffi closures (via llvmlite) that are
    # rwx; the runtime's process must have none.
    path, feeds = small_bundle
    np.savez(tmp_path / "in.npz", **feeds)
    out = subprocess.run([sys.executable, "-c", MAPS, str(path), str(tmp_path / "in.npz")], capture_output=True,
                         text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


ISOLATED = r"""
import sys, importlib.abc
BLOCKED = {"llvmlite", "onnx", "click", "svodc", "onnxruntime"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, Block())
import numpy as np, svodrt
m = svodrt.load(sys.argv[1], threads=1)
feeds = dict(np.load(sys.argv[2]))
want = np.load(sys.argv[3])["y"]
got = m.run(feeds)["y"]
assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (got, want)
loaded = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED)
assert not loaded, loaded
print("ok")
"""


def test_runtime_runs_without_the_compiler(small_model, small_bundle, tmp_path):
    model, feeds = small_model
    path, _ = small_bundle
    np.savez(tmp_path / "in.npz", **feeds)
    np.savez(tmp_path / "want.npz", y=reference(model, feeds)[0])
    script = tmp_path / "isolated.py"
    script.write_text(ISOLATED)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(svodrt.__file__))}
    out = subprocess.run([sys.executable, "-I", str(script), str(path), str(tmp_path / "in.npz"),
                          str(tmp_path / "want.npz")], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# Modules a bare `import svodrt` must not import (issue 13: imports are most of a cold start): each is imported
# where it is used. Those numpy imported already are hidden first, so that importing them again shows here too.
LAZY = {"dataclasses", "inspect", "pathlib", "platform", "urllib", "ipaddress", "threading", "concurrent", "mmap",
        "bisect", "hashlib", "msgpack", "zstandard", "cryptography", "ml_dtypes", "svodrt_gpu", "svodrt_strings",
        "svodrt_session", "svodrt_trust", "svodrt.memory"}
BARE_IMPORT = r"""
import importlib.abc, sys
import numpy
LAZY = set(sys.argv[1].split(","))
for name in [n for n in sys.modules if n in LAZY or n.split(".")[0] in LAZY]:
    del sys.modules[name]
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in LAZY or name.split(".")[0] in LAZY:
            raise ImportError(f"`import svodrt` imported {name}")
        return None
sys.meta_path.insert(0, Refuse())
import svodrt
print("ok")
"""


def test_a_bare_import_imports_only_what_every_program_needs():
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(svodrt.__file__))}
    out = subprocess.run([sys.executable, "-c", BARE_IMPORT, ",".join(sorted(LAZY))], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-800:]


BESIDE = ("svodrt_gpu", "svodrt_strings", "svodrt_session", "svodrt_trust")  # what svodrt imports only when used


def test_runtime_imports_only_its_dependencies():
    """svodrt, its tools (svodrt_tools: the CLI, info, verify), its GPU executor (svodrt_gpu), its string
    program (svodrt_strings), its onnxruntime-style API (svodrt_session) and its signature checks (svodrt_trust) import
    the runtime's dependencies only, at module level and inside functions alike; optional extras only inside functions
    (when used). svodrt imports svodrt_gpu only inside load(), when a GPU device is asked for, svodrt_strings only for
    a bundle with string steps, svodrt_session when svodrt.InferenceSession is first named, and svodrt_trust for a
    signed bundle or a trust policy."""
    import ast

    import svodrt_gpu
    import svodrt_session
    import svodrt_strings
    import svodrt_tools
    import svodrt_trust

    allowed = {"numpy", "msgpack", "zstandard", "svodrt", "svodrt_tools", "svodrt_gpu", "svodrt_strings",
               "svodrt_session", "svodrt_trust", "__future__"}
    allowed |= sys.stdlib_module_names
    optional = {"cryptography", "ml_dtypes", "svodrt_serve"}  # svod[sign], svod[dtypes]; svod[serve]'s `svodrt serve`
    roots = [os.path.dirname(m.__file__)
             for m in (svodrt, svodrt_tools, svodrt_gpu, svodrt_strings, svodrt_session, svodrt_trust)]
    seen_lazy = set()
    for root, name in ((r, n) for r in roots for n in os.listdir(r) if n.endswith(".py")):
        with open(os.path.join(root, name)) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for top in (n.split(".")[0] for n in names):
                    lazy = node.col_offset > 0  # inside a function (or a block): runs only when reached
                    # launch.py's svodc() is the `svodc` console script: it imports the compiler only after
                    # checking that the compiler extra is installed
                    compiler_entry = name == "launch.py" and top == "svodc" and lazy
                    assert top in allowed or (top in optional and lazy) or compiler_entry, (name, node.lineno, top)
                    assert not (root == roots[0] and top in BESIDE and not lazy), (name, node.lineno)
                    seen_lazy |= {top} if lazy else set()
    assert {"cryptography", "threading", *BESIDE} <= seen_lazy  # the scan sees indented imports


def test_concurrent_runs_on_one_model_agree(small_bundle):
    path, feeds = small_bundle
    with svodrt.load(path, threads=2) as m:
        want = m.run(feeds)["y"]
        m._solo_runs, m._parallel = 2, True  # past the solo timing: one caller at a time gets the helper
        bad = []

        def worker():
            for _ in range(25):
                if not np.array_equal(m.run(feeds)["y"], want):
                    bad.append(1)

        ts = [threading.Thread(target=worker) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not bad and len(m._helpers._threads) == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("svodrt-")]  # close() stopped it


def test_code_fixups_are_relocated_checked_and_the_image_made_read_execute():
    import ctypes
    import hashlib

    from svodrt.memory import map_code

    image = bytearray(64)
    image[8:16] = (40).to_bytes(8, "little")  # a word holding an image offset: the loader adds the base
    image[16:24] = (64).to_bytes(8, "little")  # one past the end is a valid C pointer too
    m = map_code(bytes(image), (8, 16), hashlib.sha256(image).digest(), "test image")
    try:
        assert ctypes.c_uint64.from_address(m.address + 8).value == m.address + 40
        assert ctypes.c_uint64.from_address(m.address + 16).value == m.address + 64
        with open("/proc/self/maps") as f:
            perms = [ln.split()[1] for ln in f if int(ln.split("-")[0], 16) == m.address]
        assert perms == ["r-xp"]
    finally:
        m.close()
    image[24:32] = (65).to_bytes(8, "little")
    with pytest.raises(svodrt.BundleFormatError, match="fixup at offset 24 holds 65, not an offset inside"):
        map_code(bytes(image), (24,), hashlib.sha256(image).digest(), "test image")
    with pytest.raises(svodrt.BundleFormatError, match="test image fails its sha256"):
        map_code(bytes(image), (), bytes(32), "test image")


RUNTIME_BUDGET = 2_000  # lines in svodrt/*.py (`wc -l`): ../shared/DESIGN.md, issue 11's acceptance
# The count today: 1,989 after issue 11 moved the GPU executor to svodrt_gpu/, + 32 for format 1.7's computed
# dims, + 90 for format 1.8's string program, - 103 moving the string program to svodrt_strings/, - 13 paid back by
# 1.7's code, + 2 for GPU launches with bounded dims, - 27 by issue 13's import time (records as NamedTuples): within
# the budget; + 2 for issue 13's per-call path (cheaper buffer addresses, no join of a helper that never started,
# one lock for the call count and the arena); + 24 for issue 13's load: the weights' record (+ 36), test vectors
# read by verify alone (- 22), C-level checks of int lists (+ 10), buffers' end offsets kept (+ 1); - 5 by issue
# 13's threads: a helper woken on a taken CPU moves off it (+ 16), Model.profile moved to svodrt_tools (- 20); + 5
# for format 1.10's team, helpers that wait in native code: svodrt/team.py (+ 90), its ABI, checks and options
# (+ 37), the model's side with the thread pool for older code gone and an exit hook (- 17), made room for by moving
# the strings at the edge to svodrt_strings/ (ids.py, edge.py: - 100), which a numeric model never imports, and a
# dict on one line (- 5); + 0 for issue 13's load: the plan's checks recorded once per file version and deferred
# to first use (+ 33), paid for by moving the vocabulary's and zipmaps' parsing to svodrt_strings (- 33); - 35 with
# issue 13's load: large weights mapped under a read lease instead of copied (memory.py FileWeights + 101, bundle.py
# + 18), paid for by moving what only some loads need beside the core: a GPU variant's launches and cubin, read by the
# GPU executor (svodrt_gpu/plan.py: - 46), and onnxruntime's API, a front door that svodrt names and imports when it
# is first named (svodrt_session/: - 118, + 10 for the name); + 26 for the lease's review: a break pending while the
# lock is taken, a registry the handler reads without it changing, weights lost (not copied) once the file changed,
# the file systems whose writers all break leases, a failed load lets go at once; - 51 with issue 13's load: the plan
# left packed in the manifest where a record stood for its checks, code read straight into its mapping, and the call
# into svodrt_trust (+ 33), paid for by moving signature checks (the svod[sign] extra) beside the core: svodrt_trust/
# (- 78), and a GPU section's image read by the GPU executor (- 6); + 15 for issue 13's load floor: padding left to
# the plan's record, small weights copied rather than leased, the feature index cached, records read with os.read.
RUNTIME_LINES_NOW = 1_961


def _runtime_lines() -> int:
    root = os.path.dirname(svodrt.__file__)
    return sum(open(os.path.join(root, n), "rb").read().count(b"\n") for n in os.listdir(root) if n.endswith(".py"))


def test_runtime_does_not_grow_unannounced():
    assert _runtime_lines() <= RUNTIME_LINES_NOW, "svodrt grew: raise RUNTIME_LINES_NOW by what was added"


def test_runtime_stays_within_its_line_budget():
    assert _runtime_lines() <= RUNTIME_LINES_NOW <= RUNTIME_BUDGET


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and at least two CPUs this process may run on")
def test_a_helper_on_a_taken_cpu_moves_off_it_and_gives_its_mask_back():
    """move_off: a helper woken on the caller's CPU goes on on a free CPU of its mask (sched_setaffinity migrates
    before it returns) and keeps its mask; without sched_getcpu, or where the sandbox denies the calls, it stays."""
    import ctypes

    from svodrt.team import move_off

    getcpu, mask = ctypes.CDLL(None).sched_getcpu, os.sched_getaffinity(0)

    def one() -> None:
        was = getcpu()
        move_off(getcpu, {was})
        moved.append(getcpu() != was)
        assert os.sched_getaffinity(0) == mask

    moved: list[bool] = []
    for _ in range(5):
        t = threading.Thread(target=one)
        t.start()
        t.join()
    assert len(moved) == 5 and any(moved)  # the scheduler may move a thread back before the look, so not every time
    move_off(None, {getcpu()})  # no sched_getcpu: nothing happens
    real, os.sched_getaffinity = os.sched_getaffinity, _denied  # a sandbox that denies it: nothing either
    try:
        move_off(getcpu, {getcpu()})
    finally:
        os.sched_getaffinity = real
    assert os.sched_getaffinity(0) == mask


def _denied(pid: int) -> set[int]:
    raise PermissionError(1, "Operation not permitted")


def test_read_only_inputs_are_run_from_their_own_memory(small_bundle):
    path, feeds = small_bundle
    x = feeds["x"].copy()
    x.flags.writeable = False  # its address comes another way (svodrt/model.py _address)
    with svodrt.load(path, threads=1) as m:
        np.testing.assert_array_equal(m.run({"x": x})["y"], m.run(feeds)["y"])
