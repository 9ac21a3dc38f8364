"""What keeps compile time down without changing a byte: workers started ahead of their jobs, and
memoized symbolic simplification (issue 13)."""

from __future__ import annotations

import gc
import subprocess
import sys

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from svodc import testvec
from svodc.codegen.llvm_job import LLVMJob
from svodc.codegen.worker import WorkerPool
from svodc.frontend.importer import import_model
from svodc.ir.dtypes import dtypes
from svodc.ir.interpret import EvaluationCancelled, evaluate
from svodc.ir.pattern import PatternMatcher, RewriteMemo
from svodc.ir.rewrite import graph_rewrite
from svodc.ir.symbolic import pm_symbolic, simplify
from svodc.ir.uop import UOp
from svodc.options import CompileOptions
from svodc.passes.pipeline import build_program
from svodc.target import host_target
from tests.onnx_util import small_cnn
from tests.test_symbolic import rng

I = dtypes.index


def _job(name: str) -> LLVMJob:
    t = host_target()
    return LLVMJob(name, f"define i32 @{name}() {{\n  ret i32 7\n}}\n", t.triple, t.llvm_cpu, t.llvm_features, 2,
                   t.codemodel, False, abiname=t.abiname)


def test_a_prestarted_pool_runs_jobs_costliest_first_on_the_workers_it_started_and_no_more():
    with WorkerPool(2) as pool:
        pool.prestart()
        started = {w.proc.pid for w in list(pool._idle.queue)}
        assert len(started) == 2
        pool.prestart()  # already full: starts nothing
        # started in the order of cost (here the reverse), answered in the order of the jobs
        replies = pool.run([_job(f"f{i}") for i in range(5)], lambda job, msg: RuntimeError(msg),
                           cost=lambda job: int(job.name[1:]))
        assert [r[0] for r in replies] == ["ok"] * 5
        assert all(f"f{i}".encode() in r[1] and f"f{(i + 1) % 5}".encode() not in r[1] for i, r in enumerate(replies))
        assert {w.proc.pid for w in list(pool._idle.queue)} == started


def test_a_worker_imports_llvmlite_and_no_more_of_svodc():
    """A worker starts in 0.06 s of CPU, not 0.3 s: of svodc it imports the job's module and errors, not numpy,
    the IR or the emitters (svodc/codegen/llvm_job.py), while the compiler runs the passes beside it."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "svodc.codegen.worker"], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "llvmlite.binding" in imported
    assert {m for m in imported if m.split(".")[0] in ("svodc", "numpy")} == {
        "svodc", "svodc.codegen", "svodc.codegen.llvm_job", "svodc.errors"}  # the worker itself runs as __main__


def _index_expressions(seed: int, count: int) -> list:
    """Random div/mod/affine index expressions over three ranges, sharing subexpressions."""
    r = np.random.default_rng(seed)
    ranges = [rng(20 + i, int(r.integers(2, 9))) for i in range(3)]
    out, e = [], UOp.const(I, 1)
    for _ in range(count):
        x, k = ranges[int(r.integers(0, 3))], int(r.integers(1, 6))
        e = [e + x * k, e // k, e % k, (e + x) // k * k][int(r.integers(0, 4))]
        out.append(e)
    return out


def test_memoized_simplification_gives_what_a_fresh_rewrite_gives_and_walks_a_seen_node_once(monkeypatch):
    fresh = PatternMatcher([], name="symbolic, unmemoized")
    fresh.rules, fresh._by_op = pm_symbolic.rules, pm_symbolic._by_op  # the same rules, no memo
    assert fresh.memo is None and pm_symbolic.memo is not None
    exprs = _index_expressions(1, 40)
    simplified = [simplify(e) for e in exprs]  # kept alive: an entry lasts while both of its nodes do
    assert simplified == [graph_rewrite(e, fresh) for e in exprs]
    assert any(s is not e for s, e in zip(simplified, exprs, strict=True))
    tried = []
    monkeypatch.setattr(pm_symbolic, "rewrite", lambda n, ctx=None: tried.append(n))
    assert [simplify(e) for e in exprs] == simplified
    assert tried == []  # every expression was found in the memo, none walked again


def test_the_memo_keeps_no_node_alive():
    memo = RewriteMemo()
    a = rng(40, 6) + 3
    memo.update({a: rng(40, 6) + 3, rng(41, 5): rng(41, 5)})
    assert memo.get(a) is a
    alive = len(memo._done)
    del a
    gc.collect()
    assert len(memo._done) < alive


def test_a_held_memo_finds_a_dropped_expression_again_and_keeps_nothing_once_released():
    memo = RewriteMemo()
    with memo.held():
        memo.update({rng(42, 7) + 5: rng(42, 7) + 5})
        gc.collect()
        assert memo.get(rng(42, 7) + 5) is not None  # built anew: the held entry still answers
        with memo.held():  # nested (another compilation in another thread): the outer hold is kept
            pass
        assert memo.get(rng(42, 7) + 5) is not None
    gc.collect()
    assert memo.get(rng(42, 7) + 5) is None
    assert len(memo._done) == 0


def _blas_threads() -> list[int]:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_the_test_vectors_run_beside_the_passes_are_the_vectors_run_after_them(monkeypatch):
    """ReferenceRun runs the interpreter on a thread while build_program runs (with one BLAS thread, restored
    when it is collected); build_test_vectors takes that run, so the interpreter runs once, and its vectors are
    those of the interpreter run after the passes. Inputs other than those it fed: the interpreter runs again."""
    graph = import_model(small_cnn()[0], CompileOptions())
    before = _blas_threads()
    ran: list[int] = []
    reference = testvec._reference
    monkeypatch.setattr(testvec, "_reference", lambda *a: ran.append(1) or reference(*a))
    with testvec.ReferenceRun(graph, None) as early:
        program = build_program(graph, CompileOptions())
        assert _blas_threads() == [1] * len(before)
        beside = testvec.build_test_vectors(graph, program, None, print, early)
    assert _blas_threads() == before and len(ran) == 1
    after = testvec.build_test_vectors(graph, program, None, print)
    assert beside == after and len(beside) == 1 and len(ran) == 2
    monkeypatch.setattr(early, "_inputs", [])  # as if it had fed other inputs: not taken
    assert early.result(program) is None


def test_an_error_beside_the_run_stops_it_and_restores_blas():
    graph = import_model(small_cnn()[0], CompileOptions())
    before = _blas_threads()
    with pytest.raises(KeyError), testvec.ReferenceRun(graph, True) as early:
        raise KeyError("the passes failed")
    assert not early._thread.is_alive() and _blas_threads() == before
    stop = testvec.threading.Event()
    stop.set()
    with pytest.raises(EvaluationCancelled):
        evaluate([o for _, o in graph.outputs], {}, stop=stop)
