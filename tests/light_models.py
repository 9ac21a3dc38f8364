"""The onnx package's 9 "light" models, their reference data, and random-weight variants.

The light models' weights are ConstantOfShape fills, so every class gets the same logit and the
shipped reference output is a uniform 0.001: a broken kernel would still match it. The variants
give every weight tensor (rank >= 2) seeded He-normal values, perturb every other fill (biases, the
BatchNormalization statistics) by a random factor that keeps its sign, so variances stay positive,
and expose the logits before the final Softmax as an extra output; their references come from
onnxruntime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
                "squeezenet", "vgg19", "zfnet512"]


def model_path(name: str) -> Path:
    return LIGHT_DIR / f"light_{name}.onnx"


def reference_output(name: str) -> np.ndarray:
    return numpy_helper.to_array(onnx.load_tensor(str(LIGHT_DIR / f"light_{name}_output_0.pb")))


def dummy_inputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """What onnx's backend runner feeds these models: generate_dummy_data(seed=0, random=False)."""
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for x in model.graph.input:
        if x.name in inits:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in x.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        feeds[x.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


def random_weight_variant(name: str, seed: int = 0) -> onnx.ModelProto:
    model = onnx.load(str(model_path(name)))
    rng = np.random.default_rng(seed)
    g = model.graph
    values = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    nodes = []
    for node in g.node:
        if node.op_type != "ConstantOfShape":
            nodes.append(node)
            continue
        shape = [int(v) for v in values[node.input[0]].reshape(-1)]
        fill = numpy_helper.to_array(node.attribute[0].t).reshape(-1)[0] if node.attribute else np.float32(0)
        if len(shape) >= 2:
            data = rng.standard_normal(shape) * np.sqrt(2.0 / max(int(np.prod(shape[1:])), 1))
        else:
            data = fill * (1 + 0.5 * rng.uniform(-1, 1, size=shape))
        data = data.astype(np.float32)
        g.initializer.append(numpy_helper.from_array(data, node.output[0]))
    del g.node[:]
    g.node.extend(nodes)
    return expose_logits(model)


def expose_logits(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with the input of its final Softmax (the logits) as an extra output, if it has one."""
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"]
    if softmax:
        model.graph.output.append(helper.make_tensor_value_info(softmax[-1].input[0], onnx.TensorProto.FLOAT, None))
    return model


def contractions_off_the_gemm_path(model: onnx.ModelProto, kernels: list[dict], min_macs: int) -> list[str]:
    """The Conv/Gemm/MatMul nodes of a light model as shipped (every weight a ConstantOfShape splat)
    that no GEMM kernel of the bundle's kernel list (manifest `kernels`: kind, provenance) computes,
    except those the generic path runs by design: depthwise convolutions (one input channel per
    group), and products whose splat weight leaves less than `min_macs` multiply-adds (one row sum
    of the input per output row, broadcast: a classifier's Gemm or 1x1 Conv of a 1 x K vector)."""
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    on_gemm = {name for k in kernels if k["kind"] == "gemm" for name in k["provenance"]}
    off = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        name = node.name or node.output[0]
        x, w = shapes[node.input[0]], shapes[node.input[1]]
        groups = next((a.i for a in node.attribute if a.name == "group"), 1)
        if node.op_type == "Conv" and groups > 1 and w[1] == 1:
            continue
        # multiply-adds of the product with the weight's splat axis collapsed: a convolution sums
        # N x C x kernel values per output position, a Gemm/MatMul K per row of its input
        y = shapes[node.output[0]]
        collapsed = int(np.prod(x[:2]) * np.prod(w[2:]) * np.prod(y[2:])) if node.op_type == "Conv" else int(np.prod(x))
        if collapsed < min_macs:
            continue
        if name not in on_gemm:
            off.append(f"{name} ({node.op_type} {x} x {w})")
    return off
