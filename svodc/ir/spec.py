"""The spec: what argument type and sources each op takes. `verify` checks a whole graph; with
CompileOptions.check_ir the pipeline runs it after every pass and on every kernel, and the tests
turn that on for every compilation (tests/conftest.py)."""

from __future__ import annotations

from svodc.ir import ops
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import BINARY, COMPARE, REDUCE_OPS, TERNARY, UNARY, Ops
from svodc.ir.uop import UOp, toposort


class SpecError(ValueError):
    pass


# op -> (argument type or None, number of sources or None for "any")
_SPEC: dict[Ops, tuple[type | tuple[type, ...] | None, int | None]] = {
    Ops.SINK: ((ops.KernelArg, type(None)), None),
    Ops.INPUT: (ops.InputArg, 0),
    Ops.WEIGHT: (ops.ConstData, 0),
    Ops.CONST: ((int, float, bool), 0),
    Ops.RESHAPE: (ops.ShapeArg, 1),
    Ops.PERMUTE: (ops.PermuteArg, 1),
    Ops.EXPAND: (ops.ShapeArg, 1),
    Ops.PAD: (ops.PadArg, 1),
    Ops.SLICE: (ops.SliceArg, 1),
    Ops.WINDOW: (ops.WindowArg, 1),
    Ops.REDUCE: (ops.ReduceArg, 1),
    Ops.CONV: (ops.ConvArg, 2),
    Ops.MATMUL: (None, 2),
    Ops.GATHER: (ops.GatherArg, 2),
    Ops.SCATTER: (ops.ScatterArg, 3),
    Ops.SIZED: (ops.SizedArg, None),
    Ops.STEP_IN: (ops.StepInArg, 0),
    Ops.STEP_LOOP: (ops.StepLoopArg, None),
    Ops.DEFINE_VAR: (ops.VarArg, 0),
    Ops.PARAM: (ops.ParamArg, 0),
    Ops.RANGE: (ops.RangeArg, 1),
    Ops.LOAD: ((int, float, bool), None),
    Ops.STORE: (None, 3),
    Ops.LOOP_REDUCE: (Ops, None),
    Ops.GEMM: (ops.GemmArg, None),
}
for _op in UNARY:
    _SPEC[_op] = (None, 1)
for _op in BINARY:
    _SPEC[_op] = (None, 2)
for _op in TERNARY:
    _SPEC[_op] = (None, 3)


def check_node(n: UOp) -> None:
    argtype, nsrc = _SPEC[n.op]
    if argtype is None and n.arg is not None:
        raise SpecError(f"{n.op.name} takes no argument, got {n.arg!r}")
    if argtype is not None and not isinstance(n.arg, argtype):
        raise SpecError(f"{n.op.name} needs an argument of type {argtype}, got {n.arg!r}")
    if nsrc is not None and len(n.src) != nsrc:
        raise SpecError(f"{n.op.name} takes {nsrc} sources, got {len(n.src)}")
    if n.op in COMPARE and n.dtype is not dtypes.bool:
        raise SpecError(f"{n.op.name} must produce bool, not {n.dtype}")
    if n.op in BINARY - COMPARE - {Ops.POW} and n.src[0].dtype != n.src[1].dtype:
        raise SpecError(f"{n.op.name} sources differ in dtype: {n.src[0].dtype} vs {n.src[1].dtype}")
    if n.op is Ops.WHERE and (n.src[0].dtype is not dtypes.bool or n.src[1].dtype != n.src[2].dtype):
        raise SpecError("WHERE needs (bool, a, b) with a and b of one dtype")
    if n.op is Ops.LOAD and not 2 <= len(n.src) <= 3:
        raise SpecError("LOAD takes (param, index) or (param, index, valid)")
    if n.op is Ops.RANGE and n.src[0].dtype is not dtypes.index:
        raise SpecError("RANGE end must be an index")
    if n.op in (Ops.GATHER, Ops.SCATTER) and not n.src[1].dtype.is_int:
        raise SpecError(f"{n.op.name} indices must be integers, not {n.src[1].dtype}")
    if n.op in (Ops.GATHER, Ops.SCATTER) and n.src[0].dtype != n.dtype:
        raise SpecError(f"{n.op.name} produces the dtype of its source")
    if n.op is Ops.SIZED and (len(n.src) != 1 + sum(d is not None for d in n.arg.dims) or len(n.arg.dims) !=
                              len(n.src[0].shape) or any(v.dtype is not dtypes.int64 or v.shape for v in n.src[1:])):
        raise SpecError("SIZED takes (x, one int64 scalar per named axis of x)")
    if n.op is Ops.STEP_LOOP and (len(n.src) < 2 + n.arg.steps or n.src[0].dtype != n.dtype
                                  or any(r.dtype != n.dtype for r in n.src[1 + n.arg.steps:])):
        raise SpecError("STEP_LOOP takes (init, *step sources, *state roots), the roots of init's dtype")
    if n.op is Ops.STEP_IN and n.arg.kind not in ("state", "step"):
        raise SpecError(f"STEP_IN kind is 'state' or 'step', not {n.arg.kind!r}")
    if n.op is Ops.SCATTER and (n.src[2].dtype != n.dtype or n.arg.reduce not in (None, *REDUCE_OPS)):
        raise SpecError("SCATTER updates have the source's dtype; reduce is None or ADD/MUL/MAX/MIN")


def verify(root: UOp) -> None:
    """Check every node's spec and that tensor shapes are consistent (infer_shape raises if not)."""
    for n in toposort([root]):
        check_node(n)
    _ = root.shape
