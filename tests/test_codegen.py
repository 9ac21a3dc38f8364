"""Codegen: transcendental rewrites against float64 references, special values, integer division
that never traps, and the linker's refusals."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from onnx import helper

from svodc.codegen.elf import read_object
from svodc.codegen.link import link
from svodc.codegen.llvm_job import LLVMJob, compile_llvm
from svodc.errors import LinkError
from svodc.policy import LLVM_MIN_TRIP_COUNT, gemm_blocking
from svodc.target import parse_target
from tests.onnx_util import compile_and_run, make_model, reference

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, 3.4e38, -3.4e38, 1.0, -1.0],
                   np.float32)


def sweep(dtype) -> np.ndarray:
    r = np.random.default_rng(1)
    xs = [np.linspace(-20, 20, 4001), r.uniform(-100, 100, 2000), np.exp(r.uniform(-80, 80, 2000)),
          -np.exp(r.uniform(-80, 80, 500)), np.linspace(-1e-3, 1e-3, 501)]
    return np.concatenate(xs).astype(dtype)


def run_unary(op: str, x: np.ndarray, **attrs) -> np.ndarray:
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": (x.dtype, list(x.shape))}, ["y"])
    return compile_and_run(model, {"x": x})["y"]


def ulp_error(got: np.ndarray, want: np.ndarray, dtype) -> float:
    finite = np.isfinite(want) & (np.abs(want) > np.finfo(dtype).tiny) & (np.abs(want) < np.finfo(dtype).max)
    spacing = np.spacing(np.abs(want[finite]).astype(dtype)).astype(np.float64)
    return float(np.max(np.abs(got[finite].astype(np.float64) - want[finite]) / spacing))


REFS = {"Exp": np.exp, "Log": np.log, "Tanh": np.tanh, "Sin": np.sin,
        "Erf": np.vectorize(math.erf, otypes=[np.float64])}


@pytest.mark.parametrize("op,max_ulp", [("Exp", 3), ("Log", 3), ("Tanh", 4), ("Sin", 4)])
def test_float32_transcendentals_are_accurate(op, max_ulp):
    x = sweep(np.float32)
    if op == "Log":
        x = np.abs(x)
    if op == "Sin":
        x = x[np.abs(x) < 1000]
    got = run_unary(op, x)
    with np.errstate(all="ignore"):
        want = REFS[op](x.astype(np.float64))
    assert ulp_error(got, want, np.float32) <= max_ulp


def test_erf_absolute_error():
    x = sweep(np.float32)
    got = run_unary("Erf", x).astype(np.float64)
    want = REFS["Erf"](x.astype(np.float64))
    assert np.max(np.abs(got - want)) < 3e-7
    small = np.abs(x) < 1
    assert np.max(np.abs(got[small] - want[small]) / np.maximum(np.abs(want[small]), 1e-30)) < 1e-6


@pytest.mark.parametrize("op", ["Exp", "Log", "Tanh", "Erf", "Sin", "Sqrt", "Abs", "Neg"])
def test_special_values_follow_ieee(op):
    x = SPECIAL if op != "Sin" else SPECIAL[np.isfinite(SPECIAL) | np.isnan(SPECIAL)]
    ref = {"Sqrt": np.sqrt, "Abs": np.abs, "Neg": np.negative}.get(op) or REFS[op]
    with np.errstate(all="ignore"):
        want = ref(x.astype(np.float64)).astype(np.float32)
    got = run_unary(op, x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want) & ((np.abs(x) < 1e5) | (op != "Sin"))  # sin of huge values: bounded, not exact
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-6, atol=1e-30)


def test_float64_exp_log_are_double_precision():
    x = np.linspace(-700, 700, 5001)
    assert ulp_error(run_unary("Exp", x), np.exp(x), np.float64) <= 4
    y = np.exp(np.linspace(-700, 700, 5001))
    assert ulp_error(run_unary("Log", y), np.log(y), np.float64) <= 4


def test_pow_cases():
    a = np.array([2.0, 2.0, -2.0, -2.0, -2.0, 0.0, 0.0, 0.0, 1.0, np.nan, 9.0, 0.5], np.float32)
    b = np.array([10.0, -1.5, 3.0, 2.0, 0.5, 2.0, 0.0, -1.0, np.nan, 0.0, 0.5, 20.0], np.float32)
    model = make_model([helper.make_node("Pow", ["a", "b"], ["y"])], {"a": (np.float32, [12]), "b": (np.float32, [12])},
                       ["y"])
    got = compile_and_run(model, {"a": a, "b": b})["y"]
    with np.errstate(all="ignore"):
        want = np.power(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=3e-6, equal_nan=True)


def test_integer_division_never_traps():
    a = np.array([7, -7, 7, -7, -(2**31), 5, 0], np.int32)
    b = np.array([2, 2, -2, -2, -1, 0, 0], np.int32)
    model = make_model([helper.make_node("Div", ["a", "b"], ["y"])], {"a": (np.int32, [7]), "b": (np.int32, [7])}, ["y"])
    got = compile_and_run(model, {"a": a, "b": b})["y"]
    np.testing.assert_array_equal(got, [3, -3, -3, 3, -(2**31), 0, 0])


def _object(ir: str) -> bytes:
    t = parse_target("x86_64-linux-gnu:x86-64")[0]
    obj, _ = compile_llvm(LLVMJob("test", ir, t.triple, t.llvm_cpu, t.llvm_features, 2, "small", False))
    return obj


def test_linker_refuses_undefined_symbols():
    ir = """
