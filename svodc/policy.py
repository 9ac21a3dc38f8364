"""The optimisation policy: the passes' machine-dependent choices, by name, per code variant.

Every rewrite whose payoff depends on the machine is a named step that a policy switches on or off,
and every threshold the passes use is a field; the passes read nothing else (no module constants).
`policy_for` gives a variant its policy: the one CompileOptions.policies names for it, else its
target's default. Today's defaults are the same for every target, so one program serves every
variant of a fat bundle; a variant with another policy gets its own program (svodc/api.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from svodc.errors import TargetError


@dataclass(frozen=True)
class OptimizationPolicy:
    # Steps (passes/contraction.py, decompose.py, lower_gemm.py, lower.py):
    conv_to_matmul: bool = True  # CONV -> MATMUL over an im2col view, so convolutions run as GEMM kernels
    gemm: bool = True  # MATMULs of at least gemm_min_macs run as GEMM kernels (else MUL + REDUCE loops)
    gemm_transpose: bool = True  # lanes along m when n wastes vector lanes (n = 7x7) and A is constant
    merge_inner_loops: bool = True  # contiguous inner output axes as one loop when that needs no div/mod
    # Thresholds:
    gemm_min_macs: int = 4096  # smaller products are cheaper on the generic path
    max_fused_ops: int = 400  # a fused subgraph past this many ops is realized (bounds kernels, LLVM time)
    cheap_to_repeat: int = 16  # ops per element a reusing consumer may recompute instead of loading
    parallel_min: int = 32  # leading output axes collapse into one parallel loop of at least this many

    STEPS: ClassVar[tuple[str, ...]] = ("conv_to_matmul", "gemm", "gemm_transpose", "merge_inner_loops")

    def without(self, *steps: str) -> OptimizationPolicy:
        """This policy with the named steps switched off."""
        unknown = [s for s in steps if s not in self.STEPS]
        if unknown:
            raise ValueError(f"unknown optimisation step(s) {unknown}; the steps are {list(self.STEPS)}")
        return dataclasses.replace(self, **dict.fromkeys(steps, False))


DEFAULT_POLICY = OptimizationPolicy()


def default_policy(target) -> OptimizationPolicy:
    """A target's own policy (svodc/target.py Target or svodc/gpu_target.py GpuTarget). The same for
    every target today; a machine that wants another tile size or rewrite returns it from here."""
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
