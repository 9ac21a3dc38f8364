"""Emulated dtypes end to end: every encoding of the 8- and 16-bit float formats decodes exactly,
float32/float64 values (normal, subnormal, halfway, overflowing, special) encode bit for bit as
ml_dtypes and numpy do, narrow integers wrap, and arithmetic on emulated types rounds once per op."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import svodrt
from svodc.ir.alu import cast_array
from svodc.ir.dtypes import dtypes, to_storage
from tests.onnx_util import compile_and_run

FORMATS = {  # ONNX type -> our dtype
    TensorProto.FLOAT16: dtypes.float16, TensorProto.BFLOAT16: dtypes.bfloat16,
    TensorProto.FLOAT8E4M3FN: dtypes.float8e4m3fn, TensorProto.FLOAT8E4M3FNUZ: dtypes.float8e4m3fnuz,
    TensorProto.FLOAT8E5M2: dtypes.float8e5m2, TensorProto.FLOAT8E5M2FNUZ: dtypes.float8e5m2fnuz,
    TensorProto.FLOAT8E8M0: dtypes.float8e8m0, TensorProto.FLOAT4E2M1: dtypes.float4e2m1,
}
ONNX_OF = {v: k for k, v in FORMATS.items()}
ONNX_OF.update({dtypes.float32: TensorProto.FLOAT, dtypes.float64: TensorProto.DOUBLE, dtypes.int4: TensorProto.INT4,
                dtypes.uint4: TensorProto.UINT4, dtypes.int32: TensorProto.INT32, dtypes.int64: TensorProto.INT64})


def cast_model(src, dst, shape, **attrs):
    node = helper.make_node("Cast", ["x"], ["y"], to=ONNX_OF[dst], **attrs)
    graph = helper.make_graph([node], "cast", [helper.make_tensor_value_info("x", ONNX_OF[src], shape)],
                              [helper.make_tensor_value_info("y", ONNX_OF[dst], shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def run_cast(x: np.ndarray, src, dst, **attrs) -> np.ndarray:
    """x in src's compute type -> the bundle's output, in dst's compute type."""
    feed = to_storage(x, src)
    out = compile_and_run(cast_model(src, dst, list(x.shape), **attrs), {"x": feed})["y"]
    return out.view(dst.np) if dst.is_float and dst.itemsize == out.itemsize and out.dtype != dst.np \
        else out.astype(dst.np)


