"""GEMM paths chosen per kernel: the epilogue on the accumulators in registers (or the general path
when it has no vector form), and a run-time A packed in blocks of row tiles (codegen/llvm_gemm.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import helper

from svodc.codegen.llvm_gemm_epilogue import vector_epilogue
from svodc.codegen.llvm_ir import KernelEmitter
from svodc.frontend.importer import import_model
from svodc.gemm_plan import cpu_plan
from svodc.ir.ops import Ops
from svodc.options import CompileOptions
from svodc.passes.pipeline import build_program
from svodc.policy import DEFAULT_POLICY, gemm_blocking
from svodc.target import host_target
from tests.onnx_util import compile_and_run, make_model, reference

R = np.random.default_rng(5)


def rand(*shape):
    return R.standard_normal(shape).astype(np.float32)


def gemm_nodes(model, options: CompileOptions | None = None) -> list:
    """(GEMM node, its kernel's emitter) of each contraction kernel."""
    program = build_program(import_model(model), options or CompileOptions())
    out = []
    for k in program.kernels:
        if k.ast.src[0].op is Ops.GEMM:
            out.append((k.ast.src[0], KernelEmitter(k.name, k.ast, host_target())))
    return out


def in_registers(node, em) -> bool:
    return len(node.src) > 3 and vector_epilogue(node.src[3], node.src[2], tuple(node.src[4:]), em.free) is not None


def conv_block(c_in: int, c_out: int, hw: tuple[int, int], tail: str) -> tuple:
    """1x1 conv (small K: the epilogue is much of the work) + BatchNormalization + `tail`."""
    x = rand(1, c_in, *hw)
    nodes = [helper.make_node("Conv", ["x", "w", "cb"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"])]
    inits = {"w": rand(c_out, c_in, 1, 1) * 0.3, "cb": rand(c_out), "s": rand(c_out), "b": rand(c_out),
             "m": rand(c_out), "v": np.abs(rand(c_out)) + 0.5}
    if tail == "relu6":
        nodes.append(helper.make_node("Clip", ["bn", "lo", "hi"], ["y"]))
        inits |= {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    elif tail == "residual_relu":
        nodes += [helper.make_node("Add", ["bn", "r"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
        inits["r"] = rand(1, c_out, *hw)
    else:  # sigmoid: exp is integer and bit work, which the vector epilogue does not take
        nodes.append(helper.make_node("Sigmoid", ["bn"], ["y"]))
    return make_model(nodes, {"x": (np.float32, list(x.shape))}, ["y"], inits), {"x": x}


# Tile edges in both directions (37 rows, 99 = 12 x 8 + 3 lanes), full tiles only, and a k of 2.
@pytest.mark.parametrize("c_in,c_out,hw", [(24, 37, (9, 11)), (16, 48, (8, 8)), (2, 40, (9, 13))])
@pytest.mark.parametrize("tail", ["relu6", "residual_relu"])
def test_epilogue_in_registers_matches_the_reference(c_in, c_out, hw, tail):
    model, feeds = conv_block(c_in, c_out, hw, tail)
    (node, em), = gemm_nodes(model)
    assert not node.arg.transposed and in_registers(node, em)
    np.testing.assert_allclose(compile_and_run(model, feeds)["y"], reference(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_epilogue_without_vector_form_keeps_the_general_path():
    model, feeds = conv_block(24, 37, (9, 11), "sigmoid")
    (node, em), = gemm_nodes(model)
    assert len(node.src) > 3 and not in_registers(node, em)
    np.testing.assert_allclose(compile_and_run(model, feeds)["y"], reference(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_epilogue_with_nan_keeps_numpy_max_semantics():
    a, b = rand(20, 9), rand(9, 30)
    b[3, 7] = np.nan
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["p"]), helper.make_node("Relu", ["p"], ["y"])],
                       {"b": (np.float32, [9, 30])}, ["y"], {"a": a})
    (node, em), = gemm_nodes(model)
    assert in_registers(node, em)
    got = compile_and_run(model, {"b": b})["y"]
    want = np.maximum(a.astype(np.float64) @ b, 0)
    assert np.isnan(got[:, 7]).all() and np.isnan(want[:, 7]).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# A run-time A packed in blocks of a few row tiles (the last block shorter), k blocks, and several parts
# (module.parallel_parts), which start inside blocks, on one thread and on two: every row of A must
# still meet every column of B.
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n", [(41, 70, 900), (130, 33, 470)])
def test_run_time_a_packed_in_row_blocks(threads, m, k, n):
    import svodc
    import svodrt
    from svodc.codegen.module import parallel_parts

    target = host_target()
    a, b = rand(m, k), rand(k, n)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["p"]), helper.make_node("Relu", ["p"], ["y"])],
                       {"a": (np.float32, [m, k]), "b": (np.float32, [k, n])}, ["y"])
    program = build_program(import_model(model), CompileOptions())  # the blocking shapes code, not the program
    (kernel,) = [k for k in program.kernels if k.ast.src[0].op is Ops.GEMM]
    # k blocks of about 16 from the host's own tile (8 or 16 floats a vector), then packed blocks of 4 row
    # tiles of such a k block (so the last block is shorter), reused by as few as 2 lane tiles
    arg = kernel.ast.src[0].arg
    tile = cpu_plan(arg, target, dataclasses.replace(gemm_blocking(target), lanes_first_max_panel=0))
    blocking = dataclasses.replace(gemm_blocking(target), k_block_bytes=32 * tile.lanes * 4 // 2,
                                   lanes_first_max_panel=0, scalar_pack_min_lane_tiles=2)
    k_block = cpu_plan(arg, target, blocking).k_block
    blocking = dataclasses.replace(blocking, scalar_block_bytes=4 * tile.rows * k_block * 4)
    options = CompileOptions(policies={"*": dataclasses.replace(DEFAULT_POLICY, cpu_gemm=blocking)})
    plan = cpu_plan(kernel.ast.src[0].arg, target, blocking)
    assert 1 < plan.block_row_tiles < plan.row_tiles and plan.row_tiles % plan.block_row_tiles
    assert plan.k_blocks > 1 and plan.lane_tiles > 1 and parallel_parts(kernel, target, blocking) > 2
    with svodrt.load(svodc.compile(model, options=options), threads=threads) as rt:
        rt._solo_runs = 2  # as if timed: two threads claim the parts (the automatic one-thread choice skipped)
        got = rt.run({"a": a, "b": b})["y"]
    np.testing.assert_allclose(got, np.maximum(a.astype(np.float64) @ b, 0), rtol=1e-4, atol=1e-4 * np.sqrt(k))
