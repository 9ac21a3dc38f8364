"""Compile workers: separate Python processes that run LLVM, so an LLVM abort kills a worker, not
the compiler.

Protocol over the worker's stdin/stdout: the parent sends a length-prefixed pickled LLVMJob; the
worker answers with a length-prefixed pickled ("ok", object, asm) or ("error", message); repeat
until stdin closes. Workers are fresh interpreters (`python -m svodc.codegen.worker`), never forks
of the caller and never multiprocessing's spawn (which re-runs the caller's main script).

A WorkerPool is a context manager owned by its caller: `svodc.compile` opens one per call and uses
it for every variant of the bundle; a caller that compiles many models (the conformance suite, a
test session) opens one and passes it to each call, so they do not pay for interpreter and LLVM
start-up each time. Workers start on first use, up to the pool's size, or all at once on `prestart`
(svodc.compile calls it once the model is imported, so their interpreter and LLVM start-up overlaps
the Python passes); leaving the `with` block stops them. A worker that dies is replaced, and the job
it was running fails with a CodegenError that names it.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import pickle
import queue
import struct
import subprocess
import sys
import tempfile
import threading
from typing import Any

_LEN = struct.Struct("<Q")


def _send(stream, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(_LEN.pack(len(data)) + data)
    stream.flush()


def _recv(stream) -> Any:
    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError
    size = _LEN.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


class _Worker:
    def __init__(self) -> None:
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115  (lives as long as the worker)
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, "-m", "svodc.codegen.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, env=env)

    def call(self, job: Any) -> Any:
        _send(self.proc.stdin, job)
        return _recv(self.proc.stdout)

    def last_error(self) -> str:
        self.stderr.seek(0)
        lines = self.stderr.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else "no message"

    def hang_up(self) -> None:
        """Close its stdin: the worker exits (close() then waits for it)."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()

    def close(self) -> None:
        try:
            self.hang_up()
            self.proc.wait(timeout=5)
        except Exception:
            self.proc.kill()
        self.stderr.close()


