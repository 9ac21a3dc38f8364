"""The conformance suite as a test: every case runs (in worker subprocesses); the test fails when the
number of passing cases (with values fixed where the compiler asks, and with every input given at run
time) or of fully passing op types drops below the floor recorded in
thresholds.json (raise the floor when coverage improves: `make onnx-coverage` prints the numbers)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conformance.cases import collect_cases
from tests.conformance.compare import mismatch
from tests.conformance.report import summarize
from tests.conformance.runner import run_cases
from tests.summary import LINES

THRESHOLDS = json.loads((Path(__file__).with_name("thresholds.json")).read_text())


def test_conformance_does_not_regress():
    cases = collect_cases()
    results = run_cases(cases, workers=2)
    s = summarize(cases, results)
    LINES.append(f"onnx node tests: {s.passed} of {s.total} cases pass ({s.runtime_inputs_passed} with their inputs "
                 f"given at run time), {s.op_types_fully_passing} op types fully; {dict(s.by_status)}")
    assert sum(s.by_status.values()) == s.total == len(cases)  # every case has exactly one result
    failing = [f"{r.name}: {r.status} {r.reason}" for r in results if r.status not in ("pass", "out of scope")]
    detail = "\n".join(failing[:50])
    assert s.passed >= THRESHOLDS["passed"], f"{s.passed} cases pass, floor {THRESHOLDS['passed']}:\n{detail}"
    floor = THRESHOLDS["runtime_inputs_passed"]
    assert s.runtime_inputs_passed >= floor, (
        f"{s.runtime_inputs_passed} cases pass with their inputs given at run time, floor {floor}:\n" +
        "\n".join(f"{r.name}: {r.runtime_inputs_failure}" for r in results if r.runtime_inputs_failure)[:5000])
    assert s.op_types_fully_passing >= THRESHOLDS["op_types_fully_passing"], (
        f"{s.op_types_fully_passing} op types pass fully, floor {THRESHOLDS['op_types_fully_passing']}")


def test_compare_rules():
    import numpy as np

    f = np.array([1.0, np.nan, np.inf], np.float32)
    assert mismatch(f, f.copy(), 1e-3, 1e-7) is None
    assert "NaN" in mismatch(np.array([1.0, 0.0, np.inf], np.float32), f, 1e-3, 1e-7)
    assert "differ" in mismatch(np.array([1.01, np.nan, np.inf], np.float32), f, 1e-3, 1e-7)
    assert "differ" in mismatch(np.array([1.0, np.nan, -np.inf], np.float32), f, 1e-3, 1e-7)
    assert mismatch(np.array([1.0005], np.float32), np.array([1.0], np.float32), 1e-3, 1e-7) is None
    assert "dtype" in mismatch(np.array([1], np.int32), np.array([1], np.int64), 0, 0)
    assert "shape" in mismatch(np.zeros((2, 1)), np.zeros(2), 0, 0)
    assert "differ" in mismatch(np.array([True]), np.array([False]), 0, 0)


def test_runner_survives_crashes_and_hangs():
    """A worker killed by a signal marks its case "crash", a case over the time limit is a "timeout",
    and the remaining cases go on in new workers: every case gets exactly one result, in order."""
    from tests.conformance.cases import Case

    names = ["ok1", "segfault1", "ok2", "hang1", "ok3", "ok4"]
    cases = [Case(n, "Abs", "", b"", [], [], 1e-3, 1e-7) for n in names]
    results = run_cases(cases, workers=2, timeout=3.0, worker_module="tests.conformance.misbehaving_worker")
    assert [r.name for r in results] == names
    status = {r.name: r.status for r in results}
    assert status == {"ok1": "pass", "segfault1": "crash", "ok2": "pass", "hang1": "timeout", "ok3": "pass",
                      "ok4": "pass"}
    crash = next(r for r in results if r.name == "segfault1")
    assert "SIGSEGV" in crash.reason
