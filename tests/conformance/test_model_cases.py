"""The onnx package's model tests (pytorch-converted, pytorch-operator, simple): every data set
compiled, run and compared with its .pb outputs, in the conformance worker pool (runner.py: a
native crash or a hang fails only its case). One pool run per session; one test per case."""

from __future__ import annotations

import time

import pytest

from tests.conformance.model_cases import collect_model_cases, not_run_reason
from tests.conformance.runner import run_cases
from tests.summary import LINES

CASES = collect_model_cases()


def _test_name(case) -> str:
    return case.name.split("/")[1]


@pytest.fixture(scope="module")
def results():
    run = [c for c in CASES if not not_run_reason(_test_name(c))]
    t0 = time.perf_counter()
    out = {r.name: r for r in run_cases(run, workers=2, timeout=120.0)}
    passed = sum(r.status == "pass" for r in out.values())
    LINES.append(f"onnx model tests: {passed} of {len(run)} run pass ({len(CASES) - len(run)} not run); "
                 f"pool wall {time.perf_counter() - t0:.0f} s")
    return out


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=pytest.mark.skip(reason=not_run_reason(_test_name(c))))
                                  if not_run_reason(_test_name(c)) else pytest.param(c, id=c.name) for c in CASES])
def test_model_case(case, results):
    r = results[case.name]
    assert r.status == "pass", f"{r.status}: {r.reason}"


def test_every_model_test_is_collected():
    """The three suites hold 140 tests in the pinned onnx; only the 2 Gradient ones are not run, and
    each not-run case has its reason."""
    names = [_test_name(c) for c in CASES]
    assert len(names) == len(set(names))  # one data set each
    skipped = [n for n in names if not_run_reason(n)]
    assert sorted({n.split("_")[1] for n in skipped}) == ["gradient"]
    assert len(skipped) == 2
