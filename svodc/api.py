"""The compiler's Python API: the whole pipeline, one stage after the other.

frontend (ONNX -> UOp graph) -> passes (-> Program) -> codegen (-> code image per target)
-> bundle (-> bytes). Each stage takes the previous stage's output only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import mmap
import os
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx

from svodc.bundle import check_bundle, write_bundle, write_bundle_to
from svodc.codegen.compile import KernelStream, compile_program, worker_count
from svodc.codegen.gpu_compile import compile_gpu_programs
from svodc.codegen.worker import WorkerPool, borrow
from svodc.errors import BundleError, OutputWriteError, PrecisionError, TargetError
from svodc.frontend.importer import ModelSource, import_model, load_model
from svodc.gpu_target import GpuTarget, parse_targets
from svodc.ir.dtypes import dtypes
from svodc.options import PRECISIONS, CompileOptions
from svodc.passes.dynamic import ComputedDim, DynamicShapeError
from svodc.passes.pipeline import build_program
from svodc.policy import OptimizationPolicy, check_policy_names, policy_for
from svodc.target import Target
from svodc.testvec import ReferenceRun, build_test_vectors, precision_errors

Progress = Callable[[str], None]
KernelProgress = Callable[[int, int], None]  # (modules compiled, of how many), from compile threads


def _model_digest(source: ModelSource, model: onnx.ModelProto) -> str:
    if isinstance(source, (str, os.PathLike)):
        return _file_digest(source)
    if isinstance(source, bytes):
        return hashlib.sha256(source).hexdigest()
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def _file_digest(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _FileDigest:
    """The model file's sha256 on a thread beside its import (hashlib and reads release the GIL: resnet50's
    100 MB took 0.06 s of the compile's own time after codegen)."""

    def __init__(self, path: str | os.PathLike):
        self._digest: str | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(path,), name="svodc-model-digest", daemon=True)
        self._thread.start()

    def _run(self, path: str | os.PathLike) -> None:
        try:
            self._digest = _file_digest(path)
        except BaseException as e:  # raised where the digest is wanted
            self._error = e

    def result(self) -> str:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._digest is not None
        return self._digest


def recorded_options(target: str, options: CompileOptions) -> dict:
    """What the manifest's `options` records of a compilation (docs/bundle-format.md): names and
    numbers only, no paths or values, so bundles stay reproducible across folders."""
    return {"target": target, "opt_level": options.opt_level, "dims": dict(sorted(options.dims.items())),
            "input_shapes": {k: list(v) for k, v in sorted(options.input_shapes.items())},
            "input_values": sorted(options.input_values), "weights": len(options.weights),
            "test_vectors": options.test_vectors, **({} if options.step_loops else {"step_loops": False}),
            **({"loop_bounds": dict(sorted(options.loop_bounds.items()))} if options.loop_bounds else {})}


# A reduced-precision bundle's test vectors accept this many times the error measured against fp32 (the
# GPU's kernels sum in another order than the interpreter; gfx11's WMMA also rounds the activations).
PRECISION_MARGIN = 4.0


def _check_precision(precision: str, targets: list) -> None:
    if precision not in PRECISIONS:
        raise PrecisionError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    cpus = [t.describe() for t in targets if not isinstance(t, GpuTarget)]
    if precision != "fp32" and cpus:
        raise PrecisionError(f"--precision {precision}: the CPU variants ({', '.join(cpus)}) take float32 GEMM weights "
                             "only; compile them without --precision, or name only GPU targets")


