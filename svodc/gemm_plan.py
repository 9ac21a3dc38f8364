"""The GEMM plan: how one GEMM node (ir/ops.py GemmArg) is cut up on a machine, decided in one place.

Read by lowering (passes/lower_gemm.py packs constant operands in panels), the CPU emitter
(codegen/llvm_gemm.py), the GPU emitter (codegen/gpu_gemm.py) and the entry's part count
(codegen/module.py), so the tile count the work queue splits is the tile loop the emitter writes.

- Panels: a constant operand is packed at compile time into panels of A_PANEL rows of A, or B_PANEL
  columns of B (also the A of a transposed GEMM, whose lanes run along m). Fixed for every target,
  so one weights section serves every CPU and GPU variant of a fat bundle.
- CPU tiles: rows x lanes of C per micro-kernel call (rows on the scalar side, lanes on the vector
  side), from the variant's GEMM blocking (svodc/policy.py: its registers) and the target's vector
  width; the tiles of all batch indices form one parallel loop, in the order `lanes_first` says:
  lane tiles innermost when a k x lanes vector panel is small next to L1d (a tile is then mostly its
  C stores, so sweeping the lanes of a row block writes C as `rows` contiguous streams), or when the
  whole unpacked vector side is small enough to copy once per part (`copy_all`); a run-time scalar
  side that lane tiles reuse (A, or B transposed) is packed per block of row tiles, and the loop then
  goes over the blocks.
- GPU tiles: BM x BN of C per block, TK along k per shared-memory step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from svodc.ir.ops import GemmArg
from svodc.policy import STACK_BUFFER_BYTES, GemmBlocking
from svodc.target import Target

A_PANEL = 8  # rows of A per panel: packed A is [ceil(M/8)][K][8]
B_PANEL = 16  # columns of B per panel: packed B is [ceil(N/16)][K][16]
GPU_BM = GPU_BN = 64  # C tile per GPU block
GPU_TK = 16  # k per shared-memory step
ROWS_OVER_LANES = 0.85  # a CPU tile may give up this share of useful accumulators for more rows (_register_tile)


def a_panel(arg: GemmArg) -> int:
    """Rows of A per panel of a packed A: a transposed GEMM packs A like B (lanes along m)."""
    return B_PANEL if arg.transposed else A_PANEL


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class CpuGemmPlan:
    rows: int  # tile rows (the scalar side: m, or n when transposed)
    lanes: int  # tile lanes (the vector side: n, or m when transposed)
    vw: int  # floats per vector register
    rows_total: int
    lanes_total: int
    batch: tuple[int, ...]
    lanes_first: bool  # lane tiles innermost in the tile loop (else row tiles, reusing a vector panel)
    k_block: int = 0  # k per block when the tile loop runs once per k block (0: one pass over all of k)
    k_total: int = 0  # k (a constant where k_block is set)
    copy_panel: bool = False  # the vector side's panel copied contiguous once per lane tile, or all at once (copy_all)
    block_row_tiles: int = 0  # row tiles per packed block of the scalar side (0: read in place; see cpu_plan)
    copy_all: bool = False  # every lane tile's panel copied at a part's first tile (per k block; lanes first)

    @property
    def k_blocks(self) -> int:
        return ceil_div(self.k_total, self.k_block) if self.k_block else 1

    @property
    def row_tiles(self) -> int:
        return ceil_div(self.rows_total, self.rows)

    @property
    def lane_tiles(self) -> int:
        return ceil_div(self.lanes_total, self.lanes)

    @property
    def rows_tail(self) -> int:
        return self.rows_total - (self.row_tiles - 1) * self.rows

    @property
    def lanes_tail(self) -> int:
        return self.lanes_total - (self.lane_tiles - 1) * self.lanes

    @property
    def tiles(self) -> int:
        """Iterations of the parallel tile loop: the most parts the entry can cut this GEMM into."""
        return math.prod(self.batch) * self.row_tiles * self.lane_tiles

    @property
    def row_blocks(self) -> int:
        """Blocks of block_row_tiles row tiles (the last one may have fewer) when the scalar side is packed."""
        return ceil_div(self.row_tiles, self.block_row_tiles) if self.block_row_tiles else 1


def cpu_plan(arg: GemmArg, target: Target, blocking: GemmBlocking) -> CpuGemmPlan:
    vw = target.vector_bits // 32
    rows_total, lanes_total = (arg.n, arg.m) if arg.transposed else (arg.m, arg.n)
    if rows_total <= 2:  # matrix-vector-like: widen the tile so enough accumulators hide FMA latency
        rows, lanes = rows_total, max(min(8 * vw, 128), B_PANEL)
    else:
        rows, nvec = _register_tile(arg, rows_total, lanes_total, vw, blocking)
        lanes = nvec * vw
    # Lane tiles innermost re-read the whole vector side once per row tile: only where it stays in L2 (else
    # row tiles go innermost, each panel read from memory once; copied contiguous where read in place). With
    # bounded dims the vector side is never copied, and the panel's size alone decides.
    lanes_first = arg.k * lanes * 4 <= blocking.lanes_first_max_panel and (
        arg.runtime or arg.k * lanes_total * 4 <= blocking.lanes_first_max_operand)
    # A larger unpacked vector side that fits the copy bound goes lanes-first too, copied whole: each part
    # copies every lane tile's panel contiguous once (per k block), then each row tile of the scalar side
    # (constant weights: often MBs, from L3) is read once and reused from L1 by every lane tile, while the
    # copy is re-read from L2. Row tiles innermost instead re-read the whole scalar side once per lane
    # tile (2048 x 512 weights over a 7x7 image, AVX2 Zen 3, 4 x 3 tiles: 7 passes over 4 MiB, 36-48 GFLOP/s;
    # copied whole, 55-57). Not with a batch (each index would need its own copy).
    copy_all = False
    k_block_all = 0
    if (blocking.copy_all_bytes and not lanes_first and rows_total > 2 and not arg.transposed and not arg.runtime
            and not arg.b.packed and math.prod(arg.batch) == 1 and ceil_div(rows_total, rows) >= 4):
        padded = ceil_div(lanes_total, lanes) * lanes * 4
        blocks = ceil_div(arg.k * padded, blocking.copy_all_bytes)
        if blocks == 1 or ceil_div(arg.k, blocks) >= blocking.copy_all_min_k_block:
            lanes_first = copy_all = True
            # rounded down to the unroll, so a block's copy stays within copy_all_bytes (one more block at most)
            k_block_all = 0 if blocks == 1 else max(blocking.k_unroll,
                                                    ceil_div(arg.k, blocks) // blocking.k_unroll * blocking.k_unroll)
    # k blocks: a vector panel (k x lanes) past twice the blocking's block bytes is cut into equal blocks
    # (a multiple of the unroll each) and the part's tiles run once per block, so the block of each
    # panel stays in L1 while the row tiles reuse it. Only for a constant k, and not transposed: its C
    # tile is stored one lane at a time, n apart, and each k block would store it again (512 -> 2048 1x1
    # convolution at 7x7, Zen 5: 22 k blocks of 24 ran at 69 GFLOP/s; one pass, with the tile below, 180).
    k_block = k_block_all
    if arg.k_var is None and not arg.transposed and not lanes_first and arg.k * lanes * 4 > 2 * blocking.k_block_bytes:
        blocks = ceil_div(arg.k * lanes * 4, blocking.k_block_bytes)
        k_block = ceil_div(ceil_div(arg.k, blocks), blocking.k_unroll) * blocking.k_unroll
    # An unpacked B read in place strides k by a whole row of B (n floats): rows 4 KiB apart share L1
    # sets, so a k x lanes panel does not stay in L1 however small. Where row tiles reuse it, the tile
    # loop copies each (k block of a) panel to a contiguous buffer first.
    # A run-time scalar side read in place is `rows` streams (A's rows: 4 KiB apart for k = 1024, one
    # L1 set again; transposed, B's columns: `rows` floats per k, each k from another line, so the tile's
    # lines alone fill L1) that every lane tile re-reads from L3 once A is past L2. Where enough lane tiles
    # reuse it (the pack costs about one lane tile's FMAs), the tile loop goes over blocks of row tiles
    # (row tiles innermost, then lane tiles, then blocks) and packs each block's (k block of) rows
    # contiguous, k-major per row tile, once per part: one stream per tile, the block in L2 while the
    # lane tiles sweep it. (Rows copied dense, k-contiguous, measured slower than reading A in place.)
    regular = rows_total > 2 and not arg.runtime and not lanes_first
    scalar_packed = arg.b.packed if arg.transposed else arg.a.packed
    block_row_tiles = 0
    min_reuse = (blocking.scalar_pack_min_lane_tiles_transposed if arg.transposed
                 else blocking.scalar_pack_min_lane_tiles)
    per_tile = rows * (k_block or arg.k) * 4
    # transposed, k is never blocked: the packed block (whole k) stays within the stack bound
    block_bytes = blocking.scalar_block_bytes
    if arg.transposed:
        block_bytes = min(block_bytes, STACK_BUFFER_BYTES)
    fits = per_tile <= block_bytes or not arg.transposed
    if regular and not scalar_packed and fits and ceil_div(lanes_total, lanes) >= min_reuse:
        block_row_tiles = min(ceil_div(rows_total, rows), max(1, block_bytes // per_tile))
    reuse = block_row_tiles or ceil_div(rows_total, rows)  # row tiles that read one copied vector panel
    copy_panel = copy_all or (regular and not arg.transposed and not arg.b.packed and reuse >= 4
                              and arg.b.row_stride != lanes)
    return CpuGemmPlan(rows, lanes, vw, rows_total, lanes_total, arg.batch, lanes_first, k_block, arg.k, copy_panel,
                       block_row_tiles, copy_all)


def _register_tile(arg: GemmArg, rows_total: int, lanes_total: int, vw: int, blocking: GemmBlocking
                   ) -> tuple[int, int]:
    """(rows, vectors) of the micro-tile, among those that fit the blocking's registers (the accumulators,
    the vectors loaded per k and one broadcast) and cross no panel of a packed operand (rows divide the
    scalar side's panel; lanes divide or are a multiple of B_PANEL on a packed vector side):
    - the most rows among tiles within ROWS_OVER_LANES of the most useful accumulators (rows x vectors,
      less what edge tiles waste), then the most of those: each vector loaded feeds `rows` FMAs, and a
      wide panel streams from L2 (m = 41, n = 900 on Zen 5: 1 x 15 vectors -> 8 x 2, 142 -> 223
      GFLOP/s; 13 x 768 x 2304 196 -> 226; mobilenetv2 -5 %), among those whose k step loads (rows
      broadcasts, vectors) no more than it multiplies where there are such: loads and FMAs both issue about
      two a cycle, and 8 x 1 on AVX2 (9 loads per 8 FMAs, every accumulator needed to cover the FMA latency)
      ran Winograd's 16 x 256 x 256 x 49 and 16 x 512 x 512 x 16 layers 13-23 % slower than 4 x 3 / 4 x 2 (Zen 3);
    - transposed, the most useful accumulators per load of a k step (rows broadcasts + nvec vector loads),
      then rows: each broadcast is a load (from the packed block, or in place with a stride), and for n = 49
      on AVX-512 the useful accumulators alone pick 2 x 8 vectors (10 loads per 16 FMAs) where 4 x 4 loads 8."""
    scalar_panel = None if arg.transposed or not arg.a.packed else a_panel(arg)
    vector_packed = arg.a.packed if arg.transposed else arg.b.packed
    tiles = []  # (useful accumulators, rows, vectors)
    for rows in range(1, blocking.max_rows + 1):
        if scalar_panel is not None and scalar_panel % rows:
            continue
        for nvec in range(1, blocking.accumulators // rows + 1):
            lanes = nvec * vw
            if vector_packed and lanes % B_PANEL and B_PANEL % lanes:
                continue
            if rows * nvec + nvec + 1 > blocking.vector_regs:
                continue
            used = rows_total * lanes_total / (ceil_div(rows_total, rows) * rows * ceil_div(lanes_total, lanes) * lanes)
            tiles.append((rows * nvec * used, rows, nvec))
    if not tiles:
        return 1, 1
    if arg.transposed:
        _, rows, nvec = max(tiles, key=lambda t: (round(t[0] / (t[1] + t[2]), 3), t[1]))
    else:
        top = max(t[0] for t in tiles)
        near = [t for t in tiles if t[0] >= ROWS_OVER_LANES * top]
        balanced = [t for t in near if t[1] + t[2] <= t[1] * t[2]]
        _, rows, nvec = max(balanced or near, key=lambda t: (t[1], t[0]))
    return rows, nvec


@dataclass(frozen=True)
class GpuGemmPlan:
    tiles_m: int
    tiles_n: int
    steps: int  # k steps of GPU_TK
    batch: tuple[int, ...]

    @property
    def blocks(self) -> int:
        return math.prod(self.batch) * self.tiles_m * self.tiles_n

    @property
    def loop_sizes(self) -> tuple[int, ...]:
        """The block index split innermost first: (n tiles, m tiles, batch axes last to first)."""
        return (self.tiles_n, self.tiles_m, *reversed(self.batch))


def gpu_plan(arg: GemmArg) -> GpuGemmPlan:
    return GpuGemmPlan(ceil_div(arg.m, GPU_BM), ceil_div(arg.n, GPU_BN), ceil_div(arg.k, GPU_TK), arg.batch)
