"""bench/flops.py: contraction FLOPs counted from an ONNX graph, on a tiny model counted by hand."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from bench.flops import FlopCountError, contraction_flops, counted_gflop, roofline
from tests.onnx_util import make_model


def _model():
    nodes = [
        # x [N, 4, 8, 8], W [6, 2, 3, 3], 2 groups, stride 2, pad 1 -> [N, 6, 4, 4]
        helper.make_node("Conv", ["x", "w"], ["c"], group=2, strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),  # not a contraction: not counted
        # a [7, 3] transposed: M = 3, K = 7; b [7, 4] -> [3, 4]
        helper.make_node("Gemm", ["a", "b"], ["g"], transA=1),
        # [2, 3, 5] x [5, 4] -> [2, 3, 4]
        helper.make_node("MatMul", ["p", "q"], ["mm"]),
    ]
    r = np.random.default_rng(0)
    return make_model(nodes, {"x": (np.float32, ["N", 4, 8, 8]), "a": (np.float32, [7, 3]),
                              "p": (np.float32, [2, 3, 5])}, ["r", "g", "mm"],
                      {"w": r.standard_normal((6, 2, 3, 3)).astype(np.float32),
                       "b": r.standard_normal((7, 4)).astype(np.float32),
                       "q": r.standard_normal((5, 4)).astype(np.float32)})


def test_counts_conv_gemm_matmul_by_hand():
    feeds = {"x": np.zeros((2, 4, 8, 8), np.float32), "a": np.zeros((7, 3), np.float32),
             "p": np.zeros((2, 3, 5), np.float32)}
    conv = 2 * (2 * 6 * 4 * 4) * (2 * 3 * 3)  # 2 x outputs x (input channels per group x taps)
    gemm = 2 * (3 * 4) * 7
    matmul = 2 * (2 * 3 * 4) * 5
    assert contraction_flops(_model(), feeds) == conv + gemm + matmul
    # the feeds' shapes decide the symbolic batch: one image is half the convolution's work
    assert contraction_flops(_model(), {**feeds, "x": feeds["x"][:1]}) == conv // 2 + gemm + matmul


def test_unknown_shape_is_an_error_naming_the_node():
    with pytest.raises(FlopCountError, match="Conv node"):
        contraction_flops(_model(), {})
    assert counted_gflop(_model(), {}) is None


def test_roofline_is_the_best_of_the_gemm_table():
    rows = [{"shape": "a", "t1": {"svod_gflops": 50.0, "numpy_gflops": 70.0}},
            {"shape": "b", "t1": {"svod_gflops": 60.0, "numpy_gflops": 65.0}}]
    assert roofline(rows, 1) == (60.0, 70.0)
    assert roofline(rows, 2) is None
    assert roofline([], 1) is None


def test_report_puts_achieved_gflops_next_to_the_roofline():
    from bench.report import roofline_lines

    rows = [{"model": "net", "gflop": 8.0, "t1": {"svod_ms": 100.0, "ort_ms": 200.0}},
            {"model": "trees", "gflop": 0.0, "t1": {"svod_ms": 1.0, "ort_ms": 1.0}}]
    gemm = [{"shape": "a", "t1": {"svod_gflops": 100.0, "numpy_gflops": 160.0}}]
    lines = roofline_lines(rows, gemm, [1])
    assert "| net | 8.00 | 80.0 | 80 % / 50 % | 40.0 |" in lines  # 8 GFLOP in 0.1 s; 0.2 s
    assert not any("trees" in line for line in lines)
    assert any("best sgemm 100.0 GFLOP/s svod, 160.0 numpy" in line for line in lines)
    assert "| net | 8.00 | 80.0 | - | 40.0 |" in roofline_lines(rows, [], [1])