def _precision_report(graph, program, precision: str, vectors: list[dict], say: Progress) -> dict:
    """The manifest options' record of a reduced precision: its max error against fp32 on the test vector's
    input (None when the reference interpreter cannot run), which the vectors' tolerances then cover."""
    errors = precision_errors(graph, program, getattr(dtypes, PRECISIONS[precision]))
    if errors is None:
        say(f"precision {precision}: the error against fp32 was not measured (the reference interpreter cannot "
            "run this model)")
        return {"precision": precision, "precision_max_error": None}
    for v in vectors:  # the expected outputs are fp32's: the tolerance takes the reduced weights' error in
        v["tolerance"] = [max(t, PRECISION_MARGIN * e) for t, e in zip(v["tolerance"], errors, strict=True)]
    worst = max(errors, default=0.0)
    say(f"precision {precision}: max error against fp32 {worst:.3g} on the test vector input (GEMM weights rounded "
        f"to {PRECISIONS[precision]})")
    return {"precision": precision, "precision_max_error": worst}


class _Stages:
    """Reports each stage when it has finished, with its own duration: say("import 0.12 s")."""

    def __init__(self, say: Progress):
        self.say, self.t = say, time.perf_counter()

    def done(self, stage: str | None) -> None:
        """stage None: a stage that reported itself (skipped test vectors): only restart the clock."""
        now = time.perf_counter()
        if stage is not None:
            self.say(f"{stage} {now - self.t:.2f} s")
        self.t = now


def _compile_parts(model: ModelSource, target: str, options: CompileOptions | None, progress: Progress | None,
                   kernels_done: KernelProgress | None = None, workers: WorkerPool | None = None, **kw) -> tuple:
    """Everything a bundle is written from: (program, CPU images, model digest, test vectors, GPU images,
    signing key, optional manifest entries). One pool of LLVM workers (the caller's, or one for this
    call) compiles every variant."""
    options = options or CompileOptions(**kw)
    say = progress or (lambda _msg: None)
    stages = _Stages(say)
    targets = parse_targets(target)
    _check_precision(options.precision, targets)
    if any(isinstance(t, GpuTarget) for t in targets):  # a GPU variant's launch list has no loops: unrolled
        options = dataclasses.replace(options, step_loops=False)
    cpus = [t for t in targets if not isinstance(t, GpuTarget)]
    file_digest = _FileDigest(model) if isinstance(model, (str, os.PathLike)) else None  # beside the import
    with borrow(workers, worker_count(options)) as pool:
        pool.prestart()  # the workers' start-up beside the import
        proto = load_model(model)
        base_dir = Path(model).parent if isinstance(model, (str, os.PathLike)) else None
        graph = import_model(proto, options, base_dir=base_dir)
        stages.done("import")
        with (ReferenceRun(graph, options.test_vectors) as reference,
              _streamed(cpus[0] if cpus else None, options, pool) as stream):
            # the test vectors and LLVM on the first kernels' modules beside the passes
            program = build_program(graph, options, bundle_policy(targets, options), stream.add if stream else None)
            stages.done(f"optimize ({len(program.kernels)} kernels)")
            gpus = [t for t in targets if isinstance(t, GpuTarget)]
            computed_dims = [d.name for d in program.dims if isinstance(d, ComputedDim)]
            if gpus and computed_dims:
                raise DynamicShapeError(f"computed dims {computed_dims} (sizes of convolutions, pools or pads over "
                                        f"bounded image dims): GPU variants ({', '.join(t.describe() for t in gpus)}) "
                                        "take input dims only for now; fix the image dims with --input-shape")
            # The test vectors are finished before codegen, not beside it: numpy's BLAS threads and the LLVM
            # workers on the same cores made both slower (resnet50 on 2 cores: 1-2 s more, measured).
            vectors = build_test_vectors(graph, program, options.test_vectors, say, reference)
            stages.done("test vectors" if vectors else None)
            images = []
            gpu_images = []
            for t in cpus:
                fed = stream if t is cpus[0] else None
                images.append((t, compile_program(program, t, options, kernels_done, pool, fed)))
                stages.done(f"codegen {t.describe()}")
            if gpus:
                gpu_images = compile_gpu_programs(program, gpus, options, pool)
                stages.done(f"codegen {', '.join(t.describe() for t in gpus)}")
    recorded = recorded_options(target, options)
    if options.precision != "fp32":
        recorded |= _precision_report(graph, program, options.precision, vectors, say)
    named = {n for k in program.kernels for n in k.provenance}
    extra = {"options": recorded,
             "node_ops": {n: t for n, t in sorted((graph.op_types or {}).items()) if n in named}}
    digest = file_digest.result() if file_digest is not None else _model_digest(model, proto)
    return program, images, digest, vectors, gpu_images, options.sign_key, extra


