"""What keeps compile time down without changing a byte: workers started ahead of their jobs, and
memoized symbolic simplification (issue 13)."""

from __future__ import annotations

from svodc.codegen.compile import LLVMJob
from svodc.codegen.worker import WorkerPool
from svodc.target import host_target


def _job(name: str) -> LLVMJob:
    t = host_target()
    return LLVMJob(name, f"define i32 @{name}() {{\n  ret i32 7\n}}\n", t.triple, t.llvm_cpu, t.llvm_features, 2,
                   t.codemodel, False, abiname=t.abiname)


def test_a_prestarted_pool_runs_jobs_on_the_workers_it_started_and_no_more():
    with WorkerPool(2) as pool:
        pool.prestart()
        started = {w.proc.pid for w in list(pool._idle.queue)}
        assert len(started) == 2
        pool.prestart()  # already full: starts nothing
        replies = pool.run([_job(f"f{i}") for i in range(5)], lambda job, msg: RuntimeError(msg))
        assert [r[0] for r in replies] == ["ok"] * 5 and all(r[1] for r in replies)
        assert {w.proc.pid for w in list(pool._idle.queue)} == started