class WorkerPool:
    """Up to `size` LLVM worker processes; `with WorkerPool(n) as pool: pool.run(jobs, on_crash)`."""

    def __init__(self, size: int):
        self.size = max(1, size)
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._count = 0
        self._lock = threading.Lock()

    def _take(self) -> _Worker:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if self._count < self.size:
                self._count += 1
                return _Worker()
        return self._idle.get()

    def prestart(self) -> None:
        """Start the missing workers now (without waiting for them); they wait idle for jobs."""
        with self._lock:
            while self._count < self.size:
                self._count += 1
                self._idle.put(_Worker())

    def run(self, jobs: list[Any], on_crash, on_done=None, cost=None) -> list[Any]:
        """Run jobs on the pool; results in job order. on_crash(job, message) -> exception to raise;
        on_done(done, total) after each job, called by one thread at a time. cost(job): an estimate of
        its time; the costliest start first, so the workers do not wait at the end on one big job
        started last (the order of the results, and so the bytes, never depend on it)."""
        stream = JobStream(self, on_crash, on_done)
        stream.submit_all([(job, cost(job) if cost else 0.0) for job in jobs])
        return stream.results()

    def close(self) -> None:
        """Stop the idle workers (all of them once no run() is in progress): all are told first, so
        they exit at the same time, then each is waited for."""
        stopping = []
        while True:
            try:
                stopping.append(self._idle.get_nowait())
            except queue.Empty:
                break
        for w in stopping:
            w.hang_up()
        for w in stopping:
            w.close()
            with self._lock:
                self._count -= 1

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class JobStream:
    """Jobs submitted while earlier ones run (codegen/compile.py KernelStream: a module as soon as the passes
    have lowered its kernels); results() closes it and gives the results in submission order. At most `limit`
    jobs run at once (set_limit: one while the passes hold the other core, then the pool's size). Of the jobs
    waiting, the costliest starts first. on_done(done, total) is called once the total is known: at results()
    for the jobs done before, then after each job; one call at a time."""

    def __init__(self, pool: WorkerPool, on_crash, on_done=None, limit: int | None = None):
        self._pool, self._on_crash, self._on_done = pool, on_crash, on_done
        self._cv = threading.Condition()
        self._jobs: list[Any] = []
        self._results: list[Any] = []
        self._waiting: list[tuple[float, int]] = []  # heap of (-cost, submission index)
        self._limit = limit or pool.size
        self._active = self._done = 0
        self._closed = False
        self._errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []

    def submit(self, job: Any, cost: float = 0.0) -> None:
        self.submit_all([(job, cost)])

    def submit_all(self, jobs: list[tuple[Any, float]]) -> None:
        """(job, cost) pairs, queued together: the costliest of them starts first."""
        with self._cv:
            for job, cost in jobs:
                heapq.heappush(self._waiting, (-cost, len(self._jobs)))
                self._jobs.append(job)
                self._results.append(None)
            while len(self._threads) < min(self._pool.size, len(self._jobs)):  # a drainer per job, up to the size
                t = threading.Thread(target=self._drain, daemon=True)
                self._threads.append(t)
                t.start()
            self._cv.notify_all()

    def set_limit(self, limit: int) -> None:
        with self._cv:
            self._limit = max(1, limit)
            self._cv.notify_all()

    def _next(self) -> int | None:
        """The next job to run (None: nothing more for this thread)."""
        with self._cv:
            while not self._errors and not (self._waiting and self._active < self._limit):
                if self._closed and not self._waiting:
                    return None
                self._cv.wait()
            if self._errors:
                return None
            self._active += 1
            return heapq.heappop(self._waiting)[1]

    def _drain(self) -> None:
        while (i := self._next()) is not None:
            w = self._pool._take()
            try:
                reply = w.call(self._jobs[i])
            except (EOFError, BrokenPipeError, OSError):
                msg = w.last_error()
                w.close()
                with self._pool._lock:
                    self._pool._count -= 1
                with self._cv:
                    self._errors.append(self._on_crash(self._jobs[i], msg))
                    self._active -= 1
                    self._cv.notify_all()
                return
            self._pool._idle.put(w)
            with self._cv:
                self._results[i] = reply
                self._active -= 1
                self._done += 1
                if self._closed and self._on_done is not None:
                    self._on_done(self._done, len(self._jobs))
                self._cv.notify_all()

    def results(self, on_done=None) -> list[Any]:
        """Close the stream and wait: the results in submission order. on_done: as the constructor's."""
        with self._cv:
            self._on_done = on_done or self._on_done
            self._closed = True
            self._limit = max(self._limit, self._pool.size)
            if self._on_done is not None:
                for d in range(1, self._done + 1):
                    self._on_done(d, len(self._jobs))
            self._cv.notify_all()
        for t in self._threads:
            t.join()
        if self._errors:
            raise self._errors[0]
        return self._results

    def cancel(self) -> None:
        """Drop the jobs not started and wait for those running (their results are not wanted)."""
        with self._cv:
            self._waiting.clear()
            self._closed = True
            self._on_done = None
            self._cv.notify_all()
        for t in self._threads:
            t.join()


def borrow(workers: WorkerPool | None, size: int) -> contextlib.AbstractContextManager[WorkerPool]:
    """The caller's pool (left running), or a pool of `size` workers for this call only."""
    return contextlib.nullcontext(workers) if workers is not None else WorkerPool(size)


def main() -> None:
    from svodc.codegen.llvm_job import compile_llvm, llvm_init  # llvmlite alone: see llvm_job's docstring
    from svodc.errors import SvodcError

    llvm_init()  # before the first job arrives: a prestarted worker is ready when it does

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but protocol frames on the real stdout
    while True:
        try:
            job = _recv(inp)
        except EOFError:
            # every reply is flushed: skip the interpreter's teardown (LLVM's and numpy's), which the
            # compiler would wait for
            sys.stderr.flush()
            os._exit(0)
        try:
            obj, asm = compile_llvm(job)
            _send(out, ("ok", obj, asm))
        except SvodcError as e:
            _send(out, ("error", str(e)))


if __name__ == "__main__":
    main()
