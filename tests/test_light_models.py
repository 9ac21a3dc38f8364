"""The onnx package's 9 light models, end to end.

- through the CLIs (`svodc compile`, `svodrt run`) and through the Python API, against the reference
  outputs shipped next to the models, with the inputs the onnx backend runner makes for them; through
  the API also the logits against onnxruntime, and every Conv/Gemm/MatMul on a GEMM kernel;
- random-weight variants through the Python API against onnxruntime, including the logits before
  the final Softmax (the shipped references are a uniform 0.001: too weak alone, see light_models.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

import svodc
import svodrt
from svodc.policy import DEFAULT_POLICY
from svodrt.bundle import parse_bundle
from tests.light_models import (
    LIGHT_MODELS,
    contractions_off_the_gemm_path,
    dummy_inputs,
    expose_logits,
    model_path,
    random_weight_variant,
    reference_output,
)
from tests.onnx_util import reference

BIN = os.path.dirname(sys.executable)


def _cli(tool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(BIN, tool), *args], capture_output=True, text=True)


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_through_the_clis(name, tmp_path):
    model = onnx.load(str(model_path(name)))
    feeds = dummy_inputs(model)
    (input_name, x), = feeds.items()
    np.save(tmp_path / "x.npy", x)
    bundle = tmp_path / f"{name}.svod"
    r = _cli("svodc", "compile", str(model_path(name)), "-o", str(bundle), "-q")
    assert r.returncode == 0, r.stderr
    r = _cli("svodrt", "run", str(bundle), "--input", f"{input_name}={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o.npz"))
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "o.npz")[model.graph.output[0].name]
    np.testing.assert_allclose(got, reference_output(name), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_through_the_api(name):
    """As shipped (ConstantOfShape weights, folded at compile time): the shipped reference output,
    the logits against onnxruntime, and every contraction on the GEMM path (issue 13: a weight is a
    weight whatever made it), read from the bundle's kernel list."""
    model = expose_logits(onnx.load(str(model_path(name))))
    feeds = dummy_inputs(model)
    bundle = svodc.compile(model)
    with svodrt.load(bundle) as m:
        got = list(m.run(feeds).values())
    np.testing.assert_allclose(got[0], reference_output(name), rtol=1e-3, atol=1e-5)
    for g, w in zip(got, reference(model, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5 * max(float(np.abs(w).max()), 1.0))
    kernels = parse_bundle(bundle).manifest["kernels"]
    assert contractions_off_the_gemm_path(model, kernels, DEFAULT_POLICY.gemm_min_macs) == []


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_with_random_weights_matches_onnxruntime(name):
    model = random_weight_variant(name)
    feeds = dummy_inputs(model)
    want = reference(model, feeds)
    with svodrt.load(svodc.compile(model)) as m:
        got = m.run(feeds)
    for (out_name, g), w in zip(got.items(), want, strict=True):
        scale = float(np.abs(w).max())
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5 * max(scale, 1.0), err_msg=out_name)
