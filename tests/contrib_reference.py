"""onnx.reference implementations of onnxruntime's quantized contrib ops (com.microsoft), written
from the formulas of onnxruntime's ContribOperators.md with the arithmetic rules onnx.reference uses
for its own QLinear ops: integer accumulators in int32, the float32 scales' ratio in float32, the
rescale in float64, round half to even, then the zero point and saturation. Used as the reference
for the integers Svod computes (`ReferenceEvaluator(model, new_ops=CONTRIB_OPS)`)."""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun


def _requant(real: np.ndarray, zp: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    q = np.rint(real) + (0 if zp is None else zp.astype(np.float64))
    return np.clip(q, info.min, info.max).astype(dtype)


def _centered(x: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
    return x.astype(np.int32) - (0 if zp is None else zp.astype(np.int32))


def _dtype(zp: np.ndarray | None, x: np.ndarray) -> np.dtype:
    return (zp if zp is not None else x).dtype


class QLinearAdd(OpRun):
    op_domain = "com.microsoft"

    def _run(self, a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp=None):
        real = (_centered(a, a_zp) * np.float32(a_scale / c_scale).astype(np.float64)
                + _centered(b, b_zp) * np.float32(b_scale / c_scale).astype(np.float64))
        return (_requant(real, c_zp, _dtype(c_zp, a)),)


class QLinearMul(OpRun):
    op_domain = "com.microsoft"

    def _run(self, a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp=None):
        factor = np.float32(a_scale * b_scale / c_scale)
        real = (_centered(a, a_zp) * _centered(b, b_zp)).astype(np.float64) * np.float64(factor)
        return (_requant(real, c_zp, _dtype(c_zp, a)),)


class QLinearGlobalAveragePool(OpRun):
    op_domain = "com.microsoft"

    def _run(self, x, x_scale, x_zp, y_scale, y_zp=None, channels_last=0):
        axes = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
        count = int(np.prod([x.shape[a] for a in axes]))
        acc = _centered(x, x_zp).sum(axis=axes, keepdims=True, dtype=np.int32)
        factor = np.float32(x_scale / np.float32(y_scale * np.float32(count)))
        return (_requant(acc * np.float64(factor), y_zp, _dtype(y_zp, x)),)


def _quantize(real: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """QuantizeLinear: real / scale in float32, rounded half to even."""
    return _requant((real.astype(np.float32) / np.float32(scale)).astype(np.float64), zp, dtype)


class QLinearSigmoid(OpRun):
    op_domain = "com.microsoft"

    def _run(self, x, x_scale, x_zp, y_scale, y_zp=None):
        real = _centered(x, x_zp).astype(np.float32) * np.float32(x_scale)
        return (_quantize(1 / (1 + np.exp(-real)), y_scale, y_zp, _dtype(y_zp, x)),)


class QLinearConcat(OpRun):
    op_domain = "com.microsoft"

    def _run(self, y_scale, y_zp, *triples, axis=None):
        parts = [_quantize(_centered(x, z).astype(np.float32) * np.float32(s), y_scale, y_zp, y_zp.dtype)
                 for x, s, z in zip(triples[::3], triples[1::3], triples[2::3], strict=True)]
        return (np.concatenate(parts, axis=axis),)


class QGemm(OpRun):
    op_domain = "com.microsoft"

    def _run(self, a, a_scale, a_zp, b, b_scale, b_zp, c=None, y_scale=None, y_zp=None, alpha=1.0, transA=0,
             transB=0):
        a, b = (a.T if transA else a), (b.T if transB else b)
        acc = _centered(a, a_zp) @ _centered(b, b_zp)
        if c is not None:
            acc = acc + c.astype(np.int32)
        scale = np.float32(alpha) * a_scale.astype(np.float32) * b_scale.astype(np.float32)
        if y_scale is None:
            return ((acc.astype(np.float32) * scale).astype(np.float32),)
        return (_requant(acc * (scale / np.float32(y_scale)).astype(np.float32).astype(np.float64), y_zp,
                         _dtype(y_zp, a)),)


CONTRIB_OPS = [QLinearAdd, QLinearMul, QLinearGlobalAveragePool, QLinearSigmoid, QLinearConcat, QGemm]
