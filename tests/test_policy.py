"""The optimisation policy (svodc/policy.py): named, switchable machine-dependent steps and the
passes' thresholds, chosen per variant through CompileOptions.policies."""

from __future__ import annotations

import numpy as np
import pytest

import svodc
import svodrt
from svodc.errors import TargetError
from svodc.frontend.importer import import_model
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import InputArg, Ops
from svodc.ir.provenance import Provenance
from svodc.ir.uop import UOp
from svodc.options import CompileOptions
from svodc.passes.pipeline import build_program
from svodc.policy import DEFAULT_POLICY, OptimizationPolicy
from svodc.program import ImportedGraph
from tests.onnx_util import reference, small_cnn


def _gemms(program) -> int:
    return sum(1 for k in program.kernels for s in k.ast.src if s.op is Ops.GEMM)


def test_steps_and_thresholds_change_the_program():
    model, _ = small_cnn()
    graph = import_model(model)
    base = build_program(graph, CompileOptions())
    no_gemm = build_program(graph, CompileOptions(), DEFAULT_POLICY.without("conv_to_matmul", "gemm"))
    assert _gemms(base) > 0 and _gemms(no_gemm) == 0


def test_fusion_limit_is_the_policys():
    x = UOp(Ops.INPUT, dtypes.float32, (), InputArg("x", (4,)))
    y = x
    for _ in range(50):
        y = UOp(Ops.SIN, dtypes.float32, (y,))
    graph = ImportedGraph([("x", x)], [("y", y)], Provenance(), "test")
    assert len(build_program(graph, CompileOptions()).kernels) == 1
    assert len(build_program(graph, CompileOptions(), OptimizationPolicy(max_fused_ops=10)).kernels) >= 5


def test_a_variant_policy_changes_its_bundle_and_keeps_the_outputs():
    model, feeds = small_cnn()
    want = reference(model, feeds)
    variant = "x86_64:x86-64-v3"
    generic = DEFAULT_POLICY.without("conv_to_matmul", "gemm")
    default = svodc.compile(model, target=variant)
    other = svodc.compile(model, target=variant, options=CompileOptions(policies={variant: generic}))
    assert other != default
    for data in (default, other):
        with svodrt.load(data) as m:
            got = list(m.run(feeds).values())
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_policies_that_a_bundle_cannot_hold_are_refused():
    model, _ = small_cnn()
    split = CompileOptions(policies={"x86_64:x86-64": DEFAULT_POLICY.without("gemm_transpose")})
    with pytest.raises(TargetError, match="different optimisation policies"):
        svodc.compile(model, target="x86_64:x86-64-v3,x86-64", options=split)
    with pytest.raises(TargetError, match="lacks"):
        svodc.compile(model, target="x86_64:x86-64-v3", options=split)
    with pytest.raises(ValueError, match="unknown optimisation step"):
        DEFAULT_POLICY.without("no_such_step")


