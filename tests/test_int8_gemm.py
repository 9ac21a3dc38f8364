"""The integer GEMM kernels (passes/lower_gemm_int8.py, codegen/llvm_gemm_int8.py): which products take
them, and their integers equal onnx.reference's on every dot-product path: vpmaddwd here (AVX2, and
SSE2 at the x86_64 floor), vpmaddubsw for 7-bit weights, sdot (aarch64 dotprod) and the generic one (aarch64 without it) under
unicorn; vpdpbusd (AVX512-VNNI, AVX-VNNI) is compiled and found in the code (this host cannot run it,
and Intel SDE is not installed here).

The model mixes what the kernels must handle: uint8 and int8 activations with zero points, a padded
3x3 convolution (its im2col padded with the zero point), per-channel weight zero points, weight rows
and activation columns that leave partial tiles, K not a multiple of 4, and products whose constant
is B (QLinearMatMul, MatMulInteger: the transposed GEMM, columns read with a stride)."""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import svodc
import svodrt
from svodc.codegen.llvm_gemm_int8 import int8_path
from svodc.frontend.importer import import_model
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.options import CompileOptions
from svodc.passes.pipeline import build_program
from svodc.policy import DEFAULT_POLICY
from svodc.target import parse_target
from svodrt.bundle import parse_bundle
from svodrt.host import Host
from svodrt.model import select_variant
from tests.cross.unicorn_run import run_unicorn

R = np.random.default_rng(21)
U8, I8, I32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32


def _init(name: str, v) -> TensorProto:
    return numpy_helper.from_array(np.asarray(v), name)


