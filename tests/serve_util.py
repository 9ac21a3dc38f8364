"""`svodrt serve` as a subprocess for tests and bench/serve.py: free ports, start, wait until ready, stop."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 180.0  # loading includes `svodrt verify`; the test machine may be shared and slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    http_port: int
    grpc_port: int
    log: Path

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.http}{path}", timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"svodrt serve exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                if self.get("/v2/health/ready") == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"svodrt serve not ready after {timeout} s: {self.log.read_text()[-2000:]}")

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout)


def start_server(path: Path, log: Path, *args: str) -> Server:
    """`svodrt serve PATH` on 127.0.0.1 and free ports (metrics off); returns once the process runs."""
    http_port, grpc_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "svodrt_tools.cli", "serve", str(path), "--host", "127.0.0.1",
           "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", "0", *args]
    out = open(log, "wb")  # noqa: SIM115 -- the child writes to it until it exits
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    return Server(proc, http_port, grpc_port, log)
