"""bench/gemm.py: the numpy side's subprocess times blocks of runs on request, so blocks alternate with svod's."""

from __future__ import annotations

from bench.gemm import NumpyGemm


def test_numpy_subprocess_times_each_block_it_is_asked_for():
    gemm = NumpyGemm(8, 16, 4, threads=1)
    try:
        blocks = [gemm.block(3), gemm.block(2)]
    finally:
        gemm.close()
    assert [len(b) for b in blocks] == [3, 2]
    assert all(t > 0 for b in blocks for t in b)
    assert gemm.proc.returncode == 0
