"""The optimisation policy: the passes' machine-dependent choices, by name, per code variant.

Every rewrite whose payoff depends on the machine is a named step that a policy switches on or off,
and every threshold the passes use is a field; the passes read nothing else (no module constants).
`policy_for` gives a variant its policy: the one CompileOptions.policies names for it, else its
target's default.

A policy has two parts. The steps and thresholds shape the program (kernels, buffers, packed weights),
which a bundle holds once for all its variants: variants whose program parts differ cannot share a
bundle (svodc/api.py). A program threshold left None is the target's own (`resolved`), taken for the whole
bundle from its first CPU variant. The CPU GEMM blocking (`GemmBlocking`) and the vectorizer's tiny-loop
threshold (`vector_min_trip_count`) only shape one variant's machine code, so each variant of a fat bundle
gets its own from its target's facts (vector width, register count, caches, masked memory operations), and
variants that differ only there share the bundle.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from svodc.errors import TargetError
from svodc.target import Target


@dataclass(frozen=True)
class GemmBlocking:
    """How the CPU GEMM micro-kernels (codegen/llvm_gemm.py, tiles chosen in gemm_plan.py) use one
    variant's registers and caches."""

    accumulators: int  # vector accumulators a micro-tile may keep (rows x vectors of C)
    vector_regs: int  # registers in all: accumulators + the vectors loaded per k + one broadcast must fit
    max_rows: int  # tile rows (scalar-side streams read per k)
    k_unroll: int  # k steps per iteration of the micro-kernel's loop (fewer loop instructions per FMA)
    lanes_first_max_panel: int  # bytes of a k x lanes vector panel up to which lane tiles go innermost
    lanes_first_max_operand: int  # ... and of the whole vector side (k x all lanes; not with bounded dims)
    k_block_bytes: int  # a vector panel over this is cut into k blocks of about this (codegen/llvm_gemm.py)
    scalar_block_bytes: int  # a run-time scalar side is packed in row blocks of about this (gemm_plan.py)
    scalar_pack_min_lane_tiles: int  # ... where at least this many lane tiles reuse a block
    epilogue_in_registers: bool  # the epilogue on the accumulators where it can (codegen/llvm_gemm_epilogue.py)
    # scalar_pack_min_lane_tiles transposed (B's columns, read in place `rows` floats per line): 960 -> 160 1x1
    # over 7x7, 10 lane tiles, Zen 3: 45 -> 76 GFLOP/s packed
    scalar_pack_min_lane_tiles_transposed: int = 2
    copy_all_bytes: int = 0  # the whole vector side copied per part, in k blocks of at most this (0: never)
    copy_all_min_k_block: int = 256  # ... where each k block (a pass over C) is at least this long
    prefetch_next_panel: bool = True  # a copied vector panel's copy prefetches the next one (llvm_gemm_copy.py)
    prefetch_c: bool = True  # a micro-kernel prefetches its C tile before its k loop (not with lane tiles innermost)


# The whole-vector-side copy, and a transposed GEMM's packed scalar block, live on the calling thread's
# stack, like the int8 GEMM's packed lane tile (docs/architecture.md): at most about this much of it.
STACK_BUFFER_BYTES = 256 * 1024


