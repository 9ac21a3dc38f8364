"""A compile worker: `python -m svodc.codegen.worker` reads pickled LLVMJobs from stdin and writes
one length-prefixed pickled result per job to stdout, as each finishes: ("ok", object, asm) or
("error", message). If LLVM aborts the process, the parent knows which job was running.

A fresh interpreter (not fork, not multiprocessing's spawn, which re-imports the caller's main
script) keeps this independent of how the compiler was invoked."""

from __future__ import annotations

import pickle
import struct
import sys


def main() -> None:
    from svodc.codegen.compile import compile_llvm
    from svodc.errors import SvodcError

    jobs = pickle.load(sys.stdin.buffer)
    out = sys.stdout.buffer
    for job in jobs:
        try:
            obj, asm = compile_llvm(job)
            msg = pickle.dumps(("ok", obj, asm))
        except SvodcError as e:
            msg = pickle.dumps(("error", str(e)))
        out.write(struct.pack("<Q", len(msg)) + msg)
        out.flush()


if __name__ == "__main__":
    main()
