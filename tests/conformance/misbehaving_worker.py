"""A stand-in conformance worker for the runner's own tests: it speaks the worker protocol and passes
every case, except that a case named "segfault..." kills the process with SIGSEGV (as a native crash
would) and a case named "hang..." never answers."""

from __future__ import annotations

import os
import signal
import sys
import time


def main() -> None:
    from tests.conformance.worker import Result, read_frame, write_frame

    inp, out = sys.stdin.fileno(), sys.stdout.fileno()
    while True:
        try:
            case = read_frame(inp)
        except EOFError:
            return
        if case.name.startswith("segfault"):
            os.kill(os.getpid(), signal.SIGSEGV)
        if case.name.startswith("hang"):
            time.sleep(3600)
        write_frame(out, Result(case.name, "pass", f"pid {os.getpid()}"))


if __name__ == "__main__":
    main()