def int8_model(bound: int = 128):
    """x (uint8, 2x5x9x7) -> QLinearConv 3x3 pad 1 (13 ch) -> QLinearConv 1x1 (6 ch, per-channel zero points)
    -> y1; a (int8, 2x37x75) -> QLinearMatMul with B 75x10 -> y2; a -> MatMulInteger with B 75x21 -> y3
    (batch 2 everywhere: the GEMMs' batch strides). Weights within +-bound; at bound 64 (the vpmaddubsw
    path) the first filters are all +64 and -64 and the first image row 255: int16 pair sums at their
    largest, 255 * 64 * 2."""
    f = np.float32
    w1 = R.integers(-min(bound, 128), min(bound, 127) + 1, (13, 5, 3, 3)).astype(np.int8)
    if bound <= 64:
        w1[0], w1[1] = bound, -bound
    inits = [
        _init("xs", f(0.03)), _init("xz", np.uint8(117)), _init("w1", w1),
        _init("w1s", np.linspace(0.001, 0.004, 13).astype(f)), _init("w1z", np.zeros(13, np.int8)),
        _init("hs", f(0.9)), _init("hz", np.uint8(90)), _init("b1", R.integers(-3000, 3000, 13).astype(np.int32)),
        _init("w2", R.integers(-min(bound, 100), min(bound, 100), (6, 13, 1, 1), np.int8)), _init("w2s", f(0.004)),
        _init("w2z", np.array([0, 3, -5, 7, 0, -1], np.int8)), _init("ys", f(0.2)), _init("yz", np.uint8(130)),
        _init("as", f(0.05)), _init("az", np.int8(-7)), _init("b", R.integers(-bound, bound, (75, 10), np.int8)),
        _init("bs", f(0.02)), _init("bz", np.int8(0)), _init("y2s", f(1.5)), _init("y2z", np.int8(4)),
        _init("c", R.integers(-min(bound, 100), min(bound, 100), (75, 21), np.int8)), _init("cz", np.int8(2)),
    ]
    nodes = [
        helper.make_node("QLinearConv", ["x", "xs", "xz", "w1", "w1s", "w1z", "hs", "hz", "b1"], ["h"],
                         pads=[1, 1, 1, 1]),
        helper.make_node("QLinearConv", ["h", "hs", "hz", "w2", "w2s", "w2z", "ys", "yz"], ["y1"]),
        helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "y2s", "y2z"], ["y2"]),
        helper.make_node("MatMulInteger", ["a", "c", "az", "cz"], ["y3"]),
    ]
    g = helper.make_graph(nodes, "int8", [helper.make_tensor_value_info("x", U8, [2, 5, 9, 7]),
                                          helper.make_tensor_value_info("a", I8, [2, 37, 75])],
                          [helper.make_tensor_value_info(n, t, None) for n, t in (("y1", U8), ("y2", I8), ("y3", I32))],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {"x": R.integers(0, 256, (2, 5, 9, 7)).astype(np.uint8),
             "a": R.integers(-128, 128, (2, 37, 75)).astype(np.int8)}
    feeds["x"][:, :, 0] = 255
    return model, feeds


@pytest.fixture(scope="module")
def case():
    model, feeds = int8_model()
    return model, feeds, ReferenceEvaluator(model).run(None, feeds)


@pytest.fixture(scope="module")
def case7():
    """7-bit weights (quantize_static's reduce_range): the vpmaddubsw path on x86 without VNNI."""
    model, feeds = int8_model(64)
    return model, feeds, ReferenceEvaluator(model).run(None, feeds)


def _equal(got: dict[str, np.ndarray], want: list[np.ndarray], label: str) -> None:
    for (name, g), w in zip(got.items(), want, strict=True):
        assert g.dtype == w.dtype, f"{label} {name}"
        np.testing.assert_array_equal(g, w, err_msg=f"{label} {name}")


def test_every_product_takes_the_integer_gemm(case):
    model, _, _ = case
    options = CompileOptions()
    program = build_program(import_model(model, options), options)
    gemms = [s.arg for k in program.kernels for s in k.ast.src if s.op is Ops.GEMM]
    assert len(gemms) == 4 and all(g.quant is not None for g in gemms)
    assert {g.quant.b_signed for g in gemms} == {False, True}
    assert any(g.b.col_stride != 1 for g in gemms)  # activation x constant: the transposed product


@pytest.mark.parametrize("spec", ["host", "x86_64"])
def test_integers_equal_the_reference_here(case, spec):
    model, feeds, want = case
    t = parse_target(spec)[0]
    if spec != "host":  # the host's path is whatever its CPU has (vpdpbusd on a VNNI machine)
        assert int8_path(t) == "pmaddwd"
    with svodrt.load(svodc.compile(model, target=spec)) as m:
        _equal(m.run(feeds), want, spec)


@pytest.mark.parametrize("spec, path", [("host", None), ("x86_64", "pmaddwd"), ("x86_64:x86-64-v2", "pmaddubsw"),
                                        ("x86_64:x86-64-v3", "pmaddubsw")])
def test_7bit_weights_equal_the_reference_here(case7, spec, path):
    """SSE2 alone (the x86_64 floor) has no pmaddubsw (SSSE3)."""
    model, feeds, want = case7
    t = parse_target(spec)[0]
    if path is not None:
        assert int8_path(t, 64) == path and int8_path(t, 65) == "pmaddwd"
    with svodrt.load(svodc.compile(model, target=spec)) as m:
        _equal(m.run(feeds), want, spec)


@pytest.mark.parametrize("spec, path", [("aarch64", "generic"), ("aarch64:cortex-a76", "sdot")])
def test_integers_equal_the_reference_under_unicorn(case, spec, path):
    model, feeds, want = case
    t = parse_target(spec)[0]
    assert int8_path(t) == path
    _equal(run_unicorn(svodc.compile(model, target=spec), t.arch, set(t.features), feeds), want, spec)


@pytest.mark.parametrize("spec, path", [("x86_64:x86-64-v2+avx", "generic"), ("x86_64:x86-64-v3", "pmaddwd"),
                                        ("x86_64:skylake-avx512", "pmaddwd"), ("x86_64:znver4", "vnni"),
                                        ("x86_64:x86-64-v3+avxvnni", "vnni")])
def test_the_path_needs_integer_vectors_of_its_width(spec, path):
    """AVX alone has 256-bit float vectors only: such a CPU (Sandy Bridge, Bulldozer) gets the generic loop,
    not a vpmaddwd on ymm it cannot execute (LLVM refuses to select it)."""
    assert int8_path(parse_target(spec)[0]) == path


def _before_a_guard_page(a: np.ndarray) -> np.ndarray:
    """A copy of a whose last byte is followed by an inaccessible page: a read past it faults."""
    page = mmap.PAGESIZE
    pages = -(-a.nbytes // page) + 1
    region = mmap.mmap(-1, (pages + 1) * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(base + pages * page), page, 0) == 0
    out = np.frombuffer(region, a.dtype, a.size, offset=pages * page - a.nbytes).reshape(a.shape)
    out[...] = a
    return out


def test_bounded_dims_keep_integer_products_on_loops_that_take_run_time_extents():
    """The integer GEMM kernels take no run-time extent: with a bounded batch, the quantized products run on the
    generic loops, which stop at the call's size (a kernel sized at the bound would read past a smaller input:
    here the input ends at a guard page)."""
    model, _ = int8_model()
    for inp in model.graph.input:
        inp.type.tensor_type.shape.dim[0].dim_param = "N"
    options = CompileOptions(dims={"N": (1, 3)})
    program = build_program(import_model(model, options), options)
    assert not [s for k in program.kernels for s in k.ast.src if s.op is Ops.GEMM and s.arg.quant is not None]
    with svodrt.load(svodc.compile(model, target="host", options=options)) as m:
        for n in (1, 3):
            feeds = {"x": R.integers(0, 256, (n, 5, 9, 7)).astype(np.uint8),
                     "a": R.integers(-128, 128, (n, 37, 75)).astype(np.int8)}
            got = m.run({k: _before_a_guard_page(v) for k, v in feeds.items()})
            _equal(got, ReferenceEvaluator(model).run(None, feeds), f"N={n}")


def _disassembly(bundle: bytes, spec: str) -> str:
    """The variant's code image, disassembled by llvm-objdump (wrapped as an ELF object by llvm-objcopy)."""
    t = parse_target(spec)[0]
    b = parse_bundle(bundle)
    v = select_variant(b, Host(t.arch, frozenset(t.features)))
    elf = {"x86_64": "elf64-x86-64", "aarch64": "elf64-littleaarch64"}[t.arch]
    with tempfile.TemporaryDirectory() as d:
        Path(d, "code.bin").write_bytes(bundle[v.section.offset: v.section.offset + v.section.length])
        subprocess.run(["llvm-objcopy", "-I", "binary", "-O", elf, "--rename-section=.data=.text,alloc,load,readonly,code",
                        "code.bin", "code.o"], cwd=d, check=True)
        mattr = ["--mattr=+dotprod"] if t.arch == "aarch64" else []  # else shown as <unknown>
        return subprocess.run(["llvm-objdump", "-d", *mattr, "code.o"], cwd=d, capture_output=True, text=True,
                              check=True).stdout


@pytest.mark.skipif(not (shutil.which("llvm-objdump") and shutil.which("llvm-objcopy")),
                    reason="llvm-objdump / llvm-objcopy are not installed")
@pytest.mark.parametrize("spec, instruction", [("x86_64:znver4", r"vpdpbusd\s+%zmm"),
                                               ("x86_64:sapphirerapids", r"vpdpbusd\s+%zmm"),
                                               ("x86_64:x86-64-v3+avxvnni", r"\{vex\}\s*vpdpbusd\s+%ymm"),
                                               ("x86_64:x86-64-v3", r"vpmaddwd\s+%ymm"),
                                               ("aarch64:cortex-a76", r"sdot\s+v")])
def test_each_path_uses_its_instruction(case, spec, instruction):
    """VNNI variants cannot run here (Zen 3; no Intel SDE): their code is checked for vpdpbusd instead."""
    model, _, _ = case
    code = _disassembly(svodc.compile(model, target=spec), spec)
    assert re.search(instruction, code), f"no {instruction} in the {spec} code"
    if "vpdpbusd" in instruction:
        assert "vpmaddwd" not in code
    if spec.startswith("x86_64"):
        assert "vpmaddubsw" not in code  # full-range weights: never the saturating pair sums


@pytest.mark.skipif(not (shutil.which("llvm-objdump") and shutil.which("llvm-objcopy")),
                    reason="llvm-objdump / llvm-objcopy are not installed")
def test_7bit_weights_use_vpmaddubsw(case7):
    code = _disassembly(svodc.compile(case7[0], target="x86_64:x86-64-v3"), "x86_64:x86-64-v3")
    assert re.search(r"vpmaddubsw\s+%ymm", code)


def test_a_bundle_with_a_gpu_variant_keeps_generic_integer_loops(case):
    """The integer GEMM kernels are CPU code and a bundle holds one program: with a GPU variant the
    integer products stay generic loops, which both variants run (the CPU one here)."""
    model, feeds, want = case
    with svodrt.load(svodc.compile(model, target="host,sm_80")) as m:
        _equal(m.run(feeds), want, "host,sm_80")


def test_an_epilogue_reads_c_from_a_stack_tile_up_to_its_row_limit():
    """C of a GEMM with an epilogue goes to a per-thread stack tile (lower_gemm_int8.C_TILE) where M fits
    it: no M x N int32 scratch in the arena; past C_TILE_ROWS, the whole product (test_int8_exact covers
    both paths' integers)."""
    from svodc.passes.lower_gemm_int8 import C_TILE, C_TILE_ROWS

    for m, tiled in ((13, True), (C_TILE_ROWS + 16, False)):
        w = R.integers(-64, 64, (m, 64, 1, 1)).astype(np.int8)
        g = helper.make_graph(
            [helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])], "c",
            [helper.make_tensor_value_info("x", U8, [1, 64, 8, 8])], [helper.make_tensor_value_info("y", U8, None)],
            [_init("xs", np.float32(0.02)), _init("xz", np.uint8(3)), _init("w", w), _init("ws", np.float32(0.01)),
             _init("wz", np.int8(0)), _init("ys", np.float32(0.05)), _init("yz", np.uint8(100))])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
        program = build_program(import_model(model, CompileOptions()), CompileOptions())
        gemm, = [s.arg for k in program.kernels for s in k.ast.src if s.op is Ops.GEMM]
        assert gemm.quant.c_tile == (C_TILE if tiled else 0)
        assert any(b.shape[-2:] == (m, 64) for b in program.scratch) != tiled


