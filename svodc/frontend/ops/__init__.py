"""ONNX op handlers, one module per family. Importing this package registers them all."""

from svodc.frontend.ops import elementwise, indexing, linalg, movement, nn, reduction, resize, shape_ops  # noqa: F401
