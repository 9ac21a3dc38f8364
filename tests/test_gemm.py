"""The contraction path (conv -> im2col + GEMM, MATMUL -> GEMM): shapes that hit every tile edge,
constant and run-time operands, batches with broadcasts, the transposed mode, fused epilogues."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import svodc
import svodrt
from svodc.frontend.importer import import_model
from svodc.ir.ops import Ops
from svodc.options import CompileOptions
from svodc.passes.pipeline import build_program
from tests.onnx_util import compile_and_run, make_model, reference

R = np.random.default_rng(3)


def rand(*shape):
    return R.standard_normal(shape).astype(np.float32)


def gemm_kernels(model) -> list:
    program = build_program(import_model(model), CompileOptions())
    return [k.ast.src[0].arg for k in program.kernels if k.ast.src[0].op is Ops.GEMM]


@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (37, 50, 45), (1, 300, 77), (2, 129, 200), (9, 1, 513),
                                   (512, 576, 49), (130, 100, 20), (8, 17, 16), (7, 64, 15)])
@pytest.mark.parametrize("constant", ["a", "b", "none"])
def test_matmul_shapes(m, k, n, constant):
    a, b = rand(m, k), rand(k, n)
    inits = {"a": a} if constant == "a" else {"b": b} if constant == "b" else {}
    inputs = {x: (np.float32, list(v.shape)) for x, v in (("a", a), ("b", b)) if x not in inits}
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], inputs, ["y"], inits)
    feeds = {x: v for x, v in (("a", a), ("b", b)) if x not in inits}
    got = compile_and_run(model, feeds)["y"]
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_transposed_mode_is_chosen_for_small_n_and_correct():
    a, b, bias = rand(512, 576), rand(576, 49), rand(512, 1)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["t"]), helper.make_node("Add", ["t", "bias"], ["y"])],
                       {"b": (np.float32, [576, 49])}, ["y"], {"a": a, "bias": bias})
    args = gemm_kernels(model)
    assert len(args) == 1 and args[0].transposed and args[0].a.packed
    got = compile_and_run(model, {"b": b})["y"]
    np.testing.assert_allclose(got, a.astype(np.float64) @ b + bias, rtol=1e-4, atol=1e-3)


def test_batched_matmul_with_broadcast_batch_axes():
    a, b = rand(2, 3, 17, 40), rand(3, 40, 33)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": (np.float32, [2, 3, 17, 40]),
                       "b": (np.float32, [3, 40, 33])}, ["y"])
    assert gemm_kernels(model)[0].batch == (2, 3)
    got = compile_and_run(model, {"a": a, "b": b})["y"]
    np.testing.assert_allclose(got, np.matmul(a.astype(np.float64), b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("a_shape,b_shape", [((128, 1, 96), (96, 80)), ((2, 3, 17, 40), (40, 33)), ((4, 5, 24), (24,))])
@pytest.mark.parametrize("permuted", [False, True])
def test_one_b_for_every_batch_is_one_gemm_over_all_rows(a_shape, b_shape, permuted):
    """A 2-D (or 1-D) B broadcast over A's batch: the batch rows are rows of one GEMM (a PyTorch export's
    [seq, 1, E] @ W: 128 GEMMs of one row each ran at a third of the 2-D GEMM's speed), also when A is a
    permuted view that has to be copied first."""
    a, b = rand(*a_shape), rand(*b_shape)
    perm = [1, 0, *range(2, len(a_shape))]
    x = np.ascontiguousarray(a.transpose(perm)) if permuted else a
    nodes = [helper.make_node("Transpose", ["x"], ["a"], perm=perm)] if permuted else []
    model = make_model([*nodes, helper.make_node("MatMul", ["a" if permuted else "x", "b"], ["y"])],
                       {"x": (np.float32, list(x.shape))}, ["y"], {"b": b})
    if len(b_shape) == 2:  # a matrix-vector product is too small for the GEMM kernels: only its values
        args = gemm_kernels(model)
        assert len(args) == 1 and args[0].batch in ((), (1,)) and args[0].m == int(np.prod(a_shape[:-1]))
    got = compile_and_run(model, {"x": x})["y"]
    np.testing.assert_allclose(got, np.matmul(a.astype(np.float64), b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("a_shape", [[2, "S", 128], ["S", 4, 128], ["N", "S", 128]])
def test_one_b_for_every_batch_over_bounded_dims_keeps_the_gemm(a_shape):
    """With a bounded dim among A's leading axes the batch is not folded into rows (the merged axis would be
    dim * factor, which no GEMM takes: a review found gpt2 at bounded seq refused and [S, 4, K] @ W 57x
    slower); the product still runs on the GEMM kernels and is right at every size."""
    b = rand(128, 96)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": (np.float32, a_shape)}, ["y"], {"b": b})
    dims = {d: (1, 64) for d in a_shape if isinstance(d, str)}
    options = CompileOptions(dims=dims)
    program = build_program(import_model(model, options), options)
    assert any(k.ast.src[0].op is Ops.GEMM for k in program.kernels)
    with svodrt.load(svodc.compile(model, dims=dims), threads=1) as m:
        for size in (1, 37, 64):
            a = rand(*[size if isinstance(d, str) else d for d in a_shape])
            np.testing.assert_allclose(m.run({"a": a})["y"], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_attention_like_transposed_operand_is_copied_contiguous():
    q, kt = rand(1, 4, 32, 16), rand(1, 4, 32, 16)
    model = make_model([helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
                        helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["y"])],
                       {"q": (np.float32, [1, 4, 32, 16]), "k": (np.float32, [1, 4, 32, 16])}, ["y"])
    feeds = {"q": q, "k": kt}
    np.testing.assert_allclose(compile_and_run(model, feeds)["y"], reference(model, feeds)[0], rtol=1e-4, atol=1e-6)


def test_conv_batchnorm_relu_residual_fuse_into_one_gemm():
    x = rand(2, 16, 12, 12)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Add", ["bn", "x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    inits = {"w": rand(16, 16, 3, 3) * 0.2, "s": rand(16), "b": rand(16), "m": rand(16),
             "v": np.abs(rand(16)) + 0.5}
    model = make_model(nodes, {"x": (np.float32, [2, 16, 12, 12])}, ["y"], inits)
    program = build_program(import_model(model), CompileOptions())
    gemms = [k for k in program.kernels if k.ast.src[0].op is Ops.GEMM]
    assert len(gemms) == 1 and len(gemms[0].ast.src[0].src) > 3  # one GEMM, with an epilogue
    got = compile_and_run(model, {"x": x})["y"]
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_grouped_and_strided_convolutions(threads):
    x = rand(1, 12, 15, 13)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], group=3, strides=[2, 1], pads=[1, 0, 2, 1]),
             helper.make_node("Relu", ["a"], ["b"]), helper.make_node("Conv", ["b", "w2"], ["y"])]
    model = make_model(nodes, {"x": (np.float32, [1, 12, 15, 13])}, ["y"],
                       {"w1": rand(24, 4, 3, 3), "w2": rand(8, 24, 1, 1)})
    got = compile_and_run(model, {"x": x}, threads=threads)["y"]
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,w_shape,kernel", [
    ((1, 24, 40, 40), (24, 1, 2, 2), [2, 2]),  # the segmentation-head upsampling: one output channel
    ((2, 8, 5, 7), (8, 6, 3, 3), [3, 3]),
    ((1, 16, 64), (16, 4, 2), [2]),
])
def test_conv_transpose_with_kernel_equal_to_strides_is_one_matrix_product(shape, w_shape, kernel):
    """ConvTranspose whose kernel equals its strides (no pads, no dilation) is compiled as one GEMM
    over x in place plus a depth-to-space move (frontend/ops/nn.py); results match onnxruntime."""
    r = np.random.default_rng(5)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=kernel, strides=kernel)
    inits = {"w": r.standard_normal(w_shape).astype(np.float32), "b": r.standard_normal(w_shape[1]).astype(np.float32)}
    model = make_model([node], {"x": (np.float32, list(shape))}, ["y"], inits)
    program = build_program(import_model(model, CompileOptions()), CompileOptions())
    assert any(s.op is Ops.GEMM for k in program.kernels for s in k.ast.src)
    feeds = {"x": r.standard_normal(shape).astype(np.float32)}
    got = compile_and_run(model, feeds)["y"]
    np.testing.assert_allclose(got, reference(model, feeds)[0], rtol=1e-4, atol=1e-5)


# Blockings other than the host's own (svodc/policy.py): odd tiles, a k unroll that leaves remainders,
# AVX-512-sized register budgets on AVX2 registers, k blocks of a few steps (the last one shorter, the
# fused Relu after the last): every tile and k edge must still give the product.
@pytest.mark.parametrize("blocking", [dict(accumulators=12, max_rows=8, k_unroll=3),
                                      dict(accumulators=4, max_rows=3, k_unroll=1, k_block_bytes=200),
                                      dict(accumulators=16, vector_regs=32, max_rows=8, k_unroll=4),
                                      dict(k_unroll=2, lanes_first_max_panel=0, k_block_bytes=1000, copy_all_bytes=0),
                                      dict(k_unroll=2, lanes_first_max_panel=0, copy_all_bytes=2000,
                                           copy_all_min_k_block=4)])
@pytest.mark.parametrize("constant", ["a", "b", "none"])
def test_other_blockings_keep_the_product(blocking, constant):
    import dataclasses

    from svodc.policy import DEFAULT_POLICY, gemm_blocking
    from svodc.target import host_target

    policy = dataclasses.replace(DEFAULT_POLICY, cpu_gemm=dataclasses.replace(gemm_blocking(host_target()), **blocking))
    for m, k, n in [(37, 50, 45), (130, 7, 20), (9, 2, 513), (64, 66, 49)]:
        a, b = rand(m, k), rand(k, n)
        inits = {"a": a} if constant == "a" else {"b": b} if constant == "b" else {}
        inputs = {x: (np.float32, list(v.shape)) for x, v in (("a", a), ("b", b)) if x not in inits}
        model = make_model([helper.make_node("MatMul", ["a", "b"], ["p"]), helper.make_node("Relu", ["p"], ["y"])],
                           inputs, ["y"], inits)
        got = compile_and_run(model, {x: v for x, v in (("a", a), ("b", b)) if x not in inits},
                              options=CompileOptions(policies={"*": policy}))["y"]
        np.testing.assert_allclose(got, np.maximum(a.astype(np.float64) @ b, 0), rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_register_tiles_fit_the_registers_and_the_panels():
    from svodc.gemm_plan import A_PANEL, B_PANEL, cpu_plan
    from svodc.policy import gemm_blocking
    from svodc.target import parse_target

    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"b": (np.float32, [256, 196])}, ["y"],
                       {"a": rand(128, 256)})
    arg = gemm_kernels(model)[0]
    assert arg.a.packed and not arg.b.packed
    for spec in ("x86_64:x86-64-v3", "x86_64:x86-64-v4", "aarch64", "riscv64", "ppc64le"):
        target = parse_target(spec)[0]
        blocking = gemm_blocking(target)
        plan = cpu_plan(arg, target, blocking)
        nvec = plan.lanes // plan.vw
        assert A_PANEL % plan.rows == 0  # a tile never crosses a packed panel of A
        assert plan.rows * nvec <= blocking.accumulators
        assert plan.rows * nvec + nvec + 1 <= target.vector_regs
    avx2, avx512, zen4 = (cpu_plan(arg, t, gemm_blocking(t)) for t in parse_target("x86_64:x86-64-v3,x86-64-v4,znver4"))
    assert [p.rows * p.lanes // p.vw for p in (avx2, avx512, zen4)] == [12, 24, 16]  # 512-bit FMAs: 24 (policy.py)
    transposed = gemm_kernels(make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"b": (np.float32, [256, 7])},
                                         ["y"], {"a": rand(128, 256)}))[0]
    assert transposed.transposed  # n = 7: lanes along m, the vector side is A, packed in B_PANEL-wide panels
    t = parse_target("x86_64:x86-64-v3")[0]
    lanes = cpu_plan(transposed, t, gemm_blocking(t)).lanes
    assert lanes % B_PANEL == 0 or B_PANEL % lanes == 0


def test_a_runtime_a_is_packed_in_blocks_that_fit_the_targets_l2():
    """A run-time A's packed row blocks take half of the tuned CPU's L2 (at least four L1ds), so a core with
    a larger L2 packs fewer, larger blocks; the rows of a block never exceed that budget."""
    from svodc.gemm_plan import cpu_plan
    from svodc.ir.ops import GemmArg, GemmOperand
    from svodc.policy import gemm_blocking
    from svodc.target import parse_target

    m, k, n = 1024, 1024, 1024
    arg = GemmArg((), m, n, k, GemmOperand((), k, 1), GemmOperand((), n, 1), GemmOperand((), n, 1))
    zen3, generic = parse_target("x86_64:znver3,x86-64-v3")
    assert zen3.l2_bytes > generic.l2_bytes
    plans = []
    for target in (zen3, generic):
        blocking = gemm_blocking(target)
        assert blocking.scalar_block_bytes == max(4 * target.l1d_bytes, target.l2_bytes // 2)
        plan = cpu_plan(arg, target, blocking)
        assert plan.block_row_tiles * plan.rows * plan.k_block * 4 <= blocking.scalar_block_bytes
        plans.append(plan)
    assert plans[0].row_blocks < plans[1].row_blocks
