"""Runs cases in worker subprocesses, a few at a time, each case with a time limit.

Each slot keeps one worker process (`python -m tests.conformance.worker`, its own process group so
its compile workers go with it) and feeds it cases one after another, so interpreter, onnx and LLVM
start-up are paid once per worker, not per case. A worker that dies marks the case it was running
as a crash (with the signal) and the slot starts a new worker; a case over its time limit is a
timeout and its worker is killed the same way. Every case gets exactly one result.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.conformance.cases import Case
from tests.conformance.worker import Result, one_line, read_frame, write_frame

ROOT = Path(__file__).resolve().parents[2]


WORKER_MODULE = "tests.conformance.worker"


class CaseWorker:
    def __init__(self, module: str = WORKER_MODULE) -> None:
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115  (lives as long as the worker)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, "-m", module], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     start_new_session=True)

    def run(self, case: Case, timeout: float) -> Result:
        t0 = time.monotonic()
        try:
            write_frame(self.proc.stdin.fileno(), case)
            return read_frame(self.proc.stdout.fileno(), t0 + timeout)
        except TimeoutError:
            self.kill()
            return Result(case.name, "timeout", f"timeout: no result within {timeout:.0f} s", time.monotonic() - t0)
        except (EOFError, BrokenPipeError, OSError):
            code = self.proc.wait()
            why = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            return Result(case.name, "crash", one_line(f"crash: worker {why}; {self.last_error()}"),
                          time.monotonic() - t0)

    def last_error(self) -> str:
        self.stderr.seek(0)
        lines = self.stderr.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else "no message"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
        self.stderr.close()


def run_cases(cases: list[Case], workers: int = 2, timeout: float = 60.0,
              progress: Callable[[Result], None] | None = None, worker_module: str = WORKER_MODULE) -> list[Result]:
    """One result per case, in the order of `cases`. Out-of-scope cases are not run. worker_module is the
    worker program (tests substitute one that crashes and hangs on purpose)."""
    results: dict[str, Result] = {}
    todo: queue.Queue[Case] = queue.Queue()
    for c in cases:
        if c.out_of_scope:
            results[c.name] = Result(c.name, "out of scope", c.out_of_scope)
        else:
            todo.put(c)
    lock = threading.Lock()

    def slot() -> None:
        worker: CaseWorker | None = None
        try:
            while True:
                try:
                    case = todo.get_nowait()
                except queue.Empty:
                    return
                worker = worker or CaseWorker(worker_module)
                try:
                    r = worker.run(case, timeout)
                except Exception as e:  # a harness bug must not lose the case: record it and go on
                    r = Result(case.name, "error", one_line(f"harness: {type(e).__name__}: {e}"))
                    worker.kill()
                if r.status in ("crash", "timeout") or worker.proc.poll() is not None:
                    worker.close()
                    worker = None
                with lock:
                    results[case.name] = r
                if progress:
                    progress(r)
        finally:
            if worker is not None:
                worker.close()

    threads = [threading.Thread(target=slot) for _ in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[c.name] for c in cases]
