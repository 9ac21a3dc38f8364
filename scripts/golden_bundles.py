"""Write the golden bundles of the current format version into artifacts/v{MAJOR}.{MINOR}/, once.

Each golden is a tiny model compiled by today's svodc, with its input and, per code variant, the
outputs today's runtime gives (checked against onnxruntime here). tests/test_golden.py loads them
with every later runtime and wants the same outputs bit for bit. Existing files are never
overwritten: an old golden is the point of the exercise.

    .venv/bin/python scripts/golden_bundles.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.onnx_util import make_model, reference, small_cnn  # noqa: E402
from tests.string_models import storable  # noqa: E402


def relu_add():
    w = np.linspace(-1, 1, 8, dtype=np.float32)
    model = make_model([helper.make_node("Add", ["x", "w"], ["s"]), helper.make_node("Relu", ["s"], ["y"]),
                        helper.make_node("Mul", ["x", "x"], ["z"])], {"x": (np.float32, [8])}, ["y", "z"], {"w": w})
    return model, {"x": np.arange(-4, 4, dtype=np.float32) * 0.3}


def narrow_dtypes():
    """Format 1.1's dtypes at the boundary: bfloat16 and int4 in, float8/float16/bfloat16 out."""
    import ml_dtypes
    from onnx import TensorProto

    nodes = [helper.make_node("Cast", ["x"], ["a"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["q"], ["b"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT8E4M3FN),
             helper.make_node("Cast", ["s"], ["z"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["s"], ["h"], to=TensorProto.BFLOAT16)]
    graph = helper.make_graph(nodes, "narrow_dtypes",
                              [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [8]),
                               helper.make_tensor_value_info("q", TensorProto.INT4, [8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [8]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT16, [8]),
                               helper.make_tensor_value_info("h", TensorProto.BFLOAT16, [8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = np.array([0.1, -2.5, 300.0, 1e-3, -7.0, 0.75, 1000.0, -0.0], np.float32).astype(ml_dtypes.bfloat16)
    q = np.arange(-8, 8, 2).astype(np.int8)  # int4 travels as int8 values
    return model, {"x": x.view(np.uint16), "q": q}


def narrow_dtypes_reference(model, feeds) -> list[np.ndarray]:
    """onnxruntime has no int4 Add path to compare with: ml_dtypes computes the expected values."""
    import ml_dtypes

    s = feeds["x"].view(ml_dtypes.bfloat16).astype(np.float32) + feeds["q"].astype(np.float32)
    f8 = np.clip(s, -448, 448).astype(ml_dtypes.float8_e4m3fn)  # ONNX saturates float8 casts
    return [f8.view(np.uint8), s.astype(np.float16), s.astype(ml_dtypes.bfloat16).view(np.uint16)]


def string_codes():
    """Format 1.4's string inputs: LabelEncoder (string -> int64, string -> float) and Equal of two
    string inputs, with non-ASCII, empty and unknown strings."""
    from tests.string_models import category_codes

    return category_codes()


def string_reference(model, feeds) -> list[np.ndarray]:
    # onnxruntime takes str objects; a ZipMap output (list of dicts) is compared as its scores
    want = reference(model, {k: v.astype(object) if v.dtype.kind == "U" else v for k, v in feeds.items()})
    return [np.array([list(d.values()) for d in w], np.float32) if isinstance(w, list) else w for w in want]


def labels_and_maps():
    """Format 1.6's outputs decoded at the edge: string labels, ZipMap, LabelEncoder to strings,
    StringNormalizer of a string input."""
    from tests.string_models import labels_and_maps

    return labels_and_maps()


def string_program():
    """Format 1.8's string program: string ops on a run-time input, run by svodrt before the code."""
    from tests.string_models import string_program

    return string_program()


def bounded_batch():
    """Format 1.5's bounded dims: batch N in 1..8 shared by two inputs, a convolution (a GEMM with a
    run-time batch), a Gemm with a run-time M; run at N = 3."""
    from onnx import TensorProto

    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("Gemm", ["f", "fw", "b"], ["y"], transB=1)]
    inits = [helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3], rng.standard_normal(216).astype(np.float32)),
             helper.make_tensor("fw", TensorProto.FLOAT, [5, 512], rng.standard_normal(2560).astype(np.float32))]
    graph = helper.make_graph(nodes, "bounded_batch",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((3, 3, 8, 8)).astype(np.float32),
                   "b": rng.standard_normal((3, 5)).astype(np.float32)}


def bounded_image():
    """Format 1.7's computed dims: H and W bounded, Conv 3x3 stride 2 -> MaxPool 2x2 SAME_UPPER -> Conv 1x1,
    whose output sizes the code computes; run at an odd size (13 x 10)."""
    from onnx import TensorProto

    rng = np.random.default_rng(7)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
             helper.make_node("Conv", ["p", "w2"], ["y"])]
    inits = [helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], rng.standard_normal(108).astype(np.float32)),
             helper.make_tensor("w2", TensorProto.FLOAT, [2, 4, 1, 1], rng.standard_normal(8).astype(np.float32))]
    graph = helper.make_graph(nodes, "bounded_image",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, "h", "w"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((1, 3, 13, 10)).astype(np.float32)}


GOLDENS = {  # name: (model maker, target, reference (default: onnxruntime), first format version, options)
    "relu_add": (relu_add, "x86_64-linux-gnu:x86-64-v3,x86-64", reference, (1, 0), {}),
    "small_cnn": (small_cnn, "x86_64-linux-gnu:x86-64", reference, (1, 0), {}),
    "narrow_dtypes": (narrow_dtypes, "x86_64-linux-gnu:x86-64-v3,x86-64", narrow_dtypes_reference, (1, 1), {}),
    "string_codes": (string_codes, "x86_64-linux-gnu:x86-64-v3,x86-64", string_reference, (1, 4), {}),
    "bounded_batch": (bounded_batch, "x86_64-linux-gnu:x86-64-v3,x86-64", reference, (1, 5), {"dims": {"N": (1, 8)}}),
    "labels_and_maps": (labels_and_maps, "x86_64-linux-gnu:x86-64-v3,x86-64", string_reference, (1, 6), {}),
    "bounded_image": (bounded_image, "x86_64-linux-gnu:x86-64-v3,x86-64", reference, (1, 7),
                      {"dims": {"H": (3, 24), "W": (4, 24)}}),
    "string_program": (string_program, "x86_64-linux-gnu:x86-64-v3,x86-64", string_reference, (1, 8),
                       {"test_vectors": None}),  # (its computed inputs have none)
}


def main() -> None:
    import svodc
    import svodrt
    from svodrt.format import FORMAT_MAJOR, FORMAT_MINOR

    folder = ROOT / "artifacts" / f"v{FORMAT_MAJOR}.{FORMAT_MINOR}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, (make, target, ref, since, options) in GOLDENS.items():
        if since > (FORMAT_MAJOR, FORMAT_MINOR):
            continue
        bundle, expected = folder / f"{name}.svod", folder / f"{name}.expected.npz"
        if bundle.exists() or expected.exists():
            print(f"{bundle.relative_to(ROOT)} exists: kept")
            continue
        model, feeds = make()
        data = svodc.compile(model, target=target, **{"test_vectors": True, **options})
        want = dict(zip([o.name for o in model.graph.output], ref(model, feeds), strict=True))
        arrays = {f"input.{k}": v for k, v in feeds.items()}
        for i in range(len(svodrt.load(data).bundle.variants)):
            with svodrt.load(data, threads=1, variant=i) as m:
                for k, v in m.run(feeds).items():
                    if isinstance(v, list):  # ZipMap: a list of dicts
                        np.testing.assert_allclose([list(d.values()) for d in v], want[k], rtol=1e-6)
                    elif v.dtype.kind in "iubO":  # the bits of float8/bfloat16: exact
                        np.testing.assert_array_equal(v, want[k])
                    else:
                        np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-6)
                    arrays[f"variant{i}.{k}"] = storable(v)
        bundle.write_bytes(data)
        np.savez(expected, **arrays)
        print(f"wrote {bundle.relative_to(ROOT)} ({len(data)} bytes) and {expected.name}")


if __name__ == "__main__":
    main()
