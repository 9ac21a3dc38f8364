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
    no_lanes_first = dataclasses.replace(gemm_blocking(target), lanes_first_max_panel=0, copy_all_bytes=0)
    tile = cpu_plan(arg, target, no_lanes_first)
    blocking = dataclasses.replace(no_lanes_first, k_block_bytes=32 * tile.lanes * 4 // 2, scalar_pack_min_lane_tiles=2)
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


def _constant_weight_gemm(m: int, k: int, n: int):
    """W @ x + bias, relu: a constant A (packed at compile time) and a run-time B, like a 1x1 convolution."""
    w, bias = rand(m, k), rand(m, 1)
    model = make_model([helper.make_node("MatMul", ["w", "x"], ["p"]), helper.make_node("Add", ["p", "bias"], ["q"]),
                        helper.make_node("Relu", ["q"], ["y"])], {"x": (np.float32, [k, n])}, ["y"],
                       {"w": w, "bias": bias})
    (kernel,) = [kn for kn in build_program(import_model(model), CompileOptions()).kernels
                 if kn.ast.src[0].op is Ops.GEMM]
    return model, kernel, w, bias


def _check_constant_weight_gemm(model, blocking, threads: int, w, bias, n: int) -> None:
    """Compile with `blocking`, run on `threads` threads (both claiming parts), compare with float64."""
    import svodc
    import svodrt

    options = CompileOptions(policies={"*": dataclasses.replace(DEFAULT_POLICY, cpu_gemm=blocking)})
    k = w.shape[1]
    x = rand(k, n)
    with svodrt.load(svodc.compile(model, options=options), threads=threads) as rt:
        rt._solo_runs = 2  # as if timed: two threads claim the parts (the automatic one-thread choice skipped)
        got = rt.run({"x": x})["y"]
    np.testing.assert_allclose(got, np.maximum(w.astype(np.float64) @ x + bias, 0), rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("threads", [1, 2])
def test_vector_side_copied_whole_in_k_blocks(threads):
    """copy_all: each part copies every lane tile's panel (the last one partial) once per k block, then
    sweeps the lane tiles of each row tile; k blocks of a forced small size so C is accumulated over several."""
    from svodc.codegen.module import parallel_parts, parts_per_thread

    target = host_target()
    m, k, n = 1012, 160, 61  # an odd count of row tiles: with 2 parts (one per thread) the second starts mid-sweep
    model, kernel, w, bias = _constant_weight_gemm(m, k, n)
    arg = kernel.ast.src[0].arg
    assert not arg.transposed  # n = 61 wastes too few lanes for lanes along m (lower_gemm.py)
    tile = cpu_plan(arg, target, gemm_blocking(target))
    padded = -(-n // tile.lanes) * tile.lanes
    blocking = dataclasses.replace(gemm_blocking(target), lanes_first_max_panel=0, copy_all_bytes=k * padded * 4 // 3,
                                   copy_all_min_k_block=8)
    plan = cpu_plan(arg, target, blocking)
    assert plan.copy_all and plan.lanes_first and plan.k_blocks > 1 and plan.lanes_tail != plan.lanes
    # some part starts inside a row tile's sweep, where the copy's source is B's column 0, not this tile's
    parts = min(parallel_parts(kernel, target, blocking), parts_per_thread(kernel, target, blocking) * 2)
    assert parts > 2 and any(p * plan.tiles // parts % plan.lane_tiles for p in range(parts))
    _check_constant_weight_gemm(model, blocking, threads, w, bias, n)


@pytest.mark.parametrize("threads", [1, 2])
def test_transposed_scalar_side_packed_in_row_blocks(threads):
    """Lanes along m (n = 49 wastes lanes): the run-time B, the scalar side, is packed per block of row tiles
    (its k stride is a row of B), blocks smaller than n so there are several, the last one short."""

    target = host_target()
    m, k, n = 256, 512, 49
    model, kernel, w, bias = _constant_weight_gemm(m, k, n)
    arg = kernel.ast.src[0].arg
    assert arg.transposed
    from svodc.codegen.module import parallel_parts, parts_per_thread

    tile = cpu_plan(arg, target, gemm_blocking(target))
    per_block = 3 if tile.row_tiles % 3 else 2  # so the last block is short
    blocking = dataclasses.replace(gemm_blocking(target), scalar_block_bytes=per_block * tile.rows * k * 4)
    plan = cpu_plan(arg, target, blocking)
    assert plan.block_row_tiles == per_block and plan.row_tiles % per_block
    # some part starts inside a block, where the pack's source is the block's first column, not this tile's
    parts = min(parallel_parts(kernel, target, blocking), parts_per_thread(kernel, target, blocking) * 2)
    assert any(p * plan.tiles // parts % per_block for p in range(parts))
    _check_constant_weight_gemm(model, blocking, threads, w, bias, n)


def test_parts_that_each_copy_an_operand_are_one_per_thread():
    """module.parts_per_thread: a GEMM whose every part copies the whole vector side (copy_all) or packs a block of
    the scalar side takes one part per thread where those copies would be a noticeable share of its time
    (mobilenetv2's 576 -> 96 projection at 14x14; 960 -> 160 at 7x7, transposed), PARTS_PER_THREAD where the
    product is large next to the copy (ResNet-50's 512 -> 2048 at 7x7)."""
    from svodc.codegen.module import PARTS_PER_THREAD, parts_per_thread

    target = host_target()
    blocking = gemm_blocking(target)
    checked = 0
    for m, k, n, want in ((96, 576, 196, 1), (160, 960, 49, 1), (2048, 512, 49, PARTS_PER_THREAD)):
        _, kernel, _, _ = _constant_weight_gemm(m, k, n)
        plan = cpu_plan(kernel.ast.src[0].arg, target, blocking)
        if plan.copy_all or plan.block_row_tiles:
            assert parts_per_thread(kernel, target, blocking) == want, (m, k, n)
            checked += 1
        else:  # another vector width's plan copies nothing per part: every part equal
            assert parts_per_thread(kernel, target, blocking) == PARTS_PER_THREAD
    assert checked or target.vector_bits < 512  # on AVX-512 the three shapes copy per part (their plans, Zen 4)


def test_a_loop_kernel_that_loads_more_per_element_is_cut_into_more_parts():
    """module.parallel_parts estimates a loop kernel by its loads where it loads more than one or two per element
    (a Winograd output transform loads 9-12 per element: estimated by elements alone it ran in one part)."""
    from svodc.codegen.module import parallel_parts

    target = host_target()

    def parts(inputs: int) -> int:
        names = [f"x{i}" for i in range(inputs)]
        nodes = [helper.make_node("Sum", names, ["y"])]
        model = make_model(nodes, {n: (np.float32, [64, 1024]) for n in names}, ["y"])
        (kernel,) = build_program(import_model(model), CompileOptions()).kernels
        return parallel_parts(kernel, target, gemm_blocking(target))

    assert parts(12) > 2 * parts(2) >= 2


def test_a_loop_kernel_whose_index_arithmetic_costs_more_than_its_loads_is_cut_into_more_parts():
    """module.parallel_parts counts a loop kernel's ALU ops per element too: SpaceToDepth loads once per element
    but computes its source index with divisions and remainders (inception_v2's Winograd tile gathers, one load
    and ~30 index ops per element, ran 53 us in the one part an estimate by loads gave them)."""
    from svodc.codegen.module import parallel_parts

    target = host_target()

    def parts(node, shape) -> int:
        model = make_model([node], {"x": (np.float32, shape)}, ["y"])
        (kernel,) = build_program(import_model(model), CompileOptions()).kernels
        return parallel_parts(kernel, target, gemm_blocking(target))

    copy = parts(helper.make_node("Relu", ["x"], ["y"]), [1, 4, 288, 288])
    gather = parts(helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=3), [1, 4, 288, 288])
    assert gather > copy >= 2


def test_a_full_tiles_general_epilogue_is_straight_vector_code():
    """The general epilogue (no vector form: a sigmoid) over a full tile counts to constants (rows x lanes), so
    LLVM unrolls it into straight vector code: no vector loop is left in the kernel after O2. Its loops used to
    run from the tile's first row and lane to first + rows and first + lanes, whose trip counts LLVM lost after
    InstCombine: a vector loop, a vectorized remainder and a scalar one per row, at run time and in LLVM's time."""
    from svodc.codegen.compile import prepare_kernel
    from svodc.codegen.llvm_job import llvm_init
    from svodc.codegen.units import kernel_modules

    target = host_target()
    model, _ = conv_block(16, 48, (12, 16), "sigmoid")  # M = 48, N = 192: whole tiles for 4..16 rows, 16..64 lanes
    program = build_program(import_model(model), CompileOptions())
    (kernel,) = [k for k in program.kernels if k.ast.src[0].op is Ops.GEMM]
    node = kernel.ast.src[0]
    plan = cpu_plan(node.arg, target, gemm_blocking(target))
    assert not in_registers(node, KernelEmitter(kernel.name, kernel.ast, target))
    assert plan.rows_tail == plan.rows and plan.lanes_tail == plan.lanes  # no edge tile: the edge path is dead
    (_, _, ir), _ = kernel_modules([prepare_kernel(kernel, target)], len(program.inputs), target, gemm_blocking(target), 4)
    llvm = llvm_init()
    tm = llvm.Target.from_triple(target.triple).create_target_machine(cpu=target.llvm_cpu,
                                                                      features=target.llvm_features, opt=2)
    mod = llvm.parse_assembly(ir)
    pto = llvm.create_pipeline_tuning_options(speed_level=2)
    pto.loop_vectorization = pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    optimized = str(mod)
    assert "<16 x float>" in optimized or "<8 x float>" in optimized or "<4 x float>" in optimized
    assert "vector.body" not in optimized
