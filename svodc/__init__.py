"""svodc: the Svod ahead-of-time compiler. ONNX model -> .svod bundle for a target.

    import svodc
    bundle = svodc.compile("model.onnx", target="host")      # bytes
    svodc.compile_to_file("model.onnx", "model.svod", target="x86_64-linux-gnu:x86-64-v3,x86-64")
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from svodc.api import compile, compile_to_file
    from svodc.options import CompileOptions

__all__ = ["CompileOptions", "__version__", "compile", "compile_to_file"]


def __getattr__(name: str):
    # The API (and with it the frontend, onnx and every op handler) loads on first use, so the IR,
    # the passes and codegen can be imported and tested without ONNX; CompileOptions (numpy, the policy)
    # too, so an LLVM worker (codegen/worker.py) that imports svodc.codegen.llvm_job loads llvmlite alone.
    if name in ("compile", "compile_to_file"):
        from svodc import api

        return getattr(api, name)
    if name == "CompileOptions":
        from svodc.options import CompileOptions

        return CompileOptions
    raise AttributeError(f"module 'svodc' has no attribute {name!r}")
