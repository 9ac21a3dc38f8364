"""What both command lines share, importable with the runtime's dependencies only: the `svodc` console
script's entry (it must say which extra to install, not die with ModuleNotFoundError, on a runtime-only
install), the version line, silent broken pipes (`svodrt info m.svod | head`), and typo suggestions.
Exit codes for both: 0 success, 1 failure, 2 usage error."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable, Iterable

COMPILER_MODULES = ("onnx", "llvmlite", "click")


def version_line(prog: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    from svodrt import __version__
    from svodrt.format import FORMAT_MAJOR, FORMAT_MINOR

    try:
        package = version("svod")
    except PackageNotFoundError:  # run from a source tree
        package = __version__
    return f"{prog} {package} (svod {package}, bundle format {FORMAT_MAJOR}.{FORMAT_MINOR})"


def suggest(word: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for a close match, else ''."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def quiet_broken_pipe(main: Callable[[], object]) -> None:
    """Run main(); a reader that closed our stdout (| head) ends the program quietly, exit 1 as for any
    failure to deliver the output (no traceback, no 'Exception ignored' at shutdown)."""
    try:
        main()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter flushes stdout again at exit
        sys.exit(1)


def svodc() -> None:
    """The `svodc` console script."""
    missing = []
    for name in COMPILER_MODULES:  # imported now: the compiler imports all of them anyway
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        print(f"svodc: the compiler is not installed (missing {', '.join(missing)}): pip install 'svod[compiler]'",
              file=sys.stderr)
        sys.exit(1)
    from svodc.cli import main

    quiet_broken_pipe(main)
