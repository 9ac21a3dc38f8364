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

from svodc.codegen.worker import WorkerPool
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
    fixed_inputs: list[str] = field(default_factory=list)  # inputs whose values were fixed at compile time
    # (an absent optional input is "fixed" to no value: that is how a compiled model is told it is absent)
    # The "run-time inputs" mode (every present input fed at run time, nothing fixed): "" when that mode
    # gives this same result (the case compiled without fixing a value); otherwise why it did not compile.
    runtime_inputs_failure: str = ""

    @property
    def runtime_inputs_pass(self) -> bool:
        return self.status == "pass" and not self.runtime_inputs_failure


def write_frame(fd: int, obj: object) -> None:
    data = pickle.dumps(obj)
    view = memoryview(LEN.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd: int, n: int, deadline: float | None = None) -> bytes:
    """n bytes from fd; EOFError if it closes first, TimeoutError past `deadline` (time.monotonic())."""
    import select

    parts, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        b = os.read(fd, n - got)
        if not b:
            raise EOFError
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def read_frame(fd: int, deadline: float | None = None) -> object:
    size = LEN.unpack(read_exact(fd, LEN.size, deadline))[0]
    return pickle.loads(read_exact(fd, size, deadline))


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _unsupported_reason(e) -> str:
    parts = list(dict.fromkeys(f"{n.op_type}: {n.reason}" for n in e.nodes))
    return one_line("; ".join(parts))


def flatten(name: str, value) -> dict[str, np.ndarray | None]:
    """A graph input or output value as the bundle's tensors (svodc/frontend/boundary.py): a sequence
    `x` is `x[0]`, `x[1]`...; an absent optional is None."""
    if isinstance(value, list):
        return {f"{name}[{i}]": np.asarray(v) for i, v in enumerate(value)}
    return {name: None if value is None else np.asarray(value)}


def _bound_for(dim: str, model, case: Case) -> int:
    """A user's bound for computed dim OUTPUT:AXIS: twice the expected size when OUTPUT is a graph
    output, else the compiler's suggestion (an inner tensor of an expanded function)."""
    from svodc.frontend.dims import SUGGESTED_HI

    tensor, _, axis = dim.rpartition(":")
    for vi, want in zip(model.graph.output, case.outputs, strict=False):
        if vi.name == tensor and isinstance(want, np.ndarray) and axis.isdigit() and int(axis) < want.ndim:
            return max(1, 2 * want.shape[int(axis)])
    return SUGGESTED_HI


def run_case(case: Case, workers: WorkerPool) -> Result:
    """The case in the run-time inputs mode; where that does not pass, again with the values fixed that
    the compiler asks for or that decide a run-time size (the fixed-values mode)."""
    import onnx

    model = onnx.load_from_string(case.model)
    by_name: dict[str, np.ndarray | None] = {}
    for vi, v in zip(model.graph.input, case.inputs, strict=False):
        by_name.update(flatten(vi.name, v))
    fixed: dict[str, object] = {k: None for k, v in by_name.items() if v is None}  # absent optionals
    fixed.update({vi.name: [] for vi, v in zip(model.graph.input, case.inputs, strict=False)
                  if isinstance(v, list) and not v})  # empty sequences: nothing to feed, fixed as empty
    first, deciding = _attempt(case, model, by_name, dict(fixed), workers)
    deciding -= fixed.keys()
    if first.status == "pass" or not deciding:
        return first
    second, _ = _attempt(case, model, by_name, {**fixed, **{n: by_name[n] for n in deciding}}, workers)
    second.runtime_inputs_failure = one_line(f"{first.status}: {first.reason}")
    return second