def gemm_blocking(target: Target) -> GemmBlocking:
    """A CPU target's blocking, from its facts (svodc/target.py).

    Accumulators: 16 (8x2 vectors: enough independent FMA chains to cover two FMA pipes of 4-5 cycles
    latency; AVX-512 Zen 4, which runs a 512-bit FMA as two 256-bit halves, needs only half as many),
    and at most the registers less four (for the loaded vectors and a broadcast): 12 on AVX2 and rv64gc
    (16 registers). Where two pipes run whole 512-bit FMAs (Target.fma_bits) the loads limit first: an
    8x2 tile loads 10 operands per 16 FMAs, and from L2 (a panel past L1) ran at 100 GFLOP/s where 8x3
    (11 loads per 24 FMAs) ran 120 and 6x4 108, so such targets keep 24 (Intel server core under KVM,
    family 6 model 167, one micro-kernel over k = 1024 from L2: 8x3 +20 %; in L1 +9 %; an encoder's
    attention and projections -12 %, an m x k x n = 3136 x 576 x 64 GEMM -16 to -18 %, 2048 -> 512 1x1
    over 7x7 -27 % with the host's caches). Lane tiles go innermost where a
    vector panel is within a quarter of L1d and the whole vector side within half of L2: each row tile's
    sweep then re-reads it from L2 (past that, from L3 once per row tile: 256x64x3136 on one Zen 3 core
    ran at about 30 GFLOP/s that way, 58 with row tiles innermost).
    A k block's vector panel is half of L1d: it stays in L1 while the row tiles reuse it, next to the
    scalar side's rows streaming through. A packed block of a run-time scalar side (rows x k block) is
    half of L2 (`Target.l2_bytes`; at least four times L1d): it stays in L2, next to the vector panels and
    C tiles passing through, while the lane tiles sweep it (1024^3 on one Zen 3 core, 512 KiB L2: 128 ->
    256 KiB blocks, 9 -> 5 of them, ~5 % faster); a pack costs about one lane tile's FMAs, so it is done
    where 16 lane tiles (~6 %) reuse it (transposed, from 2: scalar_pack_min_lane_tiles_transposed). An unpacked
    vector side of up to half of L2 (and 256 KiB: it is on the thread's stack) is copied whole per part, lane
    tiles innermost (gemm_plan.py copy_all). The software prefetches (prefetch_c, prefetch_next_panel) are on
    for every target: llvm.prefetch is a hint, dropped where a target has no prefetch instruction."""
    regs = target.vector_regs
    accumulators = 24 if target.fma_bits >= 512 else 16
    return GemmBlocking(accumulators=min(accumulators, regs - 4), vector_regs=regs, max_rows=8, k_unroll=4,
                        lanes_first_max_panel=target.l1d_bytes // 4, lanes_first_max_operand=target.l2_bytes // 2,
                        k_block_bytes=target.l1d_bytes // 2,
                        scalar_block_bytes=max(target.l1d_bytes * 4, target.l2_bytes // 2),
                        scalar_pack_min_lane_tiles=16, epilogue_in_registers=True,
                        copy_all_bytes=min(target.l2_bytes // 2, STACK_BUFFER_BYTES))


@dataclass(frozen=True)
class OptimizationPolicy:
    # Steps (passes/contraction.py, decompose.py, lower_gemm.py, lower.py):
    conv_to_matmul: bool = True  # CONV -> MATMUL over an im2col view, so convolutions run as GEMM kernels
    gemm: bool = True  # MATMULs of at least gemm_min_macs run as GEMM kernels (else MUL + REDUCE loops)
    gemm_transpose: bool = True  # lanes along m when n wastes vector lanes (n = 7x7) and A is constant
    merge_inner_loops: bool = True  # contiguous inner output axes as one loop when that needs no div/mod
    int8_gemm: bool = True  # int32 products of 8-bit operands and a constant run as integer GEMM kernels (CPU)
    fuse_window_pads: bool = True  # small windowed reductions read their padding in place (passes/schedule.py)
    winograd: bool = True  # 3x3 stride-1 convolutions as Winograd F(2x2, 3x3) where the gate admits (winograd.py)
    row_fusion: bool = True  # a softmax along trailing axes is one kernel, row by row (passes/rows.py)
    # Thresholds:
    gemm_min_macs: int = 4096  # smaller products are cheaper on the generic path
    # gemm_transpose (passes/lower_gemm.py _vectorize_along_m, measured there): lanes along m must waste at
    # least transpose_min_gain less of the vector than lanes along n, and K be within transpose_k_range,
    # except that a gain of transpose_free_gain pays from K = transpose_free_min_k on
    transpose_min_gain: float = 0.1
    transpose_k_range: tuple[int, int] = (512, 2048)
    transpose_free_gain: float = 0.4
    transpose_free_min_k: int = 64
    max_fused_ops: int = 400  # a fused subgraph past this many ops is realized (bounds kernels, LLVM time)
    cheap_to_repeat: int = 16  # ops per element a reusing consumer may recompute instead of loading
    math_op_cost: int = 16  # ops a math function counts for there (exp, tanh...: a polynomial of about so many)
    parallel_min: int = 32  # leading output axes collapse into one parallel loop of at least this many
    unroll_reduce_max: int = 32  # reductions over at most this many elements are written out (passes/lower.py)
    # row_fusion's longest row (elements): 64 KiB of float32, so a row stays in L2 (every target's is larger)
    # between its passes
    row_fusion_max: int = 16384
    # Winograd convolutions need at least these input channels (the GEMMs' K: with fewer, the C stores and the
    # transforms outweigh the 2.25x fewer multiplies; 32-48 channels measured 10-25 % faster than the im2col
    # GEMM on Zen 3, 16 no faster), output channels, 2x2 output tiles (the GEMMs' N) and multiply-adds of the
    # batched GEMM (under it the five kernels' fixed costs win):
    winograd_min_in_channels: int = 32
    winograd_min_out_channels: int = 24
    winograd_min_tiles: int | None = None  # None: the target's own (winograd_min_tiles_for)
    winograd_min_macs: int = 2_000_000
    # One variant's code only (not the program): None is the target's own, gemm_blocking(target).
    cpu_gemm: GemmBlocking | None = None
    # ... and, CPU variants only, the inner-loop trip count under which LLVM's vectorizer counts a loop as tiny
    # (then masked tails or scalar; codegen/compile.py LLVMJob): None is the target's own, vector_min_trip_count_for.
    vector_min_trip_count: int | None = None

    STEPS: ClassVar[tuple[str, ...]] = ("conv_to_matmul", "gemm", "gemm_transpose", "merge_inner_loops", "int8_gemm",
                                        "fuse_window_pads", "winograd", "row_fusion")

    def without(self, *steps: str) -> OptimizationPolicy:
        """This policy with the named steps switched off."""
        unknown = [s for s in steps if s not in self.STEPS]
        if unknown:
            raise ValueError(f"unknown optimisation step(s) {unknown}; the steps are {list(self.STEPS)}")
        return dataclasses.replace(self, **dict.fromkeys(steps, False))

    def program_part(self) -> OptimizationPolicy:
        """The part that shapes the program, which all variants of a bundle share."""
        return dataclasses.replace(self, cpu_gemm=None, vector_min_trip_count=None)  # (both one variant's code)

    def resolved(self, target) -> OptimizationPolicy:
        """This policy with the thresholds it leaves to the target (None) made `target`'s own."""
        if self.winograd_min_tiles is not None:
            return self
        return dataclasses.replace(self, winograd_min_tiles=winograd_min_tiles_for(target))

    @property
    def winograd_tiles(self) -> int:
        """winograd_min_tiles, or where a pass runs with a policy no bundle resolved (tests), the common one."""
        return WINOGRAD_MIN_TILES if self.winograd_min_tiles is None else self.winograd_min_tiles

    def blocking(self, target: Target) -> GemmBlocking:
        """The CPU GEMM blocking of `target`'s code under this policy."""
        return self.cpu_gemm or gemm_blocking(target)

    def vector_min_trip_count_of(self, target: Target) -> int:
        """The vectorizer's tiny-loop threshold for `target`'s code under this policy. Checked here: LLVM
        ignores an invalid value (it keeps the worker's previous one, so the code would depend on the job order)."""
        n = vector_min_trip_count_for(target) if self.vector_min_trip_count is None else self.vector_min_trip_count
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 1 << 31:
            raise ValueError(f"vector_min_trip_count must be an integer in [0, 2^31), got {n!r}")
        return n


DEFAULT_POLICY = OptimizationPolicy()


# Winograd's output tiles. On Zen 5 (512-bit FMAs at once) the direct im2col GEMM won up to larger images: its
# GEMMs ran about twice as fast as on 256-bit cores while the transforms, passes over memory, did not. Zen 5,
# F(2x2, 3x3) speed over direct per layer: 28x28 and 27x27 outputs (196 tiles) 0.72-0.90, 14x14 and 13x13
# 0.61-1.02, 7x7 0.88-1.22; 40x40 1.41, 56x56 1.26-1.58, 80x80 1.54 (squeezenet, densenet121, resnet50,
# inception_v2, ppocrv4_det). An Intel server core (AVX-512, two 512-bit FMA pipes too; family 6 model 167 under
# KVM) did not: single layers (16 accumulators), direct -> Winograd, 512 channels at 7x7 2.30 -> 1.59 ms, 256 at
# 14x14 1.97 -> 1.28, 128 at 28x28 1.99 -> 1.23 (but squeezenet's 64 -> 256 at 13x13 0.38 -> 0.40 and 32 -> 128 at
# 27x27 0.43 -> 0.46); whole models (24 accumulators) with the gate at 16 instead of 256 (same process,
# alternating, medians, against onnxruntime) resnet50 1.12 -> 1.10 / 1.24 -> 1.15 (1 / 2 threads), inception_v2
# 1.31 -> 1.13 / 1.49 -> 1.24, densenet121 0.82 -> 0.79, yolo_like_320 0.98 -> 0.94. There, only 7x7 outputs (16
# tiles) were better direct: their batched GEMMs read 16/9 of the weights for 16 columns, so each transformed
# weight feeds 16 multiply-adds against 49 direct, and 512-channel layers (9.4 MB of weights) stream them from
# memory at FMA rates twice those of 256-bit cores (resnet50 with the gate at 17: 1.14 -> 1.09 and 1.07 -> 1.03 in
# two runs at one thread, 1.14 -> 1.10 at two; inception_v2 unchanged). So a target tuned for Zen 5 takes 256,
# other 512-bit-FMA targets (Intel, a generic x86-64-v4) 17, and 256-bit ones (Zen 4's halves included) keep 16,
# which was measured on Zen 3 (AVX2).
WINOGRAD_MIN_TILES = 16
WINOGRAD_MIN_TILES_FMA512 = 17
WINOGRAD_MIN_TILES_ZEN5 = 256


def winograd_min_tiles_for(target) -> int:
    """A target's own Winograd tile threshold (a GPU keeps convolutions direct anyway: svodc/api.py)."""
    if not isinstance(target, Target):
        return WINOGRAD_MIN_TILES
    if target.tune_cpu == "znver5":
        return WINOGRAD_MIN_TILES_ZEN5
    return WINOGRAD_MIN_TILES_FMA512 if target.fma_bits >= 512 else WINOGRAD_MIN_TILES


# LLVM's loop vectorizer counts an inner loop of fewer constant iterations than its -vectorizer-min-trip-count
# (16) as tiny: it folds the tail into masked loads and stores, or leaves the loop scalar (by its cost model).
# From the threshold on, a loop gets vectors and a scalar remainder (7 iterations: 4 lanes and 3 scalar), so
# every 7- and 14-wide output row (depthwise convolutions and pooling at 7x7 and 14x14) was masked or scalar.
# AVX and AVX2 mask with vmaskmovps, whose stores are microcoded on AMD Zen: their targets take 4. AVX-512
# masks are cheap (LLVM's 16); SSE-only x86, NEON and the rest keep 16 too (not measured there, though
# their short loops stay scalar under it). Measured on Zen 1 (docs/architecture.md "Optimisation policy"); Intel AVX2
# cores were not measured.
LLVM_MIN_TRIP_COUNT = 16
VECTOR_MIN_TRIP_COUNT_AVX = 4


def vector_min_trip_count_for(target: Target) -> int:
    """A CPU target's own vector_min_trip_count."""
    avx_masks = target.arch == "x86_64" and "avx" in target.features and "avx512f" not in target.features
    return VECTOR_MIN_TRIP_COUNT_AVX if avx_masks else LLVM_MIN_TRIP_COUNT


def default_policy(target) -> OptimizationPolicy:
    """A target's own policy (svodc/target.py Target or svodc/gpu_target.py GpuTarget): the program part
    is the same for every target (its None thresholds are resolved per bundle: OptimizationPolicy.resolved);
    a CPU target's GEMM blocking is its own (gemm_blocking)."""
    if isinstance(target, Target):
        return dataclasses.replace(DEFAULT_POLICY, cpu_gemm=gemm_blocking(target))
    return DEFAULT_POLICY


def policy_for(target, policies: dict[str, OptimizationPolicy]) -> OptimizationPolicy:
    """The policy of one variant: policies[its name] ("x86_64:x86-64-v3", "cuda:sm_90"), else
    policies["*"], else the target's default."""
    return policies.get(target.describe(), policies.get("*", default_policy(target)))


def check_policy_names(policies: dict[str, OptimizationPolicy], targets: list) -> None:
    names = {t.describe() for t in targets}
    unknown = sorted(set(policies) - names - {"*"})
    if unknown:
        raise TargetError(f"optimisation policies name variants {unknown} that the target string lacks; "
                          f"its variants are {sorted(names)}")
