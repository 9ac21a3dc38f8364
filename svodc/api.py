"""The compiler's Python API: the whole pipeline, one stage after the other.

frontend (ONNX -> UOp graph) -> passes (-> Program) -> codegen (-> code image per target)
-> bundle (-> bytes). Each stage takes the previous stage's output only.
"""

from __future__ import annotations

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

    target: "host", or variants like "x86_64:x86-64-v3,x86-64,aarch64:generic+dotprod" (svodc/target.py).
    Keyword options (dims=, input_shapes=, opt_level=, jobs=) fill a CompileOptions."""
    options = options or CompileOptions(**kw)
    say = progress or (lambda _msg: None)
    targets = parse_target(target)
    proto = load_model(model)
    say("import")
    graph = import_model(proto, options)
    say("optimize")
    program = build_program(graph, options)
    images = []
    for t in targets:
        say(f"codegen {t.describe()}")
        images.append((t, compile_program(program, t, options)))
    say("bundle")
    return write_bundle(program, images, _model_digest(model, proto))


def compile_to_file(model: ModelSource, output: str | os.PathLike, target: str = "host",
                    options: CompileOptions | None = None, progress: Progress | None = None, **kw) -> Path:
    """Compile and write the bundle atomically: a temp file in the same folder, renamed into place,
    so a failure never leaves a partial file."""
    data = compile(model, target, options, progress, **kw)
    return write_atomic(Path(output), data)


def write_atomic(path: Path, data: bytes) -> Path:
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise OutputWriteError(f"cannot write {str(path)!r}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise OutputWriteError(f"cannot write {str(path)!r}: {e.strerror or e}") from None
    return path