def test_variants_with_their_own_gemm_blocking_share_a_bundle():
    """The blocking shapes only a variant's code, so a fat bundle holds variants whose blocking differs."""
    import dataclasses

    from svodc.policy import GemmBlocking, default_policy
    from svodc.target import parse_target

    model, feeds = small_cnn()
    want = reference(model, feeds)
    v3, v4 = parse_target("x86_64:x86-64-v3,x86-64-v4")
    assert default_policy(v3).cpu_gemm != default_policy(v4).cpu_gemm  # 16 ymm registers vs 32 zmm
    small = GemmBlocking(accumulators=2, vector_regs=16, max_rows=2, k_unroll=1, lanes_first_max_panel=1024,
                         lanes_first_max_operand=4096,
                         k_block_bytes=512, scalar_block_bytes=2048,
                         scalar_pack_min_lane_tiles=2, epilogue_in_registers=False)
    target = "x86_64:x86-64-v3,x86-64"
    own = svodc.compile(model, target=target, options=CompileOptions(
        policies={"x86_64:x86-64": dataclasses.replace(DEFAULT_POLICY, cpu_gemm=small)}))
    assert own != svodc.compile(model, target=target)
    for variant in (0, 1):
        with svodrt.load(own, variant=variant) as m:
            got = list(m.run(feeds).values())
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_the_vectorizer_threshold_is_the_targets_own_shapes_only_its_code_and_is_checked():
    """AVX/AVX2 x86 targets take 4 (vmaskmovps is slow), the rest LLVM's 16; a policy's own value wins, an
    invalid one is an error (LLVM would ignore it). Like the GEMM blocking it shapes one variant's code:
    variants whose values differ share one bundle, and each variant's code follows its own value."""
    import dataclasses

    from svodc.codegen.llvm_job import LLVMJob
    from svodc.policy import LLVM_MIN_TRIP_COUNT, vector_min_trip_count_for
    from svodc.target import parse_target
    from tests.test_codegen import _depthwise

    v2, v3, v4, a64 = parse_target("x86_64:x86-64-v2,x86-64-v3,x86-64-v4,aarch64:generic")
    assert [vector_min_trip_count_for(t) for t in (v2, v3, v4, a64)] == [16, 4, 16, 16] and LLVM_MIN_TRIP_COUNT == 16
    # a job's default (llvm_job.py keeps its own literal: a worker does not import the policy)
    assert LLVMJob("", "", "", "", "", 2, "small", False).vector_min_trip_count == LLVM_MIN_TRIP_COUNT
    assert dataclasses.replace(DEFAULT_POLICY, vector_min_trip_count=9).vector_min_trip_count_of(v3) == 9
    for bad in (-1, 1 << 40, 4.5, True):
        with pytest.raises(ValueError, match="vector_min_trip_count"):
            dataclasses.replace(DEFAULT_POLICY, vector_min_trip_count=bad).vector_min_trip_count_of(v3)

    model = _depthwise(32, 7, 1, relu=True)
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 32, 7, 7)).astype(np.float32)}
    want = reference(model, feeds)[0]

    def bundle(target: str, **policies) -> bytes:
        return svodc.compile(model, target=target, options=CompileOptions(policies=policies))

    tiny = dataclasses.replace(DEFAULT_POLICY, vector_min_trip_count=LLVM_MIN_TRIP_COUNT)
    own, sixteen = bundle("x86_64:x86-64-v3"), bundle("x86_64:x86-64-v3", **{"*": tiny})
    assert own == bundle("x86_64:x86-64-v3", **{"*": dataclasses.replace(DEFAULT_POLICY, vector_min_trip_count=4)})
    assert own != sixteen  # compile_program takes the variant's value
    fat = bundle("x86_64:x86-64-v3,x86-64", **{"x86_64:x86-64": tiny})  # one program, two values
    for b, variants in ((own, (0,)), (sixteen, (0,)), (fat, (0, 1))):
        for variant in variants:
            with svodrt.load(b, variant=variant) as m:
                np.testing.assert_allclose(m.run(feeds)["y"], want, rtol=1e-4, atol=1e-4)


