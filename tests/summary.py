"""Lines the test run prints at its end (conftest.py): numbers the acceptance criteria ask to see
(conformance counts, fuzz outcomes), which pytest's captured output would otherwise hide."""

from __future__ import annotations

LINES: list[str] = []