def _attempt(case: Case, model, by_name: dict, fixed: dict, workers: WorkerPool) -> tuple[Result, set[str]]:
    """(the result with `fixed` compiled in and the values the compiler asks for, the graph inputs whose
    values decide a run-time size)."""
    import svodrt
    from svodc.bundle import write_bundle
    from svodc.codegen.compile import compile_program
    from svodc.errors import SvodcError, UnsupportedModelError
    from svodc.frontend.importer import import_model
    from svodc.ir.ops import Ops
    from svodc.ir.uop import toposort
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program
    from svodc.target import parse_target

    t0 = time.perf_counter()
    shapes = {k: tuple(v.shape) for k, v in by_name.items() if v is not None}
    expanded: list[str] = []
    deciding: set[str] = set()
    runtime_failure = ""  # why the run-time inputs mode (nothing fixed but absent optionals) did not compile
    try:
        # Inputs that decide shapes the compiler cannot bound (a Resize's sizes, an axis) must be known
        # to a static compiler: when it names such inputs, the run-time inputs mode has failed; fix their
        # values and compile again (the fixed-values mode).
        # Sizes that run-time values decide and nothing bounds (a Range's length) get the bound a user
        # would give (`--dim TENSOR:AXIS=0..HI`), here twice the expected size, so the run is below it.
        bounds: dict[str, tuple[int, int]] = {}
        for attempt in range(8):
            options = CompileOptions(input_shapes={k: v for k, v in shapes.items() if k not in fixed},
                                     input_values=dict(fixed), dims=dict(bounds), jobs=1)
            try:
                graph = import_model(model, options)
                break
            except UnsupportedModelError as e:
                unbounded = {d for p in e.nodes for d in p.needs_dims} - bounds.keys()
                deciding |= {n for p in e.nodes if p.needs_dims for n in p.needs_values if n in by_name}
                if unbounded and attempt < 7:
                    bounds.update({d: (0, _bound_for(d, model, case)) for d in unbounded})
                    continue
                needs = {n for p in e.nodes for n in p.needs_values if n in by_name} - fixed.keys()
                if not needs or attempt == 7:
                    raise
                runtime_failure = runtime_failure or _unsupported_reason(e)
                fixed.update({n: by_name[n] for n in needs})
                bounds.clear()  # a fixed value may make a bounded size static: bounds are asked for again
        sized = [n for n in toposort([o for _, o in graph.outputs]) if n.op is Ops.SIZED]
        deciding |= {n.arg.name for n in toposort([v for s in sized for v in s.src[1:]]) if n.op is Ops.INPUT}
        expanded = sorted(getattr(graph, "expanded_ops", ()))
        program = build_program(graph, options)
        target, = parse_target("host")
        bundle = write_bundle(program, [(target, compile_program(program, target, options, workers=workers))], "conformance")
    except UnsupportedModelError as e:
        return Result(case.name, "unsupported", _unsupported_reason(e), time.perf_counter() - t0, expanded=expanded,
                      fixed_inputs=sorted(fixed), runtime_inputs_failure=runtime_failure), deciding
    except SvodcError as e:
        return Result(case.name, "error", one_line(f"{type(e).__name__}: {e}"), time.perf_counter() - t0,
                      expanded=expanded, runtime_inputs_failure=runtime_failure), deciding
    except Exception as e:  # a compiler bug: report it as this case's failure, keep going
        return Result(case.name, "error", one_line(f"compiler bug: {type(e).__name__}: {e}"),
                      time.perf_counter() - t0, expanded=expanded, runtime_inputs_failure=runtime_failure), deciding
    t1 = time.perf_counter()
    try:
        with svodrt.load(bundle, threads=1) as m:
            got = m.run({k: v for k, v in by_name.items() if k not in fixed})
    except Exception as e:
        return Result(case.name, "error", one_line(f"runtime: {type(e).__name__}: {e}"), t1 - t0,
                      time.perf_counter() - t1, expanded, runtime_inputs_failure=runtime_failure), deciding
    t2 = time.perf_counter()
    problems = []
    for vi, want in zip(model.graph.output, case.outputs, strict=False):
        expected = flatten(vi.name, want)
        extra = [k for k in got if k.startswith(vi.name + "[") and k not in expected]
        if extra:
            problems.append(f"{vi.name}: unexpected outputs {extra}")
        for name, w in expected.items():
            if w is None:
                if name in got or f"{name}[0]" in got:
                    problems.append(f"{name}: produced, but the reference optional is empty")
            elif name not in got:
                problems.append(f"{name}: missing from the outputs")
            else:
                why = mismatch(got[name], w, case.rtol, case.atol)
                if why:
                    problems.append(f"{name}: {why}")
    status = "wrong" if problems else "pass"
    return Result(case.name, status, one_line("; ".join(problems)), t1 - t0, t2 - t1, expanded, sorted(fixed),
                  runtime_failure), deciding


def main() -> None:
    inp, out = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the protocol
    with WorkerPool(1) as workers:  # one LLVM worker for every case this process runs
        while True:
            try:
                case = read_frame(inp)
            except EOFError:
                return
            write_frame(out, run_case(case, workers))


if __name__ == "__main__":
    # Run through the package module, so results pickle as tests.conformance.worker.Result (not __main__).
    from tests.conformance.worker import main as package_main

    package_main()
