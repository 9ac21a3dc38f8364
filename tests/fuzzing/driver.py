"""Runs fuzz attempts in batches, each batch in a worker process with a time limit.

A batch of attempts shares one process (interpreter and numpy start-up are paid once per batch, not
per attempt). If the worker dies (a signal: SIGSEGV, SIGBUS, SIGILL...) or stops making progress for
`hang_s`, the attempt in flight is recorded as a crash or a hang, with its index, and the batch goes
on from the next attempt in a fresh worker. Every attempt gets exactly one outcome.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.fuzzing.worker import OK_OUTCOMES

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class FuzzResult:
    counts: collections.Counter = field(default_factory=collections.Counter)  # outcome -> attempts
    by_mutator: collections.Counter = field(default_factory=collections.Counter)  # (mutator, outcome) -> n
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    workers: int = 0

    def summary(self) -> str:
        total = sum(self.counts.values())
        lines = [f"{total} mutations in {self.seconds:.1f} s ({self.workers} worker processes): "
                 + ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))]
        mutators = sorted({m for m, _ in self.by_mutator})
        for m in mutators:
            lines.append(f"  {m:<15} " + ", ".join(f"{o} {n}" for (mm, o), n in sorted(self.by_mutator.items())
                                                    if mm == m))
        lines += [f"  FAILURE {f}" for f in self.failures[:50]]
        return "\n".join(lines)


def _run_batch(args: list[str], out: Path, hang_s: float) -> tuple[int | None, bool]:
    """(exit code or None if killed for hanging, hung)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(out, "wb") as f, open(out.with_suffix(".err"), "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tests.fuzzing.worker", *args], stdout=f, stderr=err,
                                cwd=ROOT, env=env, start_new_session=True)
        size, changed = -1, time.monotonic()
        while proc.poll() is None:
            time.sleep(0.05)
            now_size = out.stat().st_size
            if now_size != size:
                size, changed = now_size, time.monotonic()
            elif time.monotonic() - changed > hang_s:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return None, True
        return proc.returncode, False


def run_fuzz(bundles: list[Path], inputs: Path, count: int, seed: int, batch: int = 500,
             hang_s: float = 30.0, load_s: float = 0.0) -> FuzzResult:
    """load_s: the most seconds one load may take (0: no limit; make test judges nothing by wall time)."""
    result = FuzzResult()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="svod-fuzz-") as tmp:
        work = Path(tmp)
        i = 0
        while i < count:
            n = min(batch, count - i)
            out = work / f"batch{i}.txt"
            rc, hung = _run_batch([str(seed), str(i), str(n), str(work), str(inputs), str(load_s),
                                   *map(str, bundles)], out, hang_s)
            result.workers += 1
            started, done = None, set()
            for line in out.read_text(errors="replace").splitlines():
                parts = line.split(" ", 4)
                if parts[0] == "start":
                    started = int(parts[1])
                elif parts[0] == "done":
                    idx, outcome, mutator = int(parts[1]), parts[2], parts[3]
                    done.add(idx)
                    result.counts[outcome] += 1
                    result.by_mutator[mutator, outcome] += 1
                    if outcome not in OK_OUTCOMES:
                        result.failures.append(f"attempt {idx} (seed {seed}): {outcome}: {parts[4]}")
            if started is not None and started not in done:  # the worker died or hung in this attempt
                outcome = "hang" if hung else "crash"
                why = "no progress" if hung else (f"killed by {signal.Signals(-rc).name}" if rc and rc < 0
                                                  else f"exit status {rc}")
                result.counts[outcome] += 1
                result.by_mutator["?", outcome] += 1
                result.failures.append(f"attempt {started} (seed {seed}): {outcome}: {why}; replay with "
                                       f"python -m tests.fuzzing --seed {seed} --only {started}")
                i = started + 1
            elif len(done) == n and rc == 0:
                i += n
            else:
                err = out.with_suffix(".err").read_text(errors="replace").strip()[-2000:]
                raise RuntimeError(f"fuzz worker failed outside any attempt (exit {rc}): {err}")
    result.seconds = time.monotonic() - t0
    return result
