"""Compatibility: the golden bundles of every released format version in artifacts/ load and run with
this runtime and give the outputs stored next to them, bit for bit, on every variant this host runs.
(Made once by scripts/golden_bundles.py; never regenerated.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import svodrt
from svodrt.bundle import parse_bundle
from svodrt.model import variant_problem
from svodrt_tools.verify import verify
from tests.string_models import storable

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
GOLDENS = sorted(ARTIFACTS.glob("v*/*.svod"))


def test_goldens_exist_for_format_1():
    assert [p.name for p in GOLDENS if p.parent.name == "v1.0"] == ["relu_add.svod", "small_cnn.svod"]


def test_the_current_format_version_has_goldens_with_its_new_features():
    """Each minor version adds a folder; 1.4's holds a bundle with string inputs (the vocabulary), 1.5's one
    with a bounded dim, 1.6's one with string, ZipMap and edge (StringNormalizer) outputs, 1.7's one with
    computed dims (output sizes the code computes from bounded image dims), 1.8's one with a string program
    (string ops on a run-time input), 1.9's test vectors in a `tests` section (tests/test_vector_section.py), 1.10's
    team functions (tests/test_team.py runs them at two threads)."""
    from svodrt.format import FORMAT_MAJOR, FORMAT_MINOR

    current = {p.name for p in GOLDENS if p.parent.name == f"v{FORMAT_MAJOR}.{FORMAT_MINOR}"}
    assert {"relu_add.svod", "small_cnn.svod", "narrow_dtypes.svod"} <= current
    assert "string_codes.svod" in {p.name for p in GOLDENS if p.parent.name == "v1.4"}
    with svodrt.load(ARTIFACTS / "v1.4" / "string_codes.svod", threads=1) as m:
        assert [t.dtype for t in m.inputs] == ["string", "string"] and m.bundle.vocabulary
    assert "bounded_batch.svod" in {p.name for p in GOLDENS if p.parent.name == "v1.5"}
    with svodrt.load(ARTIFACTS / "v1.5" / "bounded_batch.svod", threads=1) as m:  # its input is at N=3 of 1..8
        assert [d.name for d in m.bundle.dims] == ["N"] and [str(t) for t in m.outputs] == ["y: float32[N=1..8, 5]"]
    assert "labels_and_maps.svod" in {p.name for p in GOLDENS if p.parent.name == "v1.6"}
    with svodrt.load(ARTIFACTS / "v1.6" / "labels_and_maps.svod", threads=1) as m:  # 1.6: outputs decoded
        assert m.bundle.zipmaps and m.bundle.edge_outputs and "string" in [t.dtype for t in m.outputs]
    assert "bounded_image.svod" in {p.name for p in GOLDENS if p.parent.name == "v1.7"}
    with svodrt.load(ARTIFACTS / "v1.7" / "bounded_image.svod", threads=1) as m:  # 1.7: computed dims
        assert [d.computed for d in m.bundle.dims][:2] == [False, False] and all(d.computed for _, d, _ in m.outputs[0].dims)
    assert "string_program.svod" in {p.name for p in GOLDENS if p.parent.name == "v1.8"}
    with svodrt.load(ARTIFACTS / "v1.8" / "string_program.svod", threads=1) as m:  # 1.8: svodrt's string program
        assert {e[4] for e in m.bundle.edge_outputs} == {"input", "output"} and [t.name for t in m.inputs] == ["text"]
    assert "tests" in {s.kind for s in parse_bundle((ARTIFACTS / "v1.9" / "small_cnn.svod").read_bytes()).sections}
    assert parse_bundle((ARTIFACTS / "v1.10" / "small_cnn.svod").read_bytes()).variants[0].team  # 1.10: the team


@pytest.mark.parametrize("path", GOLDENS, ids=[f"{p.parent.name}/{p.stem}" for p in GOLDENS])
def test_golden_bundle_runs_and_matches_its_stored_outputs(path):
    with np.load(path.with_name(f"{path.stem}.expected.npz")) as z:
        stored = {k: z[k] for k in z.files}
    feeds = {k.removeprefix("input."): v for k, v in stored.items() if k.startswith("input.")}
    host = svodrt.detect_host()
    ran = 0
    with svodrt.load(path, threads=1) as first:
        variants = first.bundle.variants
    for v in variants:
        if variant_problem(v, host) is not None:
            continue
        with svodrt.load(path, threads=1, variant=v.index) as m:
            got = m.run(feeds)
        want = {k.split(".", 1)[1]: a for k, a in stored.items() if k.startswith(f"variant{v.index}.")}
        assert list(got) == list(want)
        got = {k: storable(a) for k, a in got.items()}  # format 1.5: strings and ZipMap dicts, as stored
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes(), (path.name, v, k)
        ran += 1
    assert ran >= 1  # every golden has a baseline x86-64 variant
    assert verify(path).ok  # including its embedded test vectors
