"""Self-test vectors: a reference input and the outputs the model should give for it, embedded in the
bundle so `svodrt verify` can check the compiled code on the machine that will serve it.

Where the expected outputs come from: svodc's numpy interpreter (svodc/ir/interpret.py) on the graph
as imported, before our own rewrites. Not from running the compiled code on the build machine:
 - it is independent of everything between import and machine code (folding, decomposition,
   scheduling, lowering, LLVM, the linker), so a vector that passes on the device says the bundle
   computes the model there, not merely that the device agrees with the build machine;
 - it works for every target, including cross-compiled ones the build machine cannot run, and it
   is one reference for all variants of a fat bundle (which legitimately differ in rounding:
   FMA, vector widths), hence a tolerance per output rather than bit equality;
 - it interprets CONV and MATMUL as einsum/matmul, not the decomposed multiply-reduce over windows,
   which would materialize window x kernel products (hundreds of MB for a ResNet stem).

The reference input is drawn from a fixed seed, so the same model gives the same bundle bytes.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from threadpoolctl import threadpool_limits

from svodc.errors import TestVectorError
from svodc.ir.dtypes import DType, dtypes, to_storage
from svodc.ir.interpret import EvaluationTimeout, evaluate
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp, toposort
from svodc.program import Buffer, ImportedGraph, Program
from svodrt.format import FLOAT_FORMATS

# Vectors are embedded by default when the inputs and outputs together take at most this many bytes.
DEFAULT_LIMIT = 1 << 20
# The reference interpreter's budget (over_budget, evaluate's deadline): past it the vectors are skipped
# with a warning (an error under --test-vectors), never a hang or an out-of-memory compiler.
EVAL_MAX_BYTES = 1 << 30  # any one tensor it materializes
EVAL_TOTAL_BYTES = 16 << 30  # all of them (a proxy for its time)
EVAL_SECONDS = 120.0
SEED = 0
# Tolerance on max |got - want| for float outputs: ATOL + RTOL * max |want|, scaled by the output
# (a softmax over 1000 classes has values near 1e-3: a floor of 1e-3 would accept anything). Loose
# enough for the rounding differences between the interpreter and any variant's code (accumulation
# order, FMA, polynomial transcendentals): on the light models (ResNet-50, DenseNet-121,
# Inception v2, SqueezeNet) errors are 3-4 orders of magnitude below it; tight enough that a wrong
# kernel or a damaged device shows.
RTOL = {"float16": 1e-2, "float32": 1e-3, "float64": 1e-6}
ATOL = {"float16": 1e-3, "float32": 1e-5, "float64": 1e-12}
# The formats computed in float32 and rounded per op (as the interpreter does): a few units in the
# last place (2**-mantissa bits) for different accumulation orders and polynomial transcendentals.
for _name, (_bits, _mant, _bias, _kind) in FLOAT_FORMATS.items():
    RTOL.setdefault(_name, 4.0 * 2.0 ** -max(_mant, 1))
    ATOL.setdefault(_name, RTOL[_name] * 2.0 ** (1 - _bias))


class _Io(NamedTuple):
    """An input or output as the vectors see it (a Buffer's or a graph node's name, dtype and shape)."""
    name: str
    dtype: DType
    shape: tuple


def reference_input(b: Buffer | _Io, rng: np.random.Generator, n_strings: int = 0) -> np.ndarray:
    """b: its dtype and shape. n_strings: the size of the model's vocabulary. A string input is its ids: the
    vocabulary's strings and two it lacks (svodrt_strings/ids.py turns the ids into strings for the run)."""
    if b.dtype is dtypes.string:
        return rng.integers(0, n_strings + 2, b.shape).astype(np.int32)
    kind = b.dtype.kind
    if kind == "float":
        return rng.standard_normal(b.shape).astype(b.dtype.np)
    if kind == "bool":
        return rng.integers(0, 2, b.shape).astype(np.bool_)
    return rng.integers(0, 3, b.shape).astype(b.dtype.np)  # small non-negative: safe as indices and divisors


def _tolerance(b: Buffer, want: np.ndarray) -> float:
    if b.dtype.kind != "float":
        return 0.0
    finite = np.abs(want[np.isfinite(want)].astype(np.float64))
    return ATOL[b.dtype.name] + RTOL[b.dtype.name] * (float(finite.max()) if finite.size else 0.0)


