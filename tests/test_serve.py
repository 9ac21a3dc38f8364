"""`svodrt serve` (svodrt_serve/, docs/serving.md) as a subprocess on 127.0.0.1, driven by clients that are
not ours: tritonclient's HTTP client for REST, MLServer's gRPC stubs for gRPC. Two bundles (small_cnn,
and a versioned int64/bool model); outputs must equal svodrt.load(...).run(...) bit for bit."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import itertools
import json
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

mlserver = pytest.importorskip("mlserver", reason="needs the serve extra: pip install -e '.[serve]'")
tritonhttp = pytest.importorskip("tritonclient.http", reason="needs tritonclient[http] (the dev extra)")

import grpc  # noqa: E402  (after the skips: both come with the serve extra)
from mlserver.grpc import dataplane_pb2 as pb  # noqa: E402
from mlserver.grpc.dataplane_pb2_grpc import GRPCInferenceServiceStub  # noqa: E402
from onnx import helper  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

import svodc  # noqa: E402
import svodrt  # noqa: E402
from tests.bundle_tools import with_wrong_test_vector  # noqa: E402
from tests.onnx_util import make_model, small_cnn  # noqa: E402
from tests.serve_util import ROOT, start_server  # noqa: E402

V2 = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(bool): "BOOL"}
CONTENTS = {"FP32": "fp32_contents", "INT64": "int64_contents"}


def adder_model():
    """int64 a, b [2, 3] -> sum (int64), greater (bool)."""
    nodes = [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Greater", ["a", "b"], ["greater"])]
    model = make_model(nodes, {"a": (np.int64, [2, 3]), "b": (np.int64, [2, 3])}, ["sum", "greater"])
    r = np.random.default_rng(3)
    return model, {"a": r.integers(-1000, 1000, (2, 3)), "b": r.integers(-1000, 1000, (2, 3))}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A folder of bundles: cnn.svod, and adder in version folder 1; each one's feeds and svodrt outputs."""
    root = tmp_path_factory.mktemp("serve-repo")
    (root / "adder" / "1").mkdir(parents=True)
    cases = {}
    for name, (model, feeds), path in [("cnn", small_cnn(), root / "cnn.svod"),
                                       ("adder", adder_model(), root / "adder" / "1" / "model.svod")]:
        svodc.compile_to_file(model, path)
        with svodrt.load(path) as m:
            cases[name] = (feeds, m.run(feeds))
    return root, cases


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    s = start_server(repo[0], tmp_path_factory.mktemp("serve-log") / "server.log", "--threads", "1")
    try:
        s.wait_ready()
        yield s
    finally:
        assert s.stop() == 0, s.log.read_text()[-3000:]


def version(name: str) -> str:
    return "1" if name == "adder" else ""


def rest_infer(address: str, name: str, feeds: dict, binary: bool) -> dict[str, np.ndarray]:
    client = tritonhttp.InferenceServerClient(address)
    inputs = []
    for k, v in feeds.items():
        i = tritonhttp.InferInput(k, list(v.shape), V2[v.dtype])
        i.set_data_from_numpy(v, binary_data=binary)
        inputs.append(i)
    meta = client.get_model_metadata(name, version(name))
    outputs = [tritonhttp.InferRequestedOutput(o["name"], binary_data=binary) for o in meta["outputs"]]
    result = client.infer(name, inputs, model_version=version(name), outputs=outputs)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def assert_bitwise(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        assert got[k].tobytes() == w.tobytes(), k


def test_health_and_metadata_rest(server):
    client = tritonhttp.InferenceServerClient(server.http)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("cnn") and client.is_model_ready("adder", "1")
    assert client.get_server_metadata()["name"] == "svodrt"
    cnn = client.get_model_metadata("cnn")
    assert cnn["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [2, 3, 8, 8]}]
    assert cnn["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2, 10]}]
    adder = client.get_model_metadata("adder", "1")
    assert [(t["name"], t["datatype"], t["shape"]) for t in adder["inputs"]] == [("a", "INT64", [2, 3]),
                                                                                ("b", "INT64", [2, 3])]
    assert {t["name"]: t["datatype"] for t in adder["outputs"]} == {"sum": "INT64", "greater": "BOOL"}


def test_health_and_metadata_grpc(server):
    with grpc.insecure_channel(server.grpc) as channel:
        stub = GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
        assert stub.ModelReady(pb.ModelReadyRequest(name="adder", version="1"), timeout=10).ready
        assert stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=10).name == "svodrt"
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="cnn"), timeout=10)
        assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("x", "FP32", [2, 3, 8, 8])]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("name", ["cnn", "adder"])
