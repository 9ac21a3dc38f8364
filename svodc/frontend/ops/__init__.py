"""ONNX op handlers, one module per family. Importing this package registers them all."""

from svodc.frontend.ops import (  # noqa: F401
    control_flow,
    elementwise,
    indexing,
    linalg,
    movement,
    nn,
    reduction,
    resize,
    rnn,
    selection,
    sequence,
    shape_ops,
)
