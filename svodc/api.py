"""The compiler's Python API: the whole pipeline, one stage after the other.

frontend (ONNX -> UOp graph) -> passes (-> Program) -> codegen (-> code image per target)
-> bundle (-> bytes). Each stage takes the previous stage's output only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import onnx

from svodc.bundle import write_bundle
from svodc.codegen.compile import compile_program
from svodc.errors import OutputWriteError
from svodc.frontend.importer import ModelSource, import_model, load_model
from svodc.options import CompileOptions
from svodc.passes.pipeline import build_program
from svodc.target import parse_target
from svodc.testvec import build_test_vectors

Progress = Callable[[str], None]


def _model_digest(source: ModelSource, model: onnx.ModelProto) -> str:
    if isinstance(source, (str, os.PathLike)):
        h = hashlib.sha256()
        with open(source, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    if isinstance(source, bytes):
        return hashlib.sha256(source).hexdigest()
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def compile(model: ModelSource, target: str = "host", options: CompileOptions | None = None,
            progress: Progress | None = None, **kw) -> bytes:
    """Compile an ONNX model (path, bytes or ModelProto) into .svod bundle bytes.

    target: "host", or "x86_64-linux-gnu[:CPU[,CPU...]]" (one code variant per CPU).
    Keyword options (dims=, input_shapes=, opt_level=, jobs=, test_vectors=) fill a CompileOptions."""
    options = options or CompileOptions(**kw)
    say = progress or (lambda _msg: None)
    targets = parse_target(target)
    proto = load_model(model)
    say("import")
    graph = import_model(proto, options)
    say("optimize")
    program = build_program(graph, options)
    vectors = build_test_vectors(graph, program, options.test_vectors, say)
    images = []
    for t in targets:
        say(f"codegen {t.describe()}")
        images.append((t, compile_program(program, t, options)))
    say("bundle")
    return write_bundle(program, images, _model_digest(model, proto), vectors)


def compile_to_file(model: ModelSource, output: str | os.PathLike, target: str = "host",
                    options: CompileOptions | None = None, progress: Progress | None = None, **kw) -> Path:
    """Compile and write the bundle atomically: a temp file in the same folder, renamed into place,
    so a failure never leaves a partial file. The temp file is created first, so an unwritable
    output path fails before the compilation starts."""
    path = Path(output)
    with AtomicWriter(path) as out:
        out.write(compile(model, target, options, progress, **kw))
    return path


class AtomicWriter:
    """`with AtomicWriter(path) as w: w.write(data)`: the file appears at `path` complete, or not at all
    (the temp file is removed on any error, including KeyboardInterrupt)."""

    def __init__(self, path: Path):
        self.path = path
        self._tmp: str | None = None
        self._file = None

    def _error(self, e: OSError) -> OutputWriteError:
        return OutputWriteError(f"cannot write {str(self.path)!r}: {e.strerror or e}")

    def __enter__(self) -> AtomicWriter:
        if self.path.is_dir():
            raise OutputWriteError(f"cannot write {str(self.path)!r}: it is a directory")
        folder = self.path.parent if str(self.path.parent) else Path(".")
        try:
            fd, self._tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=folder)
        except OSError as e:
            raise self._error(e) from None
        self._file = os.fdopen(fd, "wb")
        return self

    def write(self, data: bytes) -> None:
        try:
            self._file.write(data)
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

