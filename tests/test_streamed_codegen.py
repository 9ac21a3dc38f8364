"""LLVM starts on the modules of the kernels the passes have lowered, while they lower the rest (issue 13:
codegen/compile.py KernelStream, codegen/units.py, worker.JobStream); the bytes never depend on it."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from svodc.codegen import worker as worker_mod
from svodc.codegen.compile import KernelStream, compile_program
from svodc.codegen.llvm_job import LLVMJob
from svodc.codegen.units import ModuleBuilder, kernel_modules
from svodc.codegen.worker import JobStream, WorkerPool
from svodc.frontend.importer import import_model
from svodc.options import CompileOptions
from svodc.passes.pipeline import build_program
from svodc.policy import gemm_blocking
from svodc.target import host_target
from tests.onnx_util import small_cnn
from tests.test_kernel_sharing import _units
from tests.test_rnn_resize import _rnn_model

CHUNK = 4


def _gru_unrolled():
    """Unrolled steps: templates that change constants and are shared, besides kernels that share nothing."""
    model, _, _ = _rnn_model("GRU", 3, 5, {"direction": "bidirectional"}, seq=6)
    options = CompileOptions(step_loops=False)
    return import_model(model, options), options


def _cnn():
    return import_model(small_cnn()[0]), CompileOptions()


@pytest.mark.parametrize("make", [_cnn, _gru_unrolled])
def test_streamed_code_is_the_code_made_at_the_end(make):
    """build_program feeds the stream kernel by kernel and some modules are compiled before it returns; the
    image is byte for byte the one compiled from the finished program, and both link the same modules."""
    graph, options = make()
    target = host_target()
    with WorkerPool(2) as pool:
        stream = KernelStream(target, options, pool, limit=1)
        program = build_program(graph, options, on_kernel=stream.add)
        assert stream.follows(program) and len(stream.seen) == len(program.kernels)
        early = len(stream.jobs)
        streamed = compile_program(program, target, options, workers=pool, stream=stream)
        whole = compile_program(program, target, options, workers=pool)
    assert early > 0  # body modules went to LLVM before build_program returned
    assert streamed.data == whole.data and streamed.symbols == whole.symbols and streamed.fixups == whole.fixups


def test_the_modules_of_a_prefix_are_the_first_modules_of_the_whole():
    """What makes streaming safe: the modules made from the first n kernels are the first modules made from
    all of them, for every n (shared templates, templates shared late, kernels sharing nothing)."""
    graph, options = _gru_unrolled()
    program = build_program(graph, options)
    target = host_target()
    from svodc.codegen.compile import prepare_kernel

    kernels = [prepare_kernel(k, target) for k in program.kernels]
    whole = kernel_modules(kernels, len(program.inputs), target, gemm_blocking(target), CHUNK)
    for n in range(len(kernels) + 1):
        b = ModuleBuilder(target, gemm_blocking(target), CHUNK)
        made = [m for k in kernels[:n] for m in b.add(k)]
        assert made == whole[:len(made)], n


def test_units_are_those_of_the_rule():
    """Kernels sharing a template share its body; a kernel whose template matches no other keeps its own code
    (None); the unrolled steps share bodies."""
    model, _, _ = _rnn_model("GRU", 3, 5, {"direction": "bidirectional"}, seq=6)
    kernels, units = _units(model, step_loops=False)
    assert sum(len(u) for u in units) == len(kernels) and len(units) < len(kernels)
    assert all(t is None for u in units if len(u) == 1 for _, t, _ in u)
    assert any(len(u) > 2 and any(t is not None and t.changed for _, t, _ in u) for u in units)


def test_a_program_that_is_not_what_was_streamed_is_compiled_from_its_own_kernels():
    graph, options = _gru_unrolled()
    target = host_target()
    with WorkerPool(2) as pool:
        stream = KernelStream(target, options, pool, limit=1)
        program = build_program(graph, options, on_kernel=stream.add)
        whole = compile_program(program, target, options, workers=pool)
        program.kernels[0] = dataclasses.replace(program.kernels[0])  # as if a pass had rewritten a lowered kernel
        assert not stream.follows(program)
        again = compile_program(program, target, options, workers=pool, stream=stream)
    assert again.data == whole.data


def _job(name: str) -> LLVMJob:
    t = host_target()
    return LLVMJob(name, f"define i32 @{name}() {{\n  ret i32 7\n}}\n", t.triple, t.llvm_cpu, t.llvm_features, 2,
                   t.codemodel, False, abiname=t.abiname)


def test_a_job_stream_runs_at_most_its_limit_and_answers_in_submission_order(monkeypatch):
    """One job at a time until set_limit (the passes hold the other core), then the pool's size; results in
    submission order; on_done sees the total only once the stream is closed."""
    running, most, events = [0], [], []
    lock = threading.Lock()
    call = worker_mod._Worker.call

    def slow(self, job):
        with lock:
            running[0] += 1
            most.append((time.monotonic(), running[0]))
        time.sleep(0.3)
        try:
            return call(self, job)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(worker_mod._Worker, "call", slow)
    with WorkerPool(2) as pool:
        pool.prestart()
        stream = JobStream(pool, lambda job, msg: RuntimeError(msg), limit=1)
        for i in range(5):
            stream.submit(_job(f"f{i}"), cost=i)
        time.sleep(0.45)
        lifted = time.monotonic()
        stream.set_limit(2)
        replies = stream.results(lambda done, total: events.append((done, total)))
    assert [r[0] for r in replies] == ["ok"] * 5
    assert all(f"f{i}".encode() in r[1] for i, r in enumerate(replies))
    assert max(n for t, n in most if t < lifted) == 1 and max(n for t, n in most if t >= lifted) == 2
    assert events == [(d, 5) for d in range(1, 6)]


def test_a_worker_that_dies_fails_the_stream_and_the_pool_goes_on(monkeypatch):
    """A worker's death (here: its pipe closes on job f2) is the on_crash error at results(), after the jobs
    running finished; the pool starts a new worker for the next call."""
    call = worker_mod._Worker.call

    def dying(self, job):
        if job.name == "f2":
            raise EOFError
        return call(self, job)

    with WorkerPool(2) as pool:
        monkeypatch.setattr(worker_mod._Worker, "call", dying)
        stream = JobStream(pool, lambda job, msg: RuntimeError(f"{job.name} died"))
        for i in range(5):
            stream.submit(_job(f"f{i}"))
        with pytest.raises(RuntimeError, match="f2 died"):
            stream.results()
        monkeypatch.setattr(worker_mod._Worker, "call", call)
        assert [r[0] for r in pool.run([_job("g")], lambda job, msg: RuntimeError(msg))] == ["ok"]