def test_infer_rest(server, repo, name, binary):
    feeds, want = repo[1][name]
    assert_bitwise(rest_infer(server.http, name, feeds, binary), want)


def grpc_infer(address: str, name: str, feeds: dict, raw: bool) -> dict[str, np.ndarray]:
    request = pb.ModelInferRequest(model_name=name, model_version=version(name))
    for k, v in feeds.items():
        t = request.inputs.add(name=k, datatype=V2[v.dtype], shape=list(v.shape))
        if raw:
            request.raw_input_contents.append(v.tobytes())
        else:
            getattr(t.contents, CONTENTS[t.datatype]).extend(v.reshape(-1).tolist())
    with grpc.insecure_channel(address) as channel:
        response = GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    dtypes = {v: k for k, v in V2.items()}
    return {o.name: np.frombuffer(blob, dtypes[o.datatype]).reshape(list(o.shape))
            for o, blob in zip(response.outputs, response.raw_output_contents, strict=True)}


@pytest.mark.parametrize("raw", [False, True], ids=["contents", "raw"])
@pytest.mark.parametrize("name", ["cnn", "adder"])
def test_infer_grpc(server, repo, name, raw):
    feeds, want = repo[1][name]
    assert_bitwise(grpc_infer(server.grpc, name, feeds, raw), want)


def post(server, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def cnn_request(x: np.ndarray, **override) -> dict:
    inp = {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.reshape(-1).tolist(), **override}
    return {"inputs": [inp]}


def bad_requests(x: np.ndarray) -> dict[str, tuple[bytes, dict, list[str]]]:
    """case -> (body, headers, what the error message must name)."""
    raw = x.tobytes()
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3, 8, 8],
                                   "parameters": {"binary_data_size": len(raw)}}]}).encode()
    truncated = head + raw[: len(raw) - 100]
    return {
        "wrong_name": (json.dumps(cnn_request(x, name="z")).encode(), {}, ["'z'", "x: FP32 [2, 3, 8, 8]"]),
        "wrong_datatype": (json.dumps(cnn_request(x, datatype="FP64")).encode(), {},
                           ["'x'", "FP64", "FP32 [2, 3, 8, 8]"]),
        "wrong_shape": (json.dumps(cnn_request(x.reshape(2, 3, 4, 16), shape=[2, 3, 4, 16])).encode(), {},
                        ["'x'", "[2, 3, 4, 16]", "FP32 [2, 3, 8, 8]"]),
        "malformed_json": (b'{"inputs": [{"name": "x", "datatype": "FP32", ', {}, ["malformed JSON"]),
        "truncated_binary": (truncated, {"Inference-Header-Content-Length": str(len(head))},
                             ["'x'", f"{len(raw) - 100} bytes", str(len(raw)), "FP32 [2, 3, 8, 8]"]),
    }


@pytest.mark.parametrize("case", ["wrong_name", "wrong_datatype", "wrong_shape", "malformed_json", "truncated_binary"])
def test_bad_request_then_good_one(server, repo, case):
    feeds, want = repo[1]["cnn"]
    body, headers, named = bad_requests(feeds["x"])[case]
    status, reply = post(server, "/v2/models/cnn/infer", body, headers)
    assert status == 400, reply
    for part in named:
        assert part in reply["error"], (part, reply)
    assert_bitwise(rest_infer(server.http, "cnn", feeds, binary=True), want)


