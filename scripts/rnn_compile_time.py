"""Compile time of recurrent layers against the sequence length (issue 13).

Six bidirectional layers (LSTM, GRU, RNN, twice each), hidden 32, batch 1, chained: each layer's Y
[seq, 2, 1, 32] is the next layer's X [seq, 1, 64]. Prints, per sequence length: svodc.compile wall time
(median of --repeat runs, no test vectors), kernels, distinct LLVM bodies.

  PYTHONPATH=$PWD .venv/bin/python scripts/rnn_compile_time.py --seq 16 64 --repeat 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from onnx import TensorProto, helper

LAYERS = ["LSTM", "GRU", "RNN", "LSTM", "GRU", "RNN"]
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def six_layers(seq: int, hidden: int = 32, size: int = 16, seed: int = 0):
    """The model: X [seq, 1, size] -> six bidirectional layers -> Y [seq, 1, 2 * hidden]."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x, width = "x", size
    for i, op in enumerate(LAYERS):
        g = GATES[op] * hidden
        for name, shape in ((f"w{i}", (2, g, width)), (f"r{i}", (2, g, hidden)), (f"b{i}", (2, 2 * g))):
            inits.append(helper.make_tensor(name, TensorProto.FLOAT, shape,
                                            (rng.standard_normal(shape) * 0.3).astype(np.float32).ravel()))
        nodes.append(helper.make_node(op, [x, f"w{i}", f"r{i}", f"b{i}"], [f"y{i}"], hidden_size=hidden,
                                      direction="bidirectional"))
        nodes.append(helper.make_node("Transpose", [f"y{i}"], [f"t{i}"], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Reshape", [f"t{i}", "shape"], [f"x{i}"]))
        x, width = f"x{i}", 2 * hidden
    inits.append(helper.make_tensor("shape", TensorProto.INT64, (3,), [seq, 1, 2 * hidden]))
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    graph = helper.make_graph(nodes, "six_rnns",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, 1, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, 1, 2 * hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def counts(model) -> tuple[int, int]:
    """(kernels, distinct bodies) of the host variant."""
    from svodc.codegen.compile import prepare_kernel
    from svodc.codegen.module import _render_units
    from svodc.frontend.importer import import_model
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program
    from svodc.policy import gemm_blocking
    from svodc.target import host_target

    program = build_program(import_model(model), CompileOptions())
    target = host_target()
    kernels = [prepare_kernel(k, target) for k in program.kernels]
    return len(kernels), len(_render_units(kernels, target, gemm_blocking(target)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    import svodc

    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    for seq in args.seq:
        model = six_layers(seq)
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            svodc.compile(model, test_vectors=False)
            times.append(time.perf_counter() - t0)
        k, b = counts(model)
        print(f"seq {seq}: compile {statistics.median(times):.1f} s (runs {', '.join(f'{t:.1f}' for t in times)}), "
              f"{k} kernels, {b} bodies", flush=True)


if __name__ == "__main__":
    main()
