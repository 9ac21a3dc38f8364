"""CompileOptions: every knob of a compilation, passed explicitly (no global flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from svodc.policy import OptimizationPolicy

# --precision: the element type GEMM weights are stored in (float32 accumulation; inputs and outputs keep the
# model's dtypes). svodc/api.py measures the error against fp32 and records it in the manifest's options.
PRECISIONS = {"fp32": "float32", "f16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class CompileOptions:
    # Symbolic input dims by name: fixed (`--dim batch=1`, 1) or bounded (`--dim seq=1..512`, (1, 512)); whole
    # input shapes, each dim fixed or bounded (`--input-shape x=1..8x3x224x224`, ((1, 8), 3, 224, 224)).
    # A bounded dim makes one bundle for every size in the range (frontend/dims.py).
    dims: dict[str, int | tuple[int, int]] = field(default_factory=dict)
    input_shapes: dict[str, tuple[int | tuple[int, int], ...]] = field(default_factory=dict)
    # safetensors files (`--weights`) that supply or override initializers by name (mmapped, checked
    # against the model's declared dtype and shape).
    weights: tuple[str, ...] = ()
    # Fix graph inputs' values at compile time (`--input-value starts=starts.npy`): the input becomes a
    # constant and leaves the bundle's inputs. For inputs that decide shapes (Reshape's shape, Slice's
    # starts, TopK's k...), which a static compiler must know. The bundle is only valid for these values.
    # None fixes an optional input to "no value". (Sequence inputs: see frontend/boundary.py.)
    input_values: dict[str, np.ndarray | None] = field(default_factory=dict)
    # The most iterations a Loop whose trip count (or condition) is known only at run time can run, by node
    # name (`--loop-bound NODE=N`): the loop is imported N times and iterations past the run-time count
    # are skipped at run time (frontend/ops/control_flow.py). A call needing more runs only N.
    loop_bounds: dict[str, int] = field(default_factory=dict)
    # Recurrent layers (RNN, GRU, LSTM) over a static sequence compile as step loops: one step's kernels,
    # run once per step by the entry (passes/steploop.py). False unrolls them, a kernel per step; GPU
    # variants do (their launch list has no loops: svodc.api sets it).
    step_loops: bool = True
    # LLVM optimization level for kernels (0-3). 2 by default: on the corpus CPU models LLVM's O3 gave the same
    # outputs bit for bit and no faster code (run-time ratios O2/O3 0.93-1.01) for about 18 % more LLVM time
    # (docs/architecture.md, "Compile time"); not measured on GPU targets.
    opt_level: int = 2
    # Worker processes compiling kernels (LLVM runs out of process so a fatal error cannot kill us).
    # 0 means one per core.
    jobs: int = 0
    # Largest tensor (in elements) that constant folding materializes when it has to compute one.
    fold_limit: int = 1 << 24
    # Embed a reference input and its expected outputs (svodc/testvec.py) for `svodrt verify`:
    # True always, False never, None when inputs and outputs are small.
    test_vectors: bool | None = None
    # Run the IR verifier (svodc/ir/spec.py) on the graph after every pass and on every kernel after
    # lowering and after codegen's rewrites. The tests turn it on for every compilation
    # (tests/conftest.py); off by default, since each check walks the whole graph.
    check_ir: bool = False
    # Optimisation policies (svodc/policy.py) by variant name ("x86_64:x86-64-v3", "cuda:sm_90", or "*"
    # for every variant); a variant not named gets its target's default.
    policies: dict[str, OptimizationPolicy] = field(default_factory=dict)
    # Sign the bundle with this Ed25519 private key (a PEM file; `--sign`): svodrt.load(trust=...) then
    # accepts it (docs/bundle-format.md "Trust model"). Needs the svod[sign] extra.
    sign_key: str | None = None
    # Storage of GEMM weights (`--precision`, PRECISIONS): "fp32", or "f16" / "bf16" on GPU targets, whose GEMM
    # kernels widen them to float32 as they load them (gfx11: WMMA on f16/bf16 operands, float32 accumulation).
    precision: str = "fp32"