def test_an_expensive_input_of_a_normalization_is_computed_once():
    """tanh(x) feeds a REDUCE (the mean) and the subtraction after it: realized once instead of recomputed
    by each kernel after the reduction, unless the policy counts a math function as one cheap op."""
    from onnx import helper

    from svodc.ir.uop import toposort
    from tests.onnx_util import compile_and_run, make_model

    nodes = [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Mul", ["t", "x"], ["g"]),
             helper.make_node("LayerNormalization", ["g", "s", "b"], ["y"], axis=-1)]
    r = np.random.default_rng(5)
    inits = {"s": r.standard_normal(24).astype(np.float32), "b": r.standard_normal(24).astype(np.float32)}
    model = make_model(nodes, {"x": (np.float32, [6, 24])}, ["y"], inits)
    graph = import_model(model)

    def kernels_with_tanh(policy: OptimizationPolicy) -> int:
        program = build_program(graph, CompileOptions(), policy)
        return sum(any(n.op is Ops.TANH for n in toposort([k.ast])) for k in program.kernels)

    assert kernels_with_tanh(DEFAULT_POLICY) == 1
    assert kernels_with_tanh(OptimizationPolicy(math_op_cost=1)) > 1
    feeds = {"x": r.standard_normal((6, 24)).astype(np.float32)}
    np.testing.assert_allclose(compile_and_run(model, feeds)["y"], reference(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_winograd_needs_more_tiles_on_zen5_and_a_bundle_takes_its_first_cpu_variants_gate():
    """Zen 5 takes the strictest Winograd gate (its direct GEMMs won to 28x28), other 512-bit-FMA targets
    (Intel, a generic x86-64-v4) leave 7x7 outputs direct, 256-bit ones (Zen 4) keep 16. The gate is a threshold the policy leaves to the target (None), so variants
    whose own gates differ still share one program, the first CPU variant's; a policy naming it wins."""
    import dataclasses

    from svodc.api import bundle_policy
    from svodc.gpu_target import parse_targets
    from svodc.policy import WINOGRAD_MIN_TILES, WINOGRAD_MIN_TILES_FMA512, WINOGRAD_MIN_TILES_ZEN5, gemm_blocking
    from svodc.target import host_target, parse_target
    from tests.test_winograd import _conv_model

    v3, v4, zen4, zen5 = parse_target("x86_64:x86-64-v3,x86-64-v4,znver4,znver5")
    assert (v3.fma_bits, v4.fma_bits, zen4.fma_bits, zen5.fma_bits) == (256, 512, 256, 512)

    def gate(targets: str, **policies) -> int:
        return bundle_policy(parse_targets(targets), CompileOptions(policies=policies)).winograd_min_tiles

    assert gate("x86_64:x86-64-v3,znver5") == gate("x86_64:znver4") == WINOGRAD_MIN_TILES
    assert gate("x86_64:x86-64-v4") == gate("x86_64:sapphirerapids,x86-64-v3") == WINOGRAD_MIN_TILES_FMA512
    assert gate("x86_64:znver5,x86-64-v3") == gate("x86_64:znver5,sm_90") == WINOGRAD_MIN_TILES_ZEN5
    assert gate("x86_64:znver5", **{"*": DEFAULT_POLICY}) == WINOGRAD_MIN_TILES_ZEN5  # built from the default
    assert gate("x86_64:znver5", **{"*": dataclasses.replace(DEFAULT_POLICY, winograd_min_tiles=16)}) == 16
    # a blocking named for one variant, a GPU variant's policy named: still one bundle
    blocking = dataclasses.replace(DEFAULT_POLICY, cpu_gemm=gemm_blocking(v3))
    assert gate("x86_64:znver5,x86-64-v3", **{"x86_64:x86-64-v3": blocking}) == WINOGRAD_MIN_TILES_ZEN5
    assert gate("x86_64:znver5,sm_90", **{"cuda:sm_90": DEFAULT_POLICY}) == WINOGRAD_MIN_TILES_ZEN5

    model, feeds = _conv_model(64, 64, 24, 24, 1)  # 144 output tiles: Winograd under the common gate only
    want = reference(model, feeds)[0]
    kernels = {}
    runs_zen5 = set(zen5.features) <= set(host_target().features)
    for targets in ("x86_64:x86-64-v3,znver5", "x86_64:znver5,x86-64-v3"):
        bundle = svodc.compile(model, target=targets)
        names = targets.removeprefix("x86_64:").split(",")
        for variant in (0, 1) if runs_zen5 else (names.index("x86-64-v3"),):  # the variants that run here
            with svodrt.load(bundle, variant=variant) as m:
                kernels[targets] = len(m.bundle.kernels)
                np.testing.assert_allclose(m.run(feeds)["y"], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    assert kernels["x86_64:x86-64-v3,znver5"] > kernels["x86_64:znver5,x86-64-v3"]  # the transforms' kernels


def test_gemm_blocking_follows_the_fma_width_and_a_host_targets_own_caches(tmp_path):
    """24 accumulators where two pipes run whole 512-bit FMAs (loads limit an 8x2 tile there), 16 on
    Zen 4's halves and 12 on 16-register targets; a `host` target's L1d and L2 are the machine's own
    (sysfs), which win over the CPU name's table entry (a hypervisor may name another CPU)."""
    import dataclasses

    from svodc.gemm_plan import _register_tile
    from svodc.ir.ops import GemmArg, GemmOperand
    from svodc.policy import gemm_blocking
    from svodc.target import host_caches, parse_target

    v3, v4, zen4, zen5 = parse_target("x86_64:x86-64-v3,x86-64-v4,znver4,znver5")
    assert [gemm_blocking(t).accumulators for t in (v3, v4, zen4, zen5)] == [12, 24, 16, 24]
    assert gemm_blocking(v4).k_block_bytes == 16 << 10  # the x86-64 table's 32 KiB L1d, halved
    mine = dataclasses.replace(v4, caches=(48 << 10, 2 << 20))
    assert (mine.l1d_bytes, mine.l2_bytes, gemm_blocking(mine).k_block_bytes) == (48 << 10, 2 << 20, 24 << 10)
    # the 24 accumulators make an 8 x 3 tile on a wide GEMM, within the registers (24 + 3 loads + 1 broadcast)
    packed = GemmOperand((), 0, 0, packed=True)
    arg = GemmArg((), 1024, 1024, 1024, packed, packed, GemmOperand((), 1024, 1))
    assert _register_tile(arg, 1024, 1024, 16, gemm_blocking(v4)) == (8, 3)
    assert _register_tile(arg, 1024, 1024, 16, gemm_blocking(zen4)) == (8, 2)

    for index, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"),
                                                 (3, "Unified", "480M")]):
        entry = tmp_path / f"index{index}"
        entry.mkdir()
        for name, value in (("level", str(level)), ("type", kind), ("size", size)):
            (entry / name).write_text(value + "\n")
    assert host_caches(str(tmp_path)) == (48 << 10, 2 << 20)
    (tmp_path / "index2" / "size").write_text("garbled\n")
    assert host_caches(str(tmp_path)) == (48 << 10, 0)  # an unreadable level is unknown: the table's then
    assert host_caches(str(tmp_path / "absent")) == (0, 0)