def _le_bytes(a: np.ndarray, b: Buffer) -> bytes:
    """The array as the runtime takes it (the storage form: bfloat16/float8 bits, int4 values)."""
    a = to_storage(np.ascontiguousarray(a), b.dtype)
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()


def over_budget(roots: list[UOp]) -> str | None:
    """Why the reference interpreter should not run on this graph (a tensor it would materialize is too
    large, or all of them together are), or None. A 164-byte model can ask for 4 TB (ConstantOfShape
    [1e6, 1e6] -> ReduceSum): without this the compiler would run out of memory or never finish."""
    total = 0
    for n in toposort(roots):
        if n.op is Ops.SINK or not n.dtype.itemsize:
            continue
        try:
            nbytes = math.prod(int(d) for d in n.shape) * n.dtype.itemsize
        except (TypeError, ValueError):  # a shape the interpreter computes at run time: not estimated
            continue
        if nbytes > EVAL_MAX_BYTES:
            return (f"the reference interpreter would materialize a {n.dtype.name}{list(n.shape)} tensor "
                    f"({nbytes / 2**30:.1f} GiB, over {EVAL_MAX_BYTES >> 20} MiB)")
        total += nbytes
    if total > EVAL_TOTAL_BYTES:
        return (f"the reference interpreter would compute {total / 2**30:.1f} GiB of tensors "
                f"(over {EVAL_TOTAL_BYTES >> 30} GiB)")
    return None


def _io_bytes(ios: list) -> int:
    return sum(math.prod(b.shape) * b.dtype.itemsize for b in ios)


def _wanted(wanted: bool | None, size: int) -> bool:
    return wanted is True or (wanted is None and size <= DEFAULT_LIMIT)


# (feeds, outputs or None, the problem that stopped them or None, whether it was the interpreter's budget)
_Ran = tuple[dict[str, np.ndarray], list[np.ndarray] | None, str | None, bool]


def _reference(graph: ImportedGraph, inputs: list[_Io], stop: threading.Event | None = None) -> _Ran:
    """The reference input (a fixed seed) and the interpreter's outputs for it."""
    rng = np.random.default_rng(SEED)
    feeds = {b.name: reference_input(b, rng, len(graph.vocabulary)) for b in inputs}
    roots = [o for _, o in graph.outputs]
    problem = over_budget(roots)
    budget = problem is not None
    if computed := [name for name, _, role in graph.edge_outputs if role != "output"]:  # format 1.8
        problem = (f"inputs {computed} are computed by svodrt from the string inputs, which a stored vector of ids "
                   "cannot reproduce")
    outs = None
    try:
        if problem is None:
            with np.errstate(all="ignore"):
                outs = evaluate(roots, feeds, deadline=time.monotonic() + EVAL_SECONDS, stop=stop)
    except EvaluationTimeout as e:
        problem, budget = str(e), True
    except Exception as e:  # the interpreter lacks an op, or numpy refuses: no vector, said why
        problem = f"the reference interpreter failed: {type(e).__name__}: {e}"
    return feeds, outs, problem, budget


