"""Issue 13's load: weights of 64 KiB or more are mapped from the bundle file under a read lease (svodrt/memory.py
FileWeights) instead of copied, and a loaded model still never sees the file change (docs/architecture.md "Stable
bytes"): a writer, a truncate, a rewrite while a forked child runs it. Where no lease can be had the bytes are copied.
Each writer here is another process, as a deployment's `cp` is; the lease holds it until this process's handler has
moved a private copy under the mapping."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import svodc
import svodrt
from svodrt import memory
from svodrt.memory import FileWeights

WRITER_TIMEOUT_S = 30  # a hang guard below the kernel's 45 s lease-break-time, after which the writer goes on anyway


def _mlp(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), "w")  # 256 KiB
    b = numpy_helper.from_array(rng.standard_normal(256).astype(np.float32), "b")
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"])], "mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Two bundles of the same shapes and other weights, the input, and each one's output."""
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    bundles = [svodc.compile(_mlp(seed)) for seed in (1, 2)]
    outs = [svodrt.load(b).run({"x": x})["y"] for b in bundles]
    assert not np.allclose(outs[0], outs[1])
    return bundles, x, outs


@pytest.fixture
def loaded(versions, tmp_path):
    bundles, x, outs = versions
    path = tmp_path / "m.svod"
    path.write_bytes(bundles[0])
    with svodrt.load(path) as m:
        yield m, path, x, outs


def _write(path, data: bytes = b"") -> None:
    """Another process opens the file to write (O_TRUNC, as cp does) and writes data."""
    code = "import sys; f = open(sys.argv[1], 'wb'); f.write(sys.stdin.buffer.read()); f.close()"
    subprocess.run([sys.executable, "-c", code, str(path)], input=data, check=True, timeout=WRITER_TIMEOUT_S)


def test_large_weights_are_mapped_under_a_lease(loaded):
    m, _, x, outs = loaded
    assert isinstance(m._weights, FileWeights) and m._weights.fd is not None
    assert np.array_equal(m.run({"x": x})["y"], outs[0])


def test_a_bundle_copied_over_a_loaded_one_changes_nothing_loaded(loaded, versions):
    m, path, x, outs = loaded
    _write(path, versions[0][1])  # returns once this process let go: the lease held the writer until then
    assert m._weights.fd is None, "the lease was let go with a private copy under the mapping"
    assert np.array_equal(m.run({"x": x})["y"], outs[0])
    with svodrt.load(path) as new:
        assert np.array_equal(new.run({"x": x})["y"], outs[1])


def test_a_truncated_bundle_is_no_sigbus(loaded):
    m, path, x, outs = loaded
    _write(path)
    assert os.path.getsize(path) == 0
    assert np.array_equal(m.run({"x": x})["y"], outs[0])


def test_a_forked_child_holds_its_own_lease(loaded, versions):
    """The child's mapping is the parent's; the file rewritten after the fork changes neither's outputs."""
    m, path, x, outs = loaded
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait (in a read the lease's signal interrupts), then run and report
        try:
            os.read(go_r, 1)
            os.write(out_w, m.run({"x": x})["y"].tobytes())
        finally:
            os._exit(0)
    _write(path, versions[0][1])
    os.write(go_w, b"g")
    got = b""
    while chunk := os.read(out_r, 1 << 16):
        got += chunk
        if len(got) == outs[0].nbytes:
            break
    assert os.waitpid(pid, 0)[1] == 0
    assert np.array_equal(np.frombuffer(got, np.float32).reshape(outs[0].shape), outs[0])
    assert np.array_equal(m.run({"x": x})["y"], outs[0])


def test_a_file_open_for_writing_elsewhere_is_copied(versions, tmp_path):
    bundles, x, outs = versions
    path = tmp_path / "m.svod"
    path.write_bytes(bundles[0])
    with open(path, "r+b"), svodrt.load(path) as m:  # a writer holds it open: no lease can be had
        assert not isinstance(m._weights, FileWeights)
        assert np.array_equal(m.run({"x": x})["y"], outs[0])


def test_a_first_load_off_the_main_thread_copies(versions, tmp_path):
    """The SIGIO handler can be installed on the main thread only: until one load there did, loads copy."""
    path = tmp_path / "m.svod"
    path.write_bytes(versions[0][0])
    code = """
import sys, threading
import svodrt
from svodrt.memory import FileWeights
kinds = []
t = threading.Thread(target=lambda: kinds.append(type(svodrt.load(sys.argv[1])._weights)))
t.start(); t.join()
kinds.append(type(svodrt.load(sys.argv[1])._weights))
t = threading.Thread(target=lambda: kinds.append(type(svodrt.load(sys.argv[1])._weights)))
t.start(); t.join()
print([k is FileWeights for k in kinds])
"""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(svodrt.__file__))}
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "[False, True, True]", out.stderr[-800:]


