"""Models rewritten by onnxruntime's own tools, generated on demand (tests cache them per session):
static QOperator quantization of mobilenetv2_random, dynamic quantization of a small LSTM and of
gpt2_small_random, and the transformer optimizer's fusion of gpt2_small_random."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from tests.test_models import MODELS

MOBILENET = MODELS / "mobilenetv2_random" / "model.onnx"
GPT2 = MODELS / "gpt2_small_random" / "model.onnx"
# The zero point input of each op with a quantized output: the output has the zero point's type.
ZERO_POINT_INPUT = {"QuantizeLinear": 2, "QLinearConv": 7, "QLinearMatMul": 7, "QLinearAdd": 7, "QLinearMul": 7,
                    "QLinearGlobalAveragePool": 4, "QLinearSigmoid": 4, "QLinearConcat": 1, "QGemm": 8}
# A smaller image than mobilenet's 224 x 224 (global pooling makes any size work): 12x less work.
IMAGE = (1, 3, 64, 64)


def quiet_onnxruntime_tools() -> None:
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer logs advice on every call


def mobilenet_at_image_size(folder: Path, image: tuple[int, ...] = IMAGE) -> Path:
    """mobilenetv2_random with its input fixed to `image`, saved in folder."""
    model = onnx.load(MOBILENET)
    for d, v in zip(model.graph.input[0].type.tensor_type.shape.dim, image, strict=True):
        d.dim_value = v
    onnx.save(model, folder / "mobilenet_float.onnx")
    return folder / "mobilenet_float.onnx"


def qoperator_mobilenet(folder: Path, image: tuple[int, ...] = IMAGE) -> tuple[Path, dict[str, np.ndarray]]:
    """mobilenetv2_random quantized statically in QOperator format (uint8 activations, int8 weights,
    calibrated on 2 random images), at `image` size (the float model is saved beside it); and an input.
    reduce_range (7-bit weights), which onnxruntime recommends for x86 CPUs without VNNI: without it
    onnxruntime's u8s8 kernels there sum pairs of products in saturating int16 and return integers off
    by up to ~40 (docs/architecture.md)."""
    return _static_mobilenet(folder, image, "qoperator", reduce_range=True)


def qdq_mobilenet(folder: Path, image: tuple[int, ...] = IMAGE, reduce_range: bool = False
                  ) -> tuple[Path, dict[str, np.ndarray]]:
    """mobilenetv2_random quantized by quantize_static's defaults (QDQ format, int8 activations and
    weights; what most shipped int8 models are), optionally with 7-bit weights; and an input."""
    return _static_mobilenet(folder, image, "qdq", reduce_range)


def _static_mobilenet(folder: Path, image: tuple[int, ...], fmt: str, reduce_range: bool
                      ) -> tuple[Path, dict[str, np.ndarray]]:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    quiet_onnxruntime_tools()
    rng = np.random.default_rng(0)
    images = [{"input": rng.standard_normal(image).astype(np.float32)} for _ in range(3)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(images[:2])

        def get_next(self):
            return next(self.it, None)

    src, out = mobilenet_at_image_size(folder, image), folder / f"mobilenet_{fmt}.onnx"
    if fmt == "qoperator":
        quantize_static(str(src), str(out), Reader(), quant_format=QuantFormat.QOperator,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, reduce_range=reduce_range)
    else:
        quantize_static(str(src), str(out), Reader(), reduce_range=reduce_range)
    return out, images[2]


def qoperator_swish_cnn(folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A seeded conv -> x * sigmoid(x) -> concat with a second conv -> global pool -> gemm model,
    quantized by quantize_static in QOperator format (QLinearSigmoid, QLinearMul, QLinearConcat and
    the ops of qoperator_mobilenet); and an input."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    quiet_onnxruntime_tools()
    r = np.random.default_rng(9)
    w = {"w1": r.standard_normal((8, 3, 3, 3)) * 0.3, "b1": r.standard_normal(8) * 0.1,
         "w2": r.standard_normal((4, 3, 1, 1)) * 0.5, "fc": r.standard_normal((12, 5)) * 0.3}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["s"]), helper.make_node("Mul", ["c1", "s"], ["swish"]),
             helper.make_node("Conv", ["x", "w2"], ["c2"]), helper.make_node("Concat", ["swish", "c2"], ["cat"], axis=1),
             helper.make_node("GlobalAveragePool", ["cat"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    g = helper.make_graph(nodes, "swish", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 12, 12])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 5])],
                          [onnx.numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()])
    images = [{"x": r.standard_normal((1, 3, 12, 12)).astype(np.float32)} for _ in range(3)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(images[:2])

        def get_next(self):
            return next(self.it, None)

    src, out = folder / "swish.onnx", folder / "swish_qoperator.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    quantize_static(str(src), str(out), Reader(), quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, reduce_range=True)
    return out, images[2]


def expose_quantized_outputs(model: onnx.ModelProto) -> list[str]:
    """Add every quantized node output as a graph output (typed as its zero point; a reshape of a
    quantized tensor as that tensor); their names."""
    types = {i.name: i.data_type for i in model.graph.initializer}
    names = []
    for n in model.graph.node:
        if n.op_type in ZERO_POINT_INPUT:
            types[n.output[0]] = types[n.input[ZERO_POINT_INPUT[n.op_type]]]
        elif n.op_type in ("Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze") and n.input[0] in names:
            types[n.output[0]] = types[n.input[0]]
        else:
            continue
        model.graph.output.append(helper.make_tensor_value_info(n.output[0], types[n.output[0]], None))
        names.append(n.output[0])
    return names


def ort_session(model: onnx.ModelProto | bytes, optimize: bool = False):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def small_lstm(folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A seeded float bidirectional LSTM (seq 3, batch 2, input 8, hidden 8) quantized by
    quantize_dynamic (its LSTM becomes com.microsoft.DynamicQuantizeLSTM); and an input."""
    from onnxruntime.quantization import quantize_dynamic

    quiet_onnxruntime_tools()
    r = np.random.default_rng(5)
    d, h, i, seq = 2, 8, 8, 3
    inits = {"W": r.standard_normal((d, 4 * h, i)) * 0.3, "R": r.standard_normal((d, 4 * h, h)) * 0.3,
             "B": r.standard_normal((d, 8 * h)) * 0.1}
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "y_h", "y_c"], hidden_size=h, direction="bidirectional")
    g = helper.make_graph([node], "lstm", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [seq, 2, i])],
                          [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in ("y", "y_h", "y_c")],
                          [onnx.numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    src, out = folder / "lstm.onnx", folder / "lstm_dynamic.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    quantize_dynamic(str(src), str(out), reduce_range=True)
    return out, {"x": r.standard_normal((seq, 2, i)).astype(np.float32)}


def ort_fused(src: Path, out: Path) -> Path:
    """The model as onnxruntime's graph optimizer (extended level) rewrites and saves it: it fuses
    DynamicQuantizeLinear + MatMulInteger into DynamicQuantizeMatMul, MatMul + Transpose/Mul into
    FusedMatMul, Add + LayerNormalization into SkipLayerNormalization."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(out)
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return out


def gpt2_dynamic(folder: Path) -> Path:
    """gpt2_small_random through quantize_dynamic (reduce_range: see qoperator_mobilenet), then
    onnxruntime's graph optimizer."""
    from onnxruntime.quantization import quantize_dynamic

    quiet_onnxruntime_tools()
    quantize_dynamic(str(GPT2), str(folder / "gpt2_dynamic.onnx"), reduce_range=True)
    return ort_fused(folder / "gpt2_dynamic.onnx", folder / "gpt2_dynamic_fused.onnx")


def gpt2_transformer_optimized(folder: Path) -> Path:
    """gpt2_small_random through onnxruntime.transformers.optimizer (model_type gpt2; its own fusions
    only, opt_level 0), then onnxruntime's graph optimizer."""
    from onnxruntime.transformers.optimizer import optimize_model

    quiet_onnxruntime_tools()
    optimize_model(str(GPT2), model_type="gpt2", num_heads=0, hidden_size=0, opt_level=0).save_model_to_file(
        str(folder / "gpt2_optimized.onnx"))
    return ort_fused(folder / "gpt2_optimized.onnx", folder / "gpt2_optimized_fused.onnx")