class ReferenceRun:
    """The interpreter's run for the test vector, on a thread of its own beside build_program: the passes are
    Python on one core, the interpreter mostly numpy (which releases the GIL), and the LLVM workers wait for the
    program, so on a 2-core machine it costs no wall time (resnet50's 0.2 s, densenet121's 0.4-3 s).
    build_test_vectors takes its result when the program's inputs are those it fed (they are the graph's), and
    runs the interpreter itself otherwise, so the vectors never depend on it. Leaving the `with` block joins
    the thread, after stopping it (between nodes) on an error.

    While it runs, numpy's BLAS takes one thread (threadpoolctl; restored when the run is collected): the run
    has one core's worth beside the passes, and OpenBLAS's second thread spun against them. resnet50's run on
    the shared 2-vCPU Zen 4: 0.98 s with two BLAS threads, 0.25 s with one; the outputs are the same bits."""

    def __init__(self, graph: ImportedGraph, wanted: bool | None):
        self._graph, self._ran, self._thread, self._blas = graph, None, None, None
        self._inputs = [_Io(name, x.dtype, tuple(x.shape)) for name, x in graph.inputs]
        self._stop = threading.Event()
        try:
            size = _io_bytes(self._inputs + [_Io(name, x.dtype, tuple(x.shape)) for name, x in graph.outputs])
        except (TypeError, ValueError):  # a shape known at run time only: build_test_vectors decides
            return
        if _wanted(wanted, size):
            self._blas = threadpool_limits(1, user_api="blas")
            self._thread = threading.Thread(target=self._run, name="svodc-test-vectors", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        self._ran = _reference(self._graph, self._inputs, self._stop)

    def _join(self) -> None:
        if self._blas is not None:  # once
            self._thread.join()
            self._blas.restore_original_limits()
            self._blas = None

    def result(self, program: Program) -> _Ran | None:
        """The run's result if it fed program's inputs (None: there was no run, or it fed others)."""
        if self._thread is None:
            return None
        self._join()
        return self._ran if [_Io(b.name, b.dtype, tuple(b.shape)) for b in program.inputs] == self._inputs else None

    def __enter__(self) -> ReferenceRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._stop.set()
        self._join()


def build_test_vectors(graph: ImportedGraph, program: Program, wanted: bool | None,
                       say: Callable[[str], None], early: ReferenceRun | None = None) -> list[dict]:
    """Manifest entries for the bundle's `test_vectors` (empty when not wanted or not possible).
    wanted: True always (an error if impossible), False never, None when small (DEFAULT_LIMIT).
    early: the interpreter's run started beside build_program, if any."""
    io = program.inputs + program.outputs
    size = sum(b.nbytes for b in io)
    if not _wanted(wanted, size):
        if wanted is None:
            say(f"test vectors: skipped, inputs and outputs take {size} bytes (over {DEFAULT_LIMIT}; "
                "--test-vectors embeds them anyway)")
        return []
    ran = early.result(program) if early is not None else None
    feeds, outs, problem, budget = ran or _reference(graph, [_Io(b.name, b.dtype, b.shape) for b in program.inputs])
    if problem is None:
        for b, o in zip(program.outputs, outs, strict=True):
            if tuple(o.shape) != tuple(b.shape) or o.dtype != b.dtype.np:
                problem = f"the interpreter gave output {b.name!r} as {o.dtype}{list(o.shape)}"
    if problem is not None:
        if wanted:
            raise TestVectorError(f"cannot make test vectors: {problem}")
        # past the interpreter's budget it is a warning (the user may want --no-test-vectors); else a note
        say(f"{'warning: ' if budget else ''}test vectors: skipped, {problem}")
        return []
    return [{
        "inputs": [_le_bytes(feeds[b.name], b) for b in program.inputs],
        "outputs": [_le_bytes(o, b) for o, b in zip(outs, program.outputs, strict=True)],
        "tolerance": [_tolerance(b, o) for b, o in zip(program.outputs, outs, strict=True)],
    }]


def _round_weights(roots: list[UOp], dt: DType) -> list[UOp]:
    """The graph with its float32 weight matrices (rank >= 2: what GEMMs read) rounded to dt and back."""
    new: dict[UOp, UOp] = {}
    for n in toposort(roots):
        if n.op is Ops.WEIGHT and n.dtype is dtypes.float32 and len(n.shape) >= 2:
            new[n] = UOp(Ops.WEIGHT, n.dtype, (), ConstData(n.arg.array.astype(dt.np).astype(np.float32)))
        else:
            src = tuple(new[s] for s in n.src)
            new[n] = n if src == n.src else n.replace(src=src)
    return [new[r] for r in roots]


def precision_errors(graph: ImportedGraph, program: Program, dt: DType) -> list[float] | None:
    """Per float output, the largest |difference| between the model at fp32 and the model with its weight
    matrices rounded to dt (--precision), on the test vector's input, by the reference interpreter (None
    when it cannot run; 0.0 for outputs that are not floats)."""
    rng = np.random.default_rng(SEED)
    feeds = {b.name: reference_input(b, rng, len(graph.vocabulary)) for b in program.inputs}
    roots = [o for _, o in graph.outputs]
    if over_budget(roots) is not None:
        return None
    try:
        with np.errstate(all="ignore"):
            deadline = time.monotonic() + EVAL_SECONDS
            want = evaluate(roots, feeds, deadline=deadline)
            got = evaluate(_round_weights(roots, dt), feeds, deadline=deadline)
    except Exception:  # as for the vectors: no number, and the caller says so
        return None
    return [float(np.max(np.abs(g.astype(np.float64) - w), initial=0.0)) if b.dtype.is_float else 0.0
            for g, w, b in zip(got, want, program.outputs, strict=True)]
