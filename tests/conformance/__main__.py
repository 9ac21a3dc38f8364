"""`python -m tests.conformance [--workers N] [--timeout S] [-k SUBSTRING] [-o docs/onnx-coverage.md]`:
run the conformance suite and write the coverage report."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tests.conformance.cases import collect_cases
from tests.conformance.report import render, summarize
from tests.conformance.runner import ROOT, run_cases


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m tests.conformance")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    p.add_argument("-k", dest="filter", default="",
                   help="run only cases whose name contains one of these comma-separated substrings")
    p.add_argument("-o", dest="output", default=str(ROOT / "docs" / "onnx-coverage.md"))
    p.add_argument("-v", dest="verbose", action="store_true", help="print every case's result")
    args = p.parse_args()
    import onnx

    cases = collect_cases()
    if args.filter:
        cases = [c for c in cases if any(f in c.name for f in args.filter.split(","))]
    done = [0]

    def progress(r) -> None:
        done[0] += 1
        if args.verbose or r.status != "pass":
            print(f"[{done[0]}/{len(cases)}] {r.name}: {r.status} {r.reason}", file=sys.stderr)

    t0 = time.perf_counter()
    results = run_cases(cases, workers=args.workers, timeout=args.timeout, progress=progress)
    wall = time.perf_counter() - t0
    s = summarize(cases, results)
    print(f"{s.passed}/{s.total} cases pass ({s.runtime_inputs_passed} with inputs given at run time), "
          f"{s.op_types_fully_passing}/{s.op_types} op types fully; "
          f"{dict(s.by_status)}; wall {wall:.0f} s")
    if not args.filter:
        Path(args.output).write_text(render(cases, results, wall, args.workers, onnx.__version__))
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