def _requant_conv(m: int, y_type: int, y_zero: int, float32_exact: bool):
    """x (uint8, 1x11x5x7) -> QLinearConv 1x1 with bias, m filters -> y of y_type: 35 columns (a partial
    last vector of 8 lanes and a partial lane tile), K = 11 (not a multiple of 4). The output scale is
    the first of a seeded sequence whose factor float32 rescales exactly (or not: the float64 form)."""
    from svodc.frontend.ops.rescale_exact import float32_rescale_is_exact

    f = np.float32
    lo, hi = (0, 255) if y_type == U8 else (-128, 127)
    xs, ws, r = f(0.02), f(0.004), np.random.default_rng(3)
    while True:
        ys = f(r.uniform(0.01, 0.05))
        if float32_rescale_is_exact(np.array([f(xs * ws) / ys], f), np.array([y_zero]), lo, hi) == float32_exact:
            break
    y_np = np.uint8 if y_type == U8 else np.int8
    g = helper.make_graph(
        [helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"])], "rq",
        [helper.make_tensor_value_info("x", U8, [1, 11, 5, 7])], [helper.make_tensor_value_info("y", y_type, None)],
        [_init("xs", xs), _init("xz", np.uint8(121)), _init("w", R.integers(-64, 65, (m, 11, 1, 1)).astype(np.int8)),
         _init("ws", ws), _init("wz", np.int8(0)), _init("ys", ys), _init("yz", y_np(y_zero)),
         _init("b", R.integers(-4000, 4000, m).astype(np.int32))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    return model, {"x": R.integers(0, 256, (1, 11, 5, 7)).astype(np.uint8)}


# 13 rows: a last weight panel of 1 row; C_TILE_ROWS + 3: the whole-product scratch (c_tile 0).
@pytest.mark.parametrize("m", [13, 1027])
@pytest.mark.parametrize("y_type, y_zero, float32_exact", [(U8, 0, True), (I8, -5, True), (U8, 77, False)])
@pytest.mark.parametrize("spec", ["host", "x86_64:x86-64-v2"])
def test_requantization_runs_on_the_accumulators_in_registers(m, y_type, y_zero, float32_exact, spec):
    """An integer GEMM's epilogue (bias, the float32 or float64 rescale, zero point, saturation to 8
    bits) runs on the micro-kernel's accumulators, C never stored (llvm_gemm_int8._vector_epilogue), and
    gives onnx.reference's integers; x86-64-v2: 4-lane vectors."""
    from svodc.codegen.llvm_gemm_int8 import _vector_epilogue
    from svodc.codegen.llvm_ir import KernelEmitter
    from svodc.policy import policy_for

    model, feeds = _requant_conv(m, y_type, y_zero, float32_exact)
    options = CompileOptions()
    target = parse_target(spec)[0]
    program = build_program(import_model(model, options), options)
    (kernel, gemm), = [(k, s) for k in program.kernels for s in k.ast.src if s.op is Ops.GEMM]
    em = KernelEmitter(kernel.name, kernel.ast, target)
    assert _vector_epilogue(em, gemm, policy_for(target, options.policies).blocking(target)) is not None
    rescale = {x.dtype for x in gemm.src[4].toposort() if x.op is Ops.ROUND}
    assert rescale == {dtypes.float32 if float32_exact else dtypes.float64}
    with svodrt.load(svodc.compile(model, target=spec)) as mod:
        _equal(mod.run(feeds), ReferenceEvaluator(model).run(None, feeds), spec)


@pytest.mark.parametrize("columns", [33, 49])
def test_a_last_lane_tile_of_one_lane_stores_one_byte(columns):
    """A QLinearConv whose last lane tile has one column in its last vector (33 = 32 + 1 and 49 = 32 + 16 + 1
    on AVX-512's 32-lane tiles): LLVM had widened that one-lane u8 store to 4 bytes, overwriting the
    next row's first 3 outputs and writing past the last row. Runs the host's own variant (AVX-512 where
    it has it); its integers equal onnx.reference's."""
    r = np.random.default_rng(3)
    c = 64
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8),
             "w": r.integers(-63, 64, (c, c, 1, 1)).astype(np.int8), "ws": np.full(c, 0.01, np.float32),
             "wz": np.zeros(c, np.int8), "ys": np.array(0.5, np.float32), "yz": np.array(128, np.uint8),
             "b": r.integers(-1000, 1000, c).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, c, 1, columns])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = r.integers(0, 256, (1, c, 1, columns)).astype(np.uint8)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    with svodrt.load(svodc.compile(model)) as m:
        np.testing.assert_array_equal(m.run({"x": x})["y"], want)