def all_encodings(dt) -> np.ndarray:
    n = 1 << (8 * dt.itemsize) if dt is not dtypes.float4e2m1 else 16
    return np.arange(n, dtype=dt.storage_np.str.replace("i", "u")).view(dt.storage_np).view(dt.np) \
        if dt is not dtypes.float4e2m1 else np.arange(n, dtype=np.uint8).view(dt.np)


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Bit-exact, except that any NaN matches any NaN."""
    with np.errstate(all="ignore"):
        g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(w)
    np.testing.assert_array_equal(np.isnan(g), nan)
    np.testing.assert_array_equal(got[~nan].view(f"u{got.itemsize}"), want[~nan].view(f"u{want.itemsize}"))


@pytest.mark.parametrize("dt", list(FORMATS.values()), ids=lambda d: d.name)
def test_every_encoding_decodes_exactly(dt):
    x = all_encodings(dt)
    same_bits(run_cast(x, dt, dtypes.float32), x.astype(np.float32))


def interesting_float32() -> np.ndarray:
    r = np.random.default_rng(7)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, 3.4e38, -3.4e38, 65504,
                         65520, 65519.99, 448, 464, 465, 57344, 61440, 61439, 240, 6, 7, -7, 2 ** -24, 2 ** -25,
                         3 * 2 ** -26, 2 ** -126, 2 ** -133, 2 ** -149, 1.5, 3.0, 2 ** -127, 1.5 * 2 ** -127],
                        np.float32)
    bits = r.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # values near the halfway points of every format: integers with few significant bits, +-1 ulp
    halves = (r.integers(1, 1 << 12, 4000) * 2.0 ** r.integers(-30, 20, 4000)).astype(np.float32)
    near = np.concatenate([halves, np.nextafter(halves, np.inf), np.nextafter(halves, -np.inf)])
    return np.concatenate([specials, -specials, bits, near, -near])


def run_ir_cast(x: np.ndarray, dst) -> np.ndarray:
    """Compile one IR CAST (not an ONNX Cast: that one saturates float8 and rounds e8m0 its own way)."""
    import svodrt
    from svodc.bundle import write_bundle
    from svodc.codegen.compile import compile_program
    from svodc.ir.ops import InputArg, Ops
    from svodc.ir.provenance import Provenance
    from svodc.ir.uop import UOp
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program
    from svodc.program import ImportedGraph
    from svodc.target import parse_target

    src = dtypes.from_numpy(x.dtype)
    inp = UOp(Ops.INPUT, src, (), InputArg("x", x.shape))
    graph = ImportedGraph([("x", inp)], [("y", inp.cast(dst))], Provenance(), "test")
    options = CompileOptions()
    program = build_program(graph, options)
    target, = parse_target("host")
    bundle = write_bundle(program, [(target, compile_program(program, target, options))], "test")
    with svodrt.load(bundle, threads=1) as m:
        return m.run({"x": to_storage(x, src)})["y"].view(dst.np)


@pytest.mark.parametrize("dt", list(FORMATS.values()), ids=lambda d: d.name)
def test_float32_encodes_like_ml_dtypes(dt):
    x = interesting_float32()
    got = run_ir_cast(x, dt)
    want = cast_array(x, dt)
    if dt is dtypes.float4e2m1:  # float4 has no NaN: ml_dtypes' zero of either sign
        keep = ~np.isnan(x)
        got, want = got[keep], want[keep]
    same_bits(got, want)


def test_float64_to_float16_rounds_once():
    r = np.random.default_rng(3)
    halves = r.integers(1, 1 << 11, 5000) * 2.0 ** r.integers(-30, 6, 5000)
    x = np.concatenate([halves + halves * 2.0 ** -40, halves - halves * 2.0 ** -40, halves,
                        [1e300, -1e300, 6e-8, 3e-8, 2.9802322387695312e-08, np.inf, np.nan]])
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    same_bits(run_cast(x, dtypes.float64, dtypes.float16), want)


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_float8e8m0_cast_round_modes(mode, saturate):
    from onnx.numpy_helper import to_float8e8m0

    x = np.abs(interesting_float32())
    got = run_cast(x, dtypes.float32, dtypes.float8e8m0, saturate=saturate, round_mode=mode)
    want = to_float8e8m0(x, bool(saturate), mode)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dt", [dtypes.int4, dtypes.uint4])
def test_narrow_integers_wrap(dt):
    x = np.arange(-40, 40, dtype=np.int32)
    np.testing.assert_array_equal(run_cast(x, dtypes.int32, dt), x.astype(dt.np))
    f = np.array([-9.7, -8.2, 7.9, 15.5, 100.0, np.nan, -1e10], np.float32)
    np.testing.assert_array_equal(run_cast(f, dtypes.float32, dt), cast_array(f, dt))
    v = np.arange(16).astype(dt.np) if dt is dtypes.uint4 else np.arange(-8, 8).astype(dt.np)
    np.testing.assert_array_equal(run_cast(v, dt, dtypes.float32), v.astype(np.float32))


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float8e4m3fn])
def test_arithmetic_rounds_once_per_op(dt):
    r = np.random.default_rng(5)
    a = r.normal(size=200).astype(np.float32).astype(dt.np)
    b = r.normal(size=200).astype(np.float32).astype(dt.np)
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Add", ["m", "a"], ["s"]),
             helper.make_node("Sqrt", ["s"], ["y"]), helper.make_node("ReduceSum", ["m"], ["t"], keepdims=0)]
    t = ONNX_OF[dt]
    graph = helper.make_graph(nodes, "arith", [helper.make_tensor_value_info(n, t, [200]) for n in "ab"],
                              [helper.make_tensor_value_info("y", t, [200]), helper.make_tensor_value_info("t", t, [])])
    out = compile_and_run(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]),
                          {"a": to_storage(a, dt), "b": to_storage(b, dt)})
    m = (a.astype(np.float32) * b.astype(np.float32)).astype(dt.np)
    s = (m.astype(np.float32) + a.astype(np.float32)).astype(dt.np)
    with np.errstate(invalid="ignore"):
        y = np.sqrt(s.astype(np.float32)).astype(dt.np)
    same_bits(out["y"].view(dt.np) if out["y"].dtype != dt.np else out["y"], y)
    total = np.float32(m.astype(np.float32).sum(dtype=np.float64))  # accumulated in float32, rounded once
    got_t = (out["t"].view(dt.np) if out["t"].dtype != dt.np else out["t"]).astype(np.float64)
    assert abs(got_t - float(total.astype(dt.np).astype(np.float64))) <= abs(float(total)) * 2 ** -6 + 1e-6


def test_runtime_accepts_ml_dtypes_arrays():
    x = np.array([1.5, -2.25, np.nan], ml_dtypes.bfloat16)
    out = compile_and_run(cast_model(dtypes.bfloat16, dtypes.float32, [3]), {"x": x})["y"]
    same_bits(out, x.astype(np.float32))


@pytest.mark.parametrize("target", ["x86_64-linux-gnu:x86-64", "x86_64-linux-gnu:x86-64-v3"], ids=["integer", "f16c"])
def test_float16_conversions_with_and_without_f16c(target):
    """Baseline x86-64 converts float16 with integer code, x86-64-v3 with F16C: both bit for bit."""
    import svodc

    h = all_encodings(dtypes.float16)
    f = interesting_float32()
    for src, dst, x, want in ((dtypes.float16, dtypes.float32, h, h.astype(np.float32)),
                              (dtypes.float32, dtypes.float16, f, f.astype(np.float16))):
        bundle = svodc.compile(cast_model(src, dst, [x.size]), target=target)
        with svodrt.load(bundle, threads=1) as m:
            same_bits(m.run({"x": x})["y"], want)


@pytest.mark.parametrize("dt", [d for d in FORMATS.values() if d is not dtypes.float16], ids=lambda d: d.name)
def test_runtime_decodes_bit_transported_floats_for_verify(dt):
    """svodrt verify compares bfloat16/float8/float4 outputs by value, decoding them without ml_dtypes."""
    from svodrt_tools.verify import float_values

    x = all_encodings(dt)
    with np.errstate(all="ignore"):
        want = x.astype(np.float64)
    got = float_values(to_storage(x, dt), dt.name)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])
