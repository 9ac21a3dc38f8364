"""Issue 12, acceptance 1 (the batch slice): one bundle per real model, compiled once with a bounded
dim, compared with onnxruntime at every size (rtol 1e-3, atol 1e-4 * max|ref|, as tests/test_models.py).
Inputs differ per batch row (each row is the reference input rolled), so a row read from the wrong
place shows. The heavier models (mobilenetv2, ppocr cls: ~90 s of compilation on 2 cores) carry the
`dynamic_models` marker: `make test-dynamic`, not `make test`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import svodc
import svodrt
from tests.onnx_util import reference

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
HEAVY = pytest.mark.dynamic_models

# name: (compile options, sizes to run, heavy)
CASES = {
    "mtcnn_onet": ({"dims": {"N": (1, 37)}}, (1, 37), False),
    "gpt2_small_random": ({"dims": {"batch": (1, 4), "seq": (1, 256)}}, ((1, 1), (1, 7), (3, 129), (4, 256)), False),
    "magika_standard_v3_3": ({"dims": {"unk__214": (1, 8)}}, (1, 5), False),
    "mobilenetv2_random": ({"dims": {"batch": (1, 16)}}, (1, 5, 16), True),
    "ppocr_mobile_v2_cls": ({"input_shapes": {"x": ((1, 6), 3, 48, 192)}}, (2, 6), True),
}


def _batch(ref: np.ndarray, size: int | tuple[int, int]) -> np.ndarray:
    """`size` rows (or (rows, length): the leading axes), row i the reference row rolled by 7*i elements
    (values of the same kind and range), cut or tiled to the length."""
    n, length = (size, None) if isinstance(size, int) else size
    rows = [np.roll(ref[0], 7 * i) for i in range(n)]
    if length is not None:
        rows = [np.resize(r, (length, *r.shape[1:])) for r in rows]
    return np.ascontiguousarray(np.stack(rows).astype(ref.dtype))


@pytest.fixture(scope="module", params=[pytest.param(n, marks=HEAVY if CASES[n][2] else ()) for n in CASES])
def compiled(request):
    name = request.param
    folder = MODELS / name
    if not (folder / "model.onnx").is_file():
        pytest.skip(f"no {name} in {MODELS}")
    options, sizes, _ = CASES[name]
    bundle = svodc.compile(str(folder / "model.onnx"), **options)
    return name, folder, bundle, sizes


def test_one_bundle_matches_onnxruntime_at_every_size(compiled):
    import onnx

    name, folder, bundle, sizes = compiled
    model = onnx.load(str(folder / "model.onnx"))
    ref_inputs = dict(np.load(folder / "inputs.npz"))
    with svodrt.load(bundle, threads=2) as m:
        assert m.bundle.dims and all(t.dims for t in m.inputs)
        for n in sizes:
            feeds = {k: _batch(v, n) for k, v in ref_inputs.items()}
            got = m.run(feeds)
            for (out, g), want in zip(got.items(), reference(model, feeds), strict=True):
                assert g.shape == want.shape, (name, out, n)
                np.testing.assert_allclose(g.astype(np.float64), want, rtol=1e-3,
                                           atol=1e-4 * float(np.abs(want).max()), err_msg=f"{name} {out} at {n}")
