"""ONNX op handlers, one module per family. Importing this package registers them all."""

from svodc.frontend.ops import (  # noqa: F401
    activations,
    attention,
    casts,
    elementwise,
    linalg,
    linear_attention,
    loss,
    ml,
    nn,
    normalization,
    quantize,
    reduction,
    roi,
    shape_ops,
    signal,
)