declare float @expf(float)
define float @k(float %x) nounwind { %y = call float @expf(float %x)
  ret float %y }
"""
    with pytest.raises(LinkError, match="undefined symbol 'expf'"):
        link([read_object(_object(ir), "k.o")], ["k"])


def test_linker_refuses_writable_data():
    ir = """
@counter = global i32 0
define i32 @k() nounwind { %v = atomicrmw add ptr @counter, i32 1 seq_cst
  ret i32 %v }
"""
    with pytest.raises(LinkError, match="writable"):
        link([read_object(_object(ir), "k.o")], ["k"])


def test_linker_resolves_calls_between_objects_and_constant_pools():
    a = """
declare float @g(float)
define float @f(float %x) nounwind { %y = call float @g(float %x)
  %z = fmul float %y, 0x400921FB60000000
  ret float %z }
"""
    b = """
@tbl = internal constant [4 x float] [float 1.0, float 2.0, float 3.0, float 4.0]
define float @g(float %x) nounwind { %i = fptosi float %x to i64
  %j = and i64 %i, 3
  %p = getelementptr [4 x float], ptr @tbl, i64 0, i64 %j
  %v = load float, ptr %p
  ret float %v }
"""
    image = link([read_object(_object(a), "a.o"), read_object(_object(b), "b.o")], ["f", "g"])
    assert set(image.symbols) == {"f", "g"} and image.symbols["f"] != image.symbols["g"]
    import ctypes
    import mmap

    buf = mmap.mmap(-1, max(len(image.data), mmap.PAGESIZE), prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(image.data)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    f = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_float)(addr + image.symbols["f"])
    assert f(2.0) == pytest.approx(3.0 * math.pi, rel=1e-6)
    del f


def test_a_chain_of_20000_sin_nodes_lowers_and_emits_without_recursion():
    """Graph depth costs heap, not Python stack: a 2e4-node chain (fused into kernels of at most
    the policy's max_fused_ops nodes, each ~40 ops deep after the polynomial rewrite) goes through every
    pass and LLVM IR emission at the interpreter's default recursion limit."""
    from svodc.codegen.compile import prepare_kernel
    from svodc.codegen.llvm_ir import render_body
    from svodc.ir.dtypes import dtypes
    from svodc.ir.ops import InputArg, Ops
    from svodc.ir.provenance import Provenance
    from svodc.ir.uop import UOp
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program
    from svodc.policy import DEFAULT_POLICY
    from svodc.program import ImportedGraph

    x = UOp(Ops.INPUT, dtypes.float32, (), InputArg("x", (4,)))
    y = x
    for _ in range(20_000):
        y = UOp(Ops.SIN, dtypes.float32, (y,))
    program = build_program(ImportedGraph([("x", x)], [("y", y)], Provenance(), "test"), CompileOptions())
    assert len(program.kernels) >= 20_000 // DEFAULT_POLICY.max_fused_ops
    target = parse_target("x86_64:x86-64")[0]
    deepest = program.kernels[0]  # a full one: max_fused_ops Sin nodes
    text, _, _ = render_body(prepare_kernel(deepest, target), target, gemm_blocking(target))
    assert text.count("fmuladd") + text.count("fmul") > DEFAULT_POLICY.max_fused_ops // 2  # the polynomials are all there


def test_a_deep_chain_compiles_and_computes():
    """A chain deeper than Python's recursion limit in one kernel, end to end (at opt level 0: LLVM's
    optimizer is what costs time on one long function, and it is not under test here)."""
    n = 1500
    nodes = [helper.make_node("Add", [f"t{i}", "t0"], [f"t{i + 1}"]) for i in range(n)]
    model = make_model(nodes, {"t0": (np.float32, [8])}, [f"t{n}"])
    x = np.arange(-4, 4, dtype=np.float32)
    got = compile_and_run(model, {"t0": x}, opt_level=0, test_vectors=False)[f"t{n}"]
    np.testing.assert_array_equal(got, x * (n + 1))  # small integers: every partial sum is exact


def test_identical_kernels_share_one_compiled_body():
    """Kernels with the same code over different buffers (two equal convolutions with their own
    weights, and their epilogues) are compiled once: one body, a wrapper per kernel."""
    from svodc.codegen.compile import prepare_kernel
    from svodc.codegen.units import kernel_modules
    from svodc.frontend.importer import import_model
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program
    from svodc.target import host_target

    r = np.random.default_rng(5)
    w1, w2 = (r.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1 for _ in range(2))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c2"], ["y"])]
    model = make_model(nodes, {"x": (np.float32, [1, 16, 12, 12])}, ["y"], {"w1": w1, "w2": w2})
    program = build_program(import_model(model), CompileOptions())
    target = host_target()
    kernels = [prepare_kernel(k, target) for k in program.kernels]
    modules = kernel_modules(kernels, len(program.inputs), target, gemm_blocking(target), per_module=4)
    *body_modules, (_, wrapped, wrappers_ir) = modules
    bodies = sum(ir.count("define internal void @k") for _, _, ir in body_modules)
    assert wrapped == kernels and wrappers_ir.count("define void @") == len(kernels)
    assert bodies < len(kernels), (bodies, len(kernels))
    x = r.standard_normal((1, 16, 12, 12)).astype(np.float32)
    from tests.onnx_util import reference

    np.testing.assert_allclose(compile_and_run(model, {"x": x})["y"], reference(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def _depthwise(c: int, size: int, stride: int, relu: bool = False):
    """A depthwise 3x3 convolution (relu: with a bias and a Relu behind it, mobilenet's pattern)."""
    r = np.random.default_rng(0)
    inits = {"w": r.standard_normal((c, 1, 3, 3)).astype(np.float32), "b": r.standard_normal(c).astype(np.float32)}
    conv = helper.make_node("Conv", ["x", "w", "b"] if relu else ["x", "w"], ["c" if relu else "y"], kernel_shape=[3, 3],
                            strides=[stride, stride], pads=[1, 1, 1, 1], group=c)
    nodes = [conv, helper.make_node("Relu", ["c"], ["y"])] if relu else [conv]
    return make_model(nodes, {"x": (np.float32, [1, c, size, size])}, ["y"], inits if relu else {"w": inits["w"]})


def _kernels_asm(model, spec: str, vector_min_trip_count: int = LLVM_MIN_TRIP_COUNT) -> str:
    """The assembly of the model's kernels for one CPU target, compiled in this process."""
    from svodc.codegen.compile import prepare_kernel
    from svodc.codegen.units import kernel_modules
    from svodc.frontend.importer import import_model
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program

    program = build_program(import_model(model), CompileOptions())
    t = parse_target(spec)[0]
    kernels = [prepare_kernel(k, t) for k in program.kernels]
    return "".join(compile_llvm(LLVMJob("k", ir, t.triple, t.llvm_cpu, t.llvm_features, 2, "small", True,
                                        vector_min_trip_count=vector_min_trip_count))[1]
                   for _, _, ir in kernel_modules(kernels, len(program.inputs), t, gemm_blocking(t), 64))


def test_x86_code_vectorizes_without_gathers():
    """LLVM's loop vectorizer took a depthwise convolution across channels with vgather (slow on AMD Zen
    and, since the Downfall microcode, on Intel); x86 targets ask it not to (arches.py)."""
    asm = _kernels_asm(_depthwise(64, 14, 2), "x86_64:x86-64-v4")
    assert "vgather" not in asm and "vscatter" not in asm


def test_short_loops_on_avx2_take_a_scalar_remainder_not_masked_tails():
    """A 7-wide output row is shorter than LLVM's tiny-loop threshold (16), under which LLVM folds the row's
    tail into vmaskmovps loads and stores (their stores microcoded on AMD Zen) or leaves the row scalar. At 4
    (AVX2 targets: svodc/policy.py) the row takes 4 lanes and a scalar remainder. The option is set per job:
    the same process gives each value's code in any order."""
    model = _depthwise(32, 7, 1, relu=True)

    def fmas(asm: str, kind: str) -> int:  # FMAs and multiplies: "ps" on xmm (4 lanes), "ss" (scalar)
        return len(re.findall(rf"^\s+v(?:fmadd\w*|mul){kind}\s" + ("[^\n]*%xmm" if kind == "ps" else ""), asm, re.M))

    tiny, four, again = (_kernels_asm(model, "x86_64:x86-64-v3", n) for n in (LLVM_MIN_TRIP_COUNT, 4, LLVM_MIN_TRIP_COUNT))
    assert tiny == again != four
    assert "vmaskmovps" not in four and fmas(four, "ps") >= 9 and fmas(four, "ss") >= 9
    assert "vmaskmovps" in tiny or fmas(tiny, "ps") == 0  # masked, or no 4-lane vectors: LLVM's cost model decides


def _max_pool(c: int, size: int):
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2])
    return make_model([node], {"x": (np.float32, [1, c, size, size])}, ["y"])


def test_a_max_pool_window_is_the_machines_max_with_one_nan_test():
    """lower._unrolled_reduce: a float max over a window is maxps steps plus one NaN test over the taps, not a
    compare, NaN check, or and select per tap (MaxPool 3x3 stride 2 over 64 x 111 x 111: 0.161 -> 0.092 ms, Zen 4)."""
    asm = _kernels_asm(_max_pool(64, 111), "x86_64:x86-64-v4")
    assert asm.count("vmaxps") >= 8 and "vcmpltps" not in asm and "vcmpnleps" not in asm


def test_a_max_pool_propagates_nan_as_numpy_does():
    from numpy.lib.stride_tricks import sliding_window_view

    import svodc
    import svodrt

    x = np.random.default_rng(0).standard_normal((1, 8, 23, 23)).astype(np.float32)
    x.ravel()[::41] = np.nan
    x[0, 1, :3, :3] = -0.0  # a window of signed zeros only
    with svodrt.load(svodc.compile(_max_pool(8, 23))) as m:
        y = m.run({"x": x})["y"]
    want = sliding_window_view(x, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(-1, -2))
    assert np.isnan(want).any() and np.array_equal(y, want, equal_nan=True)
    assert np.array_equal(np.signbit(y), np.signbit(want))


def test_exp_near_overflow_and_into_the_subnormal_range():
    # n = 128 needs 2**n in two factors; below -87.3 the result is subnormal and must round once
    big = np.linspace(88.0, 88.72, 2001).astype(np.float32)
    tiny = np.linspace(-103.9, -87.4, 2001).astype(np.float32)
    edges = np.array([88.73, 89.0, 1e4, -104.5, -110.0, -1e4], np.float32)
    got = run_unary("Exp", np.concatenate([big, tiny, edges]))
    assert ulp_error(got[:2001], np.exp(big.astype(np.float64)), np.float32) <= 3
    assert np.max(np.abs(got[2001:4002].astype(np.float64) - np.exp(tiny.astype(np.float64)))) <= 2 * 2.0 ** -149
    np.testing.assert_array_equal(got[4002:], [np.inf, np.inf, np.inf, 0, 0, 0])


@pytest.mark.parametrize("op,attrs", [("Relu", {}), ("Clip", {"min": -1.0, "max": 1.0}), ("LeakyRelu", {})])
def test_clamps_by_a_constant_keep_nan(op, attrs):
    # a max/min against a constant is one unordered compare (llvm_alu.float_minmax): NaN must still come through
    x = np.array([np.nan, -np.nan, -2.0, -0.0, 0.0, 0.5, 3.0, np.inf, -np.inf], np.float32)
    if op == "Clip":
        model = make_model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], {"x": (np.float32, [9])}, ["y"],
                           {"lo": np.array(attrs["min"], np.float32), "hi": np.array(attrs["max"], np.float32)})
        got = compile_and_run(model, {"x": x})["y"]
    else:
        got = run_unary(op, x, **attrs)
    want = reference(model if op == "Clip" else
                     make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": (np.float32, [9])}, ["y"]),
                     {"x": x})[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok], want[ok])
