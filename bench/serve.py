"""make bench-serve: `svodrt serve` under load, next to the same bundle run in-process.

Per model (squeezenet with random weights; gpt2_small_random at seq 32) and transport (REST with binary
tensors via tritonclient, gRPC raw tensors via MLServer's stubs): CLIENTS client processes send
REQUESTS requests each, as fast as answers come; every answer is checked bit for bit against
svodrt.load(...).run(...), and anything else counts as an error. Reported: throughput, p50 and p99
latency; the in-process run rate (as many runs of the bundle, loaded as the server loads it, called in
a loop), half just before and half just after each served pass; their ratio (the server's overhead);
the server's RSS after the first 100 requests and after the run. Writes docs/serving-bench.md. A
benchmark, not a test: it asserts nothing about time; it exits non-zero on an error or an RSS growth
over 5 %."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.models import load  # noqa: E402
from bench.run import machine  # noqa: E402
from tests.serve_util import start_server  # noqa: E402

GPT2_SEQ = 32
RSS_TOLERANCE = 0.05


def compile_models(folder: Path, names: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """Bundles into folder (one per model, named by file); returns each model's feeds."""
    import svodc
    from svodc.options import CompileOptions

    feeds = {}
    for name in names:
        m = load(name)
        if name == "gpt2_small_random":
            feeds[name] = {"input_ids": m.feeds["input_ids"][:, :GPT2_SEQ]}
            options = CompileOptions(dims={"batch": 1, "seq": GPT2_SEQ})
        else:
            feeds[name] = m.svod_feeds
            options = CompileOptions(input_shapes={k: v.shape for k, v in m.svod_feeds.items()})
        t0 = time.perf_counter()
        svodc.compile_to_file(m.model, folder / f"{name}.svod", options=options)
        print(f"compiled {name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return feeds


def in_process(path: Path, feeds: dict, runs: int) -> tuple[list[float], float, dict[str, np.ndarray]]:
    """`runs` runs, one after another, of the bundle loaded as the server loads it (its threads: all
    cores): (latencies, wall seconds, outputs). One caller: the bundle's plain run rate."""
    import svodrt

    with svodrt.load(path) as m:
        want = m.run(feeds)
        for _ in range(5):
            m.run(feeds)

        lat = []
        t0 = time.perf_counter()
        for _ in range(runs):
            t1 = time.perf_counter()
            m.run(feeds)
            lat.append(time.perf_counter() - t1)
        wall = time.perf_counter() - t0
    return lat, wall, want


def bracketed(path: Path, feeds: dict, runs: int, served):
    """The in-process runs, half just before and half just after served() (so both see about the same
    machine): ({rate, p50, p99} of the in-process runs, served()'s result, outputs)."""
    lat1, wall1, want = in_process(path, feeds, runs // 2)
    result = served(want)
    lat2, wall2, _ = in_process(path, feeds, runs - runs // 2)
    lat = np.array(lat1 + lat2)
    return {"rate": lat.size / (wall1 + wall2), "p50": float(np.median(lat)), "p99": float(np.percentile(lat, 99))}, \
        result


_shared: dict = {}  # in a client process: the start barrier and the answered-requests counter


def client_init(barrier, done) -> None:
    _shared.update(barrier=barrier, done=done)  # synchronization objects reach a process only this way


def client_worker(transport: str, address: str, name: str, feeds_path: str, want_path: str,
                  requests: int) -> tuple[list[float], int, str]:
    """One client process: `requests` requests, each answer compared with the expected outputs."""
    barrier, done = _shared["barrier"], _shared["done"]
    with np.load(feeds_path) as z:
        feeds = {k: z[k] for k in z.files}
    with np.load(want_path) as z:
        want = {k: z[k] for k in z.files}
    try:
        infer = rest_client(address, name, feeds) if transport == "rest" else grpc_client(address, name, feeds)
        infer()  # connect and warm up outside the timed part
    except BaseException:
        barrier.abort()  # the parent stops waiting and reports this process's exception
        raise
    barrier.wait()
    lat, errors, first = [], 0, ""
    for _ in range(requests):
        t0 = time.perf_counter()
        try:
            got = infer()
            ok = set(got) == set(want) and all(got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes()
                                                for k in want)
            if not ok:
                raise ValueError("outputs differ from svodrt's in-process run")
        except Exception as e:
            errors += 1
            first = first or f"{type(e).__name__}: {e}"[:200]
        lat.append(time.perf_counter() - t0)
        with done.get_lock():
            done.value += 1
    return lat, errors, first


def rest_client(address: str, name: str, feeds: dict):
    import tritonclient.http as th

    client = th.InferenceServerClient(address, connection_timeout=120, network_timeout=120)
    inputs = []
    for k, v in feeds.items():
        i = th.InferInput(k, list(v.shape), {"float32": "FP32", "int64": "INT64"}[v.dtype.name])
        i.set_data_from_numpy(v, binary_data=True)
        inputs.append(i)
    outputs = [th.InferRequestedOutput(o["name"], binary_data=True) for o in client.get_model_metadata(name)["outputs"]]

    def infer() -> dict[str, np.ndarray]:
        r = client.infer(name, inputs, outputs=outputs)
        return {o.name(): r.as_numpy(o.name()) for o in outputs}

    return infer


def grpc_client(address: str, name: str, feeds: dict):
    import grpc
    from mlserver.grpc import dataplane_pb2 as pb
    from mlserver.grpc.dataplane_pb2_grpc import GRPCInferenceServiceStub

    limit = 256 << 20
    channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", limit)])
    stub = GRPCInferenceServiceStub(channel)
    request = pb.ModelInferRequest(model_name=name)
    for k, v in feeds.items():
        request.inputs.add(name=k, datatype={"float32": "FP32", "int64": "INT64"}[v.dtype.name], shape=list(v.shape))
        request.raw_input_contents.append(v.tobytes())
    dtypes = {"FP32": np.float32, "INT64": np.int64}

    def infer() -> dict[str, np.ndarray]:
        r = stub.ModelInfer(request, timeout=120)
        return {o.name: np.frombuffer(b, dtypes[o.datatype]).reshape(list(o.shape))
                for o, b in zip(r.outputs, r.raw_output_contents, strict=True)}

    return infer


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no VmRSS for process {pid}")


def load_test(server, transport: str, name: str, feeds_path: Path, want_path: Path, clients: int,
              requests: int) -> dict:
    ctx = mp.get_context("spawn")  # grpc does not survive fork
    barrier, done = ctx.Barrier(clients + 1), ctx.Value("i", 0)
    address = server.http if transport == "rest" else server.grpc
    rss_100: list[int] = []

    def watch() -> None:  # the RSS once 100 requests are answered
        while done.value < 100 and not stop.is_set():
            time.sleep(0.01)
        rss_100.append(rss_bytes(server.proc.pid))

    stop = threading.Event()
    with ctx.Pool(clients, initializer=client_init, initargs=(barrier, done)) as pool:
        jobs = [pool.apply_async(client_worker, (transport, address, name, str(feeds_path), str(want_path), requests))
                for _ in range(clients)]
        try:
            barrier.wait(timeout=600)
        except threading.BrokenBarrierError:
            for j in jobs:
                j.get(timeout=60)  # raises the client's own error
            raise
        t0 = time.perf_counter()
        watcher = threading.Thread(target=watch)
        watcher.start()
        results = [j.get(timeout=3600) for j in jobs]
        wall = time.perf_counter() - t0
        stop.set()
        watcher.join()
    rss_end = rss_bytes(server.proc.pid)
    lat = np.concatenate([np.array(r[0]) for r in results])
    return {"rate": lat.size / wall, "p50": float(np.median(lat)), "p99": float(np.percentile(lat, 99)),
            "errors": sum(r[1] for r in results), "first_error": next((r[2] for r in results if r[2]), ""),
            "rss_100": rss_100[0], "rss_end": rss_end, "requests": int(lat.size)}


def cpu_model() -> str:
    """The CPU as /proc/cpuinfo names it, with family and model (a cloud CPU's name alone is vague)."""
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return f"{fields.get('model name', '?')} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"


def report(rows: list[dict], clients: int, requests: int, info: dict) -> str:
    lines = [
        "# `svodrt serve` under load (make bench-serve)",
        "",
        f"Machine: {cpu_model()}, {info['cores']} vCPUs, Python {info['python']}, {info['date']}. "
        "**Shared and noisy** (other jobs ran on the same 2 cores during the run): the numbers show the shape, "
        "not a quiet machine's best.",
        "",
        f"{clients} client processes x {requests} requests per model and transport, on the same machine as the "
        "server (clients and server share the cores). Every answer is compared bit for bit with "
        "`svodrt.load(...).run(...)`. In-process: the same bundle and number of runs, `run()` called in a loop "
        "by one caller, half just before and half just after each "
        "served pass (the server idle). "
        "Overhead = in-process rate / served rate. "
        f"RSS: the server process after the first 100 requests and after the run (limit +{RSS_TOLERANCE:.0%}). "
        f"Served p50/p99 include the wait behind the other {clients - 1} clients' requests ({clients} in flight, "
        f"{os.cpu_count()} cores).",
        "",
        "| model | transport | requests | errors | req/s | p50 ms | p99 ms | in-process req/s | in-process p50 ms "
        "| overhead | RSS after 100 | RSS after run | RSS change |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, p = r["served"], r["local"]
        change = (s["rss_end"] - s["rss_100"]) / s["rss_100"]
        mib = f"{s['rss_100'] / 2**20:.1f} MiB | {s['rss_end'] / 2**20:.1f} MiB"
        lines.append(f"| {r['model']} | {r['transport']} | {s['requests']} | {s['errors']} | {s['rate']:.1f} | "
                     f"{1e3 * s['p50']:.2f} | {1e3 * s['p99']:.2f} | {p['rate']:.1f} | {1e3 * p['p50']:.2f} | "
                     f"{p['rate'] / s['rate']:.2f}x | {mib} | "
                     f"{change:+.1%} |")
    errors = [f"- {r['model']} {r['transport']}: {r['served']['first_error']}" for r in rows if r["served"]["errors"]]
    return "\n".join(lines + ([""] + ["First errors:"] + errors if errors else []) + [""])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=250)
    p.add_argument("--transports", default="rest,grpc")
    p.add_argument("--models", default="squeezenet,gpt2_small_random")
    p.add_argument("-o", "--output", default=str(ROOT / "docs" / "serving-bench.md"))
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="svod-bench-serve-") as tmp:
        folder = Path(tmp) / "models"
        folder.mkdir()
        all_feeds = compile_models(folder, args.models.split(","))
        server = start_server(folder, Path(tmp) / "server.log")
        try:
            server.wait_ready()
            for name, feeds in all_feeds.items():
                for transport in args.transports.split(","):
                    def served(want, name=name, feeds=feeds, transport=transport):
                        np.savez(Path(tmp) / f"{name}-feeds.npz", **feeds)
                        np.savez(Path(tmp) / f"{name}-want.npz", **want)
                        return load_test(server, transport, name, Path(tmp) / f"{name}-feeds.npz",
                                         Path(tmp) / f"{name}-want.npz", args.clients, args.requests)

                    local, result = bracketed(folder / f"{name}.svod", feeds, args.clients * args.requests, served)
                    rows.append({"model": name, "transport": transport, "served": result, "local": local})
                    print(f"{name} {transport}: served {result['rate']:.1f} req/s ({result['errors']} errors), "
                          f"in-process {local['rate']:.1f} req/s", file=sys.stderr)
        finally:
            rc = server.stop()
        text = report(rows, args.clients, args.requests, machine())
    out = Path(args.output)
    tmp_out = out.with_suffix(".tmp")
    tmp_out.write_text(text)
    os.replace(tmp_out, out)
    print(text)
    bad = [r for r in rows if r["served"]["errors"] or
           r["served"]["rss_end"] > (1 + RSS_TOLERANCE) * r["served"]["rss_100"]]
    if bad or rc != 0:
        sys.exit(f"bench-serve: {len(bad)} run(s) with errors or RSS growth over {RSS_TOLERANCE:.0%}; server exit {rc}")


if __name__ == "__main__":
    main()
