"""The GEMM plan: how one GEMM node (ir/ops.py GemmArg) is cut up on a machine, decided in one place.

Read by lowering (passes/lower_gemm.py packs constant operands in panels), the CPU emitter
(codegen/llvm_gemm.py), the GPU emitter (codegen/gpu_gemm.py) and the entry's part count
(codegen/module.py), so the tile count the work queue splits is the tile loop the emitter writes.

- Panels: a constant operand is packed at compile time into panels of A_PANEL rows of A, or B_PANEL
  columns of B (also the A of a transposed GEMM, whose lanes run along m). Fixed for every target,
  so one weights section serves every CPU and GPU variant of a fat bundle.
- CPU tiles: rows x lanes of C per micro-kernel call (rows on the scalar side, lanes on the vector
  side), from the target's vector width and register count; the tiles of all batch indices form
  one parallel loop, in the order `lanes_first` says.
- GPU tiles: BM x BN of C per block, TK along k per shared-memory step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from svodc.ir.ops import GemmArg
from svodc.target import Target

A_PANEL = 8  # rows of A per panel: packed A is [ceil(M/8)][K][8]
B_PANEL = 16  # columns of B per panel: packed B is [ceil(N/16)][K][16]
# Bytes of a vector panel (k x lanes floats) up to which lane tiles go innermost: a tile is then
# mostly its C stores, so sweeping the lanes of a row block writes C as `rows` contiguous streams.
LANES_FASTEST_MAX_PANEL = 8 * 1024
GPU_BM = GPU_BN = 64  # C tile per GPU block
GPU_TK = 16  # k per shared-memory step


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
    def loop_sizes(self) -> tuple[int, ...]:
        """The tile loop's index split innermost first: (inner tiles, outer tiles, batch axes last to first)."""
        inner, outer = (self.lane_tiles, self.row_tiles) if self.lanes_first else (self.row_tiles, self.lane_tiles)
        return (inner, outer, *reversed(self.batch))


def cpu_plan(arg: GemmArg, target: Target) -> CpuGemmPlan:
    vw = target.vector_bits // 32
    rows_total, lanes_total = (arg.n, arg.m) if arg.transposed else (arg.m, arg.n)
    if rows_total <= 2:  # matrix-vector-like: widen the tile so enough accumulators hide FMA latency
        rows, lanes = rows_total, max(min(8 * vw, 128), B_PANEL)
    elif target.vector_regs >= 32:
        rows, lanes = 8, 2 * vw  # 16 accumulators of 32 registers
    else:
        rows, lanes = 4, 2 * vw  # 8 accumulators of 16 registers
    lanes_first = arg.k * lanes * 4 <= LANES_FASTEST_MAX_PANEL
    return CpuGemmPlan(rows, lanes, vw, rows_total, lanes_total, arg.batch, lanes_first)


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
