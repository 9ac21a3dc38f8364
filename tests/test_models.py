"""The real models of ../shared/models end to end: compile each with its dynamic dims fixed from
inputs.npz, run it, and compare with onnxruntime's outputs.npz (rtol 1e-3, atol 1e-4 * max|ref|).
The max abs/rel error per output is printed at the end of the run (see conftest.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import svodc
import svodrt
from svodc.options import CompileOptions

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
NAMES = sorted(p.name for p in MODELS.iterdir() if (p / "model.onnx").is_file()) if MODELS.is_dir() else []
# Inputs that select a variant of the model rather than carry data: their values are fixed at compile
# time. silero_vad's `sr` picks the 16 kHz or the 8 kHz graph (If); the other branch cannot run at
# the input length of inputs.npz (onnxruntime fails on it too), so a static compile needs the choice.
FIXED_INPUTS = {"silero_vad": ["sr"]}
# Known failures elsewhere in the compiler, each with its reason (strict: an xpass means remove it).
KNOWN_BUGS: dict[str, str] = {}
ERRORS: list[str] = []  # "model output: max abs ..., max rel ..." lines, printed by conftest.py


@pytest.mark.skipif(not NAMES, reason=f"no models in {MODELS}")
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN_BUGS[n], strict=True))
                                  if n in KNOWN_BUGS else n for n in NAMES])
def test_model_matches_onnxruntime(name):
    folder = MODELS / name
    inputs = dict(np.load(folder / "inputs.npz"))
    want = dict(np.load(folder / "outputs.npz"))
    fixed = {k: inputs.pop(k) for k in FIXED_INPUTS.get(name, [])}
    options = CompileOptions(input_shapes={k: v.shape for k, v in inputs.items()}, input_values=fixed)
    bundle = svodc.compile(str(folder / "model.onnx"), options=options)
    with svodrt.load(bundle) as m:
        got = m.run(inputs)
    assert set(got) == set(want)
    for out, ref in want.items():
        g = got[out].astype(np.float64)
        err = np.abs(g - ref)
        rel = float((err / np.maximum(np.abs(ref), 1e-30)).max()) if err.size else 0.0
        ERRORS.append(f"{name} {out}: max abs error {float(err.max()):.3g}, max rel error {rel:.3g}")
        np.testing.assert_allclose(g, ref, rtol=1e-3, atol=1e-4 * float(np.abs(ref).max()), err_msg=f"{name} {out}")


SILERO = MODELS / "silero_vad"


@pytest.mark.skipif(not (SILERO / "model.onnx").is_file(), reason=f"no silero_vad in {MODELS}")
def test_silero_vad_with_a_run_time_sample_rate():
    """`sr` left an input: one bundle runs the 16 kHz or the 8 kHz graph, whichever the call's sr takes
    (passes/branches.py), at 288 samples (256 + 32 of context, the 8 kHz chunk: a length both graphs accept,
    as in onnxruntime), compared with onnxruntime at both rates."""
    import onnxruntime as ort

    inputs = dict(np.load(SILERO / "inputs.npz"))
    audio = np.ascontiguousarray(inputs["input"][:, -288:])
    state = np.random.default_rng(3).standard_normal(inputs["state"].shape).astype(np.float32) * 0.1
    options = CompileOptions(input_shapes={"input": audio.shape, "state": state.shape})
    bundle = svodc.compile(str(SILERO / "model.onnx"), options=options)
    session = ort.InferenceSession(str(SILERO / "model.onnx"), providers=["CPUExecutionProvider"])
    with svodrt.load(bundle, threads=2) as m:
        assert [t.name for t in m.bundle.inputs] == ["input", "state", "sr"]
        for sr in (16000, 8000):
            feeds = {"input": audio, "state": state, "sr": np.array(sr, np.int64)}
            got = m.run(feeds)
            for name, ref in zip(["output", "stateN"], session.run(None, feeds), strict=True):
                np.testing.assert_allclose(got[name], ref, rtol=1e-3, atol=1e-4 * float(np.abs(ref).max()),
                                           err_msg=f"silero_vad sr={sr} {name}")