def test_body_of_100_mb(server, repo):
    """Refused on its Content-Length, before the server reads it."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.putrequest("POST", "/v2/models/cnn/infer")
        conn.putheader("Content-Length", str(100 << 20))
        conn.endheaders(b"{" + b" " * (1 << 20))
        r = conn.getresponse()
        status, reply = r.status, json.loads(r.read())
    finally:
        conn.close()
    assert status == 413 and "over the server's limit" in reply["error"]
    feeds, want = repo[1]["cnn"]
    assert_bitwise(rest_infer(server.http, "cnn", feeds, binary=False), want)


def test_gzip_body_inflating_past_the_limit(server, repo):
    bomb = gzip.compress(b" " * (100 << 20), compresslevel=9)  # ~100 KB on the wire
    status, reply = post(server, "/v2/models/cnn/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and "after gzip decompression" in reply["error"]
    feeds, want = repo[1]["cnn"]
    assert_bitwise(rest_infer(server.http, "cnn", feeds, binary=False), want)


def test_bad_request_grpc_then_good_one(server, repo):
    feeds, want = repo[1]["cnn"]
    with pytest.raises(grpc.RpcError) as e:
        grpc_infer(server.grpc, "cnn", {"x": feeds["x"].reshape(3, 2, 8, 8)}, raw=True)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "[3, 2, 8, 8]" in e.value.details()
    assert_bitwise(grpc_infer(server.grpc, "cnn", feeds, raw=True), want)


def slow_model(n: int = 768, layers: int = 12):
    """A chain of n x n MatMuls: ~0.3 s a request on one thread, so a SIGTERM finds requests running."""
    names = ["x"] + [f"h{i}" for i in range(layers - 1)] + ["y"]
    nodes = [helper.make_node("MatMul", [a, "w"], [b]) for a, b in itertools.pairwise(names)]
    r = np.random.default_rng(0)
    w = (r.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    return make_model(nodes, {"x": (np.float32, [n, n])}, ["y"], {"w": w}), r.standard_normal((n, n)).astype(np.float32)


def test_sigterm_finishes_running_requests_and_exits_0(tmp_path):
    model, x = slow_model()
    svodc.compile_to_file(model, tmp_path / "slow.svod")
    with svodrt.load(tmp_path / "slow.svod", threads=1) as m:
        want = m.run({"x": x})
    server = start_server(tmp_path / "slow.svod", tmp_path / "server.log", "--threads", "1", "--no-verify")
    server.wait_ready()
    results: list[tuple[float, float, object]] = []  # (start, end, outputs or the exception)
    lock = threading.Lock()

    def client() -> None:
        for _ in range(30):  # bounded: stops at the first refusal
            t0 = time.monotonic()
            try:
                outcome: object = rest_infer(server.http, "slow", {"x": x}, binary=True)
            except Exception as e:
                outcome = e
            with lock:
                results.append((t0, time.monotonic(), outcome))
            if isinstance(outcome, Exception):
                return

    threads = [threading.Thread(target=client) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum(isinstance(r[2], dict) for r in results) < 3:
        time.sleep(0.02)
    t_term = time.monotonic()
    rc = server.stop()
    for t in threads:
        t.join(60)
    assert rc == 0, server.log.read_text()[-3000:]
    answered = [r for r in results if isinstance(r[2], dict)]
    http_errors = [r[2] for r in results if isinstance(r[2], InferenceServerException) and r[2].status()]
    assert not http_errors, http_errors  # refused connections only: no request was answered with an error
    for _, _, got in answered:
        assert_bitwise(got, want)
    assert any(t0 < t_term < t1 for t0, t1, _ in answered), "no request was running at SIGTERM and completed"


def test_serve_without_the_extra_names_it(tmp_path):
    code = "import sys; sys.modules['mlserver'] = None; from svodrt_tools.cli import main; main(['serve', '.'])"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "pip install 'svod[serve]'" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_never_ready_when_a_test_vector_fails_unless_no_verify(small_bundle, tmp_path):
    (tmp_path / "tampered.svod").write_bytes(with_wrong_test_vector(small_bundle[0].read_bytes()))
    server = start_server(tmp_path / "tampered.svod", tmp_path / "verify.log")
    ready_seen = False
    try:
        deadline = time.monotonic() + 120
        while server.proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                ready_seen |= server.get("/v2/health/ready") == 200
            time.sleep(0.05)
    finally:
        rc = server.stop()
    log = server.log.read_text()
    assert rc == 1 and not ready_seen, log[-3000:]
    assert "failed verification: test vector 0" in log.splitlines()[-1], log[-3000:]
    unchecked = start_server(tmp_path / "tampered.svod", tmp_path / "no-verify.log", "--no-verify")
    try:
        unchecked.wait_ready()
    finally:
        assert unchecked.stop() == 0


def test_port_in_use_is_one_line_and_exit_1(repo, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = start_server(repo[0] / "cnn.svod", tmp_path / "busy.log", "--http-port", str(port))
        rc = server.proc.wait(120)
    last = server.log.read_text().strip().splitlines()[-1]
    assert rc == 1 and last.startswith("svodrt: error:") and f"HTTP cannot listen on 127.0.0.1:{port}" in last, last


def test_trust_policy_refuses_an_unsigned_bundle(repo, tmp_path):
    serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization", reason="svod[sign]")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate().public_key()
    (tmp_path / "pub.pem").write_bytes(key.public_bytes(serialization.Encoding.PEM,
                                                        serialization.PublicFormat.SubjectPublicKeyInfo))
    server = start_server(repo[0] / "cnn.svod", tmp_path / "trust.log", "--trust", str(tmp_path / "pub.pem"))
    rc = server.proc.wait(120)
    last = server.log.read_text().strip().splitlines()[-1]
    assert rc == 1 and "the bundle is not signed" in last, last