def gemv_model(n: int, bound: int = 128):
    """Products of n <= GEMV_N_MAX activation columns (lanes along m, codegen/llvm_gemv_int8.py): a (int8,
    2 x n x 75) -> QLinearMatMul with B 75 x 37 -> y2 (an epilogue: requantized); u (uint8, n x 75) ->
    MatMulInteger with C 75 x 37 -> y3 (C itself, int32). M = 37 leaves a short last panel, K = 75 a partial
    group of 4. (Both past policy.gemm_min_macs with the policy of `gemv_options`.)"""
    f = np.float32
    inits = [_init("as", f(0.05)), _init("az", np.int8(-7)),
             _init("b", R.integers(-bound, min(bound, 127) + 1, (75, 37)).astype(np.int8)),
             _init("bs", f(0.02)), _init("bz", np.int8(0)), _init("y2s", f(1.5)), _init("y2z", np.int8(4)),
             _init("c", R.integers(-min(bound, 100), min(bound, 100), (75, 37)).astype(np.int8)),
             _init("uz", np.uint8(131)), _init("cz", np.int8(2))]
    nodes = [helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "y2s", "y2z"], ["y2"]),
             helper.make_node("MatMulInteger", ["u", "c", "uz", "cz"], ["y3"])]
    g = helper.make_graph(nodes, "gemv", [helper.make_tensor_value_info("a", I8, [2, n, 75]),
                                          helper.make_tensor_value_info("u", U8, [n, 75])],
                          [helper.make_tensor_value_info("y2", I8, None), helper.make_tensor_value_info("y3", I32, None)],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {"a": R.integers(-128, 128, (2, n, 75)).astype(np.int8), "u": R.integers(0, 256, (n, 75)).astype(np.uint8)}
    return model, feeds


# the small products of gemv_model take the GEMM kernels too (the default policy leaves tiny ones to loops)
GEMV_OPTIONS = CompileOptions(policies={"*": dataclasses.replace(DEFAULT_POLICY, gemm_min_macs=1)})


@pytest.mark.parametrize("n", [1, 2, 4])
def test_few_activation_columns_run_with_lanes_along_m(n):
    """lower_gemm_int8.GEMV_N_MAX: the product takes the integer kernel with its lanes along m (transposed)."""
    model, feeds = gemv_model(n)
    program = build_program(import_model(model, GEMV_OPTIONS), GEMV_OPTIONS, GEMV_OPTIONS.policies["*"])
    gemms = [s.arg for k in program.kernels for s in k.ast.src if s.op is Ops.GEMM]
    assert len(gemms) == 2 and all(g.quant is not None and g.transposed and g.n == n for g in gemms)
    with svodrt.load(svodc.compile(model, options=GEMV_OPTIONS)) as m:
        _equal(m.run(feeds), ReferenceEvaluator(model).run(None, feeds), f"n={n}")


@pytest.mark.parametrize("spec, bound", [("x86_64", 128), ("x86_64:x86-64-v3", 64), ("x86_64:x86-64-v3", 128)])
def test_few_activation_columns_on_each_x86_path(spec, bound):
    """pmaddwd (SSE2: four 4-lane vectors per panel), vpmaddubsw (AVX2, 7-bit weights), vpmaddwd (AVX2)."""
    model, feeds = gemv_model(3, bound)
    with svodrt.load(svodc.compile(model, target=spec, options=GEMV_OPTIONS)) as m:
        _equal(m.run(feeds), ReferenceEvaluator(model).run(None, feeds), spec)


@pytest.mark.parametrize("spec", ["aarch64", "aarch64:cortex-a76"])
def test_few_activation_columns_under_unicorn(spec):
    model, feeds = gemv_model(2)
    t = parse_target(spec)[0]
    _equal(run_unicorn(svodc.compile(model, target=spec, options=GEMV_OPTIONS), t.arch, set(t.features), feeds),
           ReferenceEvaluator(model).run(None, feeds), spec)
