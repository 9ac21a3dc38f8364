"""svodc: the Svod ahead-of-time compiler. ONNX model -> .svod bundle for a target.

    import svodc
    bundle = svodc.compile("model.onnx", target="host")      # bytes
    svodc.compile_to_file("model.onnx", "model.svod", target="x86_64-linux-gnu:x86-64-v3,x86-64")
"""

from __future__ import annotations

__version__ = "0.1.0"

from svodc.api import compile, compile_to_file
from svodc.options import CompileOptions

__all__ = ["CompileOptions", "__version__", "compile", "compile_to_file"]