def test_damaged_mapped_weights_are_refused_and_the_lease_let_go(versions, tmp_path):
    from svodrt.bundle import parse_bundle

    data = bytearray(versions[0][0])
    w = parse_bundle(bytes(data)).weights
    data[w.offset + 100] ^= 0x40
    path = tmp_path / "m.svod"
    path.write_bytes(bytes(data))
    with pytest.raises(svodrt.BundleFormatError, match="fails its sha256"):
        svodrt.load(path, verify_weights=True)
    gc.collect()
    assert not any(getattr(r(), "fd", None) is not None and r().size == w.length for r in memory._LEASED)


def test_a_handler_that_was_there_before_is_still_called(loaded, versions):
    """Ours replaced it at the first mapped load; it chains to it, so a program's own SIGIO use keeps working."""
    m, path, x, outs = loaded
    calls = []
    previous = memory._PREVIOUS[0]
    memory._PREVIOUS[0] = lambda signum, frame: calls.append(signum)
    try:
        _write(path, versions[0][1])
    finally:
        memory._PREVIOUS[0] = previous
    assert calls and m._weights.fd is None
    assert np.array_equal(m.run({"x": x})["y"], outs[0])


def test_a_break_signalled_while_another_caller_holds_the_lock_is_followed_by_it(loaded):
    """The handler finds the lock taken (here by a thread settling, as a load off the main thread does): it leaves
    the break pending, and that thread detaches once it lets go; the writer is not held for the kernel's 45 s."""
    m, path, x, outs = loaded
    w, writers = m._weights, []

    class SlowToLetGo:  # the settling thread's first release waits until a break came while it held the lock
        def __init__(self, inner):
            self.inner, self.acquire, self.first = inner, inner.acquire, True

        def release(self):
            if self.first:
                self.first = False
                code = "import sys; open(sys.argv[1], 'r+b').close()"  # opens to write: breaks the lease
                writers.append(subprocess.Popen([sys.executable, "-c", code, str(path)]))
                while not w.pending:  # set by the handler, on the main thread, which found the lock taken
                    time.sleep(0.01)
            self.inner.release()

    lock, w.lock = w.lock, SlowToLetGo(w.lock)
    try:
        settling = threading.Thread(target=w.settle, kwargs={"blocking": True})
        settling.start()
        while settling.is_alive():  # the main thread runs bytecode: the handler runs within 10 ms of the signal
            time.sleep(0.01)
        assert writers[0].wait(timeout=WRITER_TIMEOUT_S) == 0
    finally:
        w.lock = lock
    assert w.fd is None and np.array_equal(m.run({"x": x})["y"], outs[0])


def test_weights_whose_file_changed_before_their_copy_are_lost_not_read(loaded):
    """Past the kernel's wait (a main thread held in native code) the file may already be other bytes or shorter:
    detach copies nothing from it and the model refuses to run instead of reading them."""
    m, path, x, _ = loaded
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # no open: no break, but the file's identity moved
    with m._weights.lock:
        m._weights.detach()  # what the handler does once the lease breaks
    assert m._weights.fd is None
    with pytest.raises(svodrt.RuntimeFailure, match="weights of this model are lost: its file was rewritten"):
        m.run({"x": x})


def test_a_load_that_fails_after_mapping_lets_the_lease_go_at_once(versions, tmp_path, monkeypatch):
    """Not when the traceback (which holds the half-made model) is dropped: a writer is not held meanwhile."""
    path = tmp_path / "m.svod"
    path.write_bytes(versions[0][0])

    def no_arena(*args):
        raise MemoryError("no arena")

    monkeypatch.setattr("svodrt.model.aligned_empty", no_arena)
    with pytest.raises(MemoryError) as failed:
        svodrt.load(path)
    assert failed.value and not [r for r in memory._LEASED if getattr(r(), "fd", None) is not None]


def test_a_file_system_not_known_to_break_leases_for_every_writer_is_copied(versions, tmp_path, monkeypatch):
    """NFS, FUSE, virtiofs: a writer on another machine (or the host) breaks no lease here, so nothing is mapped."""
    bundles, x, outs = versions
    path = tmp_path / "m.svod"
    path.write_bytes(bundles[0])
    monkeypatch.setattr(memory, "LEASE_FILE_SYSTEMS", frozenset())
    with svodrt.load(path) as m:
        assert not isinstance(m._weights, FileWeights)
        assert np.array_equal(m.run({"x": x})["y"], outs[0])