@contextlib.contextmanager
def _streamed(target: Target | None, options: CompileOptions, pool: WorkerPool) -> Iterator[KernelStream | None]:
    """The first CPU variant's KernelStream, which starts LLVM on the kernels build_program lowers, one module
    at a time (the passes hold the other core; compile_program lifts the limit); stopped if the block fails."""
    stream = KernelStream(target, options, pool, limit=1) if target is not None else None
    try:
        yield stream
    except BaseException:
        if stream is not None:
            stream.cancel()
        raise


def bundle_policy(targets: list, options: CompileOptions) -> OptimizationPolicy:
    """The one program part of the variants' optimisation policies (svodc/policy.py). Format 1 holds one
    program (kernel list, buffers, arena, weights) for all variants, so variants whose program parts
    differ cannot share a bundle yet: that is an error naming them. Their GEMM blocking and vectorizer
    threshold may differ: they only shape each variant's own code (compile_program). Thresholds the policy
    leaves to the target (None: the Winograd gate, by FMA width) are the first CPU variant's: the one listed
    first, which the runtime prefers where it fits (so x86-64-v4,x86-64-v3 takes the 512-bit gate for both)."""
    check_policy_names(options.policies, targets)
    by_policy: dict[OptimizationPolicy, list[str]] = {}
    for t in targets:
        by_policy.setdefault(policy_for(t, options.policies).program_part(), []).append(t.describe())
    if len(by_policy) > 1:
        groups = "; ".join(", ".join(names) for names in by_policy.values())
        raise TargetError(f"variants with different optimisation policies ({groups}) need different programs, and "
                          "a bundle holds one program: compile each group into a bundle of its own")
    policy = next(iter(by_policy))
    policy = policy.resolved(next((t for t in targets if not isinstance(t, GpuTarget)), targets[0]))
    # With a GPU variant: the integer GEMM kernels are CPU code only (integer products stay generic loops), and
    # convolutions stay direct: Winograd's split pieces are one launch each on a GPU (resnet50: 375 launches, not
    # 100) for little or no work saved (docs/architecture.md "Passes"); a softmax stays four kernels (a GPU
    # thread per element would reduce its whole row: passes/rows.py).
    if any(isinstance(t, GpuTarget) for t in targets):
        return dataclasses.replace(policy, int8_gemm=False, winograd=False, row_fusion=False)
    return policy


def compile(model: ModelSource, target: str = "host", options: CompileOptions | None = None,
            progress: Progress | None = None, kernels_done: KernelProgress | None = None,
            workers: WorkerPool | None = None, **kw) -> bytes:
    """Compile an ONNX model (path, bytes or ModelProto) into .svod bundle bytes.

    target: "host", CPU variants like "x86_64:x86-64-v3,x86-64,aarch64:generic+dotprod" (svodc/target.py),
    GPUs ("sm_90", "gfx942", ...), or CPU and GPU items separated by commas (svodc/gpu_target.py).
    Keyword options (dims=, input_shapes=, weights=, opt_level=, jobs=, test_vectors=) fill a
    CompileOptions. progress(line): each stage when it has finished, with its time; kernels_done(done,
    total): as LLVM finishes each module. workers: a WorkerPool (svodc/codegen/worker.py) to run LLVM
    on, for callers that compile many models; by default the call starts its own and stops it before
    returning. For large weights prefer compile_to_file: it streams them."""
    return write_bundle(*_compile_parts(model, target, options, progress, kernels_done, workers, **kw))


