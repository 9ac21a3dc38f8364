"""A conformance worker process: reads cases from stdin, compiles and runs each, answers with a result.

Run as `python -m tests.conformance.worker` by runner.py. Protocol: length-prefixed pickles; the
parent sends a Case, the worker answers a Result; repeat until stdin closes. Native crashes kill
only this process (the runner notices and starts another).
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from tests.conformance.cases import Case
from tests.conformance.compare import mismatch

LEN = struct.Struct("<Q")


@dataclass
class Result:
    name: str
    status: str  # pass | wrong | unsupported | error | crash | timeout | out of scope
    reason: str = ""
    compile_s: float = 0.0
    run_s: float = 0.0
    expanded: list[str] = field(default_factory=list)  # ops expanded through their ONNX function bodies


def write_frame(fd: int, obj: object) -> None:
    data = pickle.dumps(obj)
    view = memoryview(LEN.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd: int, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        b = os.read(fd, n - got)
        if not b:
            raise EOFError
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def read_frame(fd: int) -> object:
    size = LEN.unpack(read_exact(fd, LEN.size))[0]
    return pickle.loads(read_exact(fd, size))


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _unsupported_reason(e) -> str:
    parts = list(dict.fromkeys(f"{n.op_type}: {n.reason}" for n in e.nodes))
    return one_line("; ".join(parts))


def feeds_for(model, values: list, declared) -> dict[str, np.ndarray]:
    """The case's input values by name, converted to the storage type the bundle declares."""
    by_type = {t.name: t for t in declared}
    feeds = {}
    for vi, v in zip(model.graph.input, values, strict=False):
        x = np.asarray(v)
        t = by_type.get(vi.name)
        if t is not None and x.dtype != np.dtype(t.dtype) and x.dtype.itemsize == np.dtype(t.dtype).itemsize:
            x = x.view(t.dtype)  # bfloat16/float8 etc. travel as their storage integers
        feeds[vi.name] = x
    return feeds


def run_case(case: Case) -> Result:
    import onnx

    import svodrt
    from svodc.bundle import write_bundle
    from svodc.codegen.compile import compile_program
    from svodc.errors import SvodcError, UnsupportedModelError
    from svodc.frontend.importer import import_model
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program
    from svodc.target import parse_target

    model = onnx.load_from_string(case.model)
    t0 = time.perf_counter()
    shapes = {vi.name: tuple(np.shape(v)) for vi, v in zip(model.graph.input, case.inputs, strict=False)
              if isinstance(v, np.ndarray)}
    options = CompileOptions(input_shapes=shapes, jobs=1)
    expanded: list[str] = []
    try:
        graph = import_model(model, options)
        expanded = sorted(getattr(graph, "expanded_ops", ()))
        program = build_program(graph, options)
        target, = parse_target("host")
        bundle = write_bundle(program, [(target, compile_program(program, target, options))], "conformance")
    except UnsupportedModelError as e:
        return Result(case.name, "unsupported", _unsupported_reason(e), time.perf_counter() - t0, expanded=expanded)
    except SvodcError as e:
        return Result(case.name, "error", one_line(f"{type(e).__name__}: {e}"), time.perf_counter() - t0,
                      expanded=expanded)
    except Exception as e:  # a compiler bug: report it as this case's failure, keep going
        return Result(case.name, "error", one_line(f"compiler bug: {type(e).__name__}: {e}"),
                      time.perf_counter() - t0, expanded=expanded)
    t1 = time.perf_counter()
    try:
        with svodrt.load(bundle, threads=1) as m:
            got = m.run(feeds_for(model, case.inputs, m.inputs))
    except Exception as e:
        return Result(case.name, "error", one_line(f"runtime: {type(e).__name__}: {e}"), t1 - t0,
                      time.perf_counter() - t1, expanded)
    t2 = time.perf_counter()
    problems = []
    for vi, want in zip(model.graph.output, case.outputs, strict=False):
        if vi.name not in got:
            problems.append(f"{vi.name}: missing from the outputs")
            continue
        why = mismatch(got[vi.name], want, case.rtol, case.atol)
        if why:
            problems.append(f"{vi.name}: {why}")
    status = "wrong" if problems else "pass"
    return Result(case.name, status, one_line("; ".join(problems)), t1 - t0, t2 - t1, expanded)


def main() -> None:
    inp, out = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the protocol
    while True:
        try:
            case = read_frame(inp)
        except EOFError:
            return
        write_frame(out, run_case(case))


if __name__ == "__main__":
    # Run through the package module, so results pickle as tests.conformance.worker.Result (not __main__).
    from tests.conformance.worker import main as package_main

    package_main()