def compile_to_file(model: ModelSource, output: str | os.PathLike, target: str = "host",
                    options: CompileOptions | None = None, progress: Progress | None = None,
                    kernels_done: KernelProgress | None = None, workers: WorkerPool | None = None, **kw) -> Path:
    """Compile and write the bundle atomically: a temp file in the same folder, renamed into place,
    so a failure never leaves a partial file (SIGTERM included). The temp file is created first, so an
    unwritable output path fails before the compilation starts; an output that is a device, a folder
    or the model itself is refused. Weights are written from their arrays (views of mapped files where
    they came from external data or safetensors) straight into the file."""
    path = Path(output)
    check_output_path(path, model)
    with AtomicWriter(path) as out:
        parts = _compile_parts(model, target, options, progress, kernels_done, workers, **kw)
        t0 = time.perf_counter()
        out.call(lambda f: write_bundle_to(f, *parts))
        out.call(_check_written)
        if progress:
            progress(f"bundle {time.perf_counter() - t0:.2f} s")
    return path


def check_output_path(path: Path, model: ModelSource) -> None:
    """Outputs replace regular files only: never a device node, a FIFO or the model being compiled."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise OutputWriteError(f"cannot write {str(path)!r}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise OutputWriteError(f"cannot write {str(path)!r}: it is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise OutputWriteError(f"cannot write {str(path)!r}: it is not a regular file (a device, FIFO or socket); "
                               "give a file path with -o")
    if isinstance(model, (str, os.PathLike)):
        with contextlib.suppress(OSError):
            if os.path.samefile(path, model):
                raise OutputWriteError(f"cannot write {str(path)!r}: it is the model being compiled; choose another "
                                       "-o path")


def _check_written(f) -> None:
    f.flush()
    problem = None
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m, memoryview(m) as data:
        try:
            check_bundle(data)
        except BundleError as e:  # raised below, once its traceback (views of the mapping) is gone
            problem = str(e)
    if problem is not None:
        raise BundleError(problem)


class AtomicWriter:
    """`with AtomicWriter(path) as w: w.write(data)`: the file appears at `path` complete, or not at all
    (the temp file is removed on any error, including KeyboardInterrupt)."""

    def __init__(self, path: Path):
        self.path = path
        self._tmp: str | None = None
        self._file = None

    def _error(self, e: OSError) -> OutputWriteError:
        return OutputWriteError(f"cannot write {str(self.path)!r}: {e.strerror or e}")

    def _on_sigterm(self, signum, frame) -> None:
        raise SystemExit(128 + signum)  # unwinds through __exit__, which removes the temp file

    def __enter__(self) -> AtomicWriter:
        # SIGTERM (kill, a CI timeout) must not leave the temp file: turn it into an exception while we
        # hold one, unless the application installed its own handler (or this is not the main thread).
        self._old_term = None
        if self.path.is_dir():
            raise OutputWriteError(f"cannot write {str(self.path)!r}: it is a directory")
        folder = self.path.parent if str(self.path.parent) else Path(".")
        try:
            fd, self._tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=folder)
        except OSError as e:
            raise self._error(e) from None
        self._file = os.fdopen(fd, "wb")
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self._old_term = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def write(self, data: bytes) -> None:
        self.call(lambda f: f.write(data))

    def call(self, fn: Callable) -> None:
        """fn(the open temp file); an OSError becomes an OutputWriteError naming the path."""
        try:
            fn(self._file)
        except OSError as e:
            raise self._error(e) from None

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._file.flush()
                os.fsync(self._file.fileno())
            self._file.close()
            if exc_type is None:
                os.chmod(self._tmp, 0o644)
                os.replace(self._tmp, self.path)
                self._tmp = None
        except OSError as e:
            raise self._error(e) from None
        finally:
            if self._tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self._tmp)
            if self._old_term is not None:
                signal.signal(signal.SIGTERM, self._old_term)

