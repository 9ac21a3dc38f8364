"""scripts/gpu_check.py, the prepared on-hardware check: its --dry-run runs the preparation here (compile for
sm_90, expected outputs from onnxruntime, the bounded-batch bundle at two sizes) and checks each bundle's GPU
variant and the runs' input shapes, stopping before the GPU calls (make test-gpu: ~1 min here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.gpu_sweep
def test_dry_run_prepares_and_checks_a_light_model_and_the_bounded_bundle(tmp_path):
    cases = "squeezenet,mobilenetv2_random_batch"
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--only", cases,
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.rstrip().endswith("dry run: stopped before the GPU calls")
    checked = {c["model"]: c for c in json.loads((tmp_path / "gpu_check_dry_run.json").read_text())}
    if checked["mobilenetv2_random_batch"]["status"] == "skipped":
        pytest.skip(checked["mobilenetv2_random_batch"]["reason"])
    assert checked["squeezenet"]["status"] == "compiled" and checked["squeezenet"]["launches"] > 0
    dyn = checked["mobilenetv2_random_batch"]
    assert dyn["dims"] == ["batch"] and [r["label"] for r in dyn["runs"]] == ["b1", "b8"]
    assert all((tmp_path / "bundles" / r["outputs"]).exists() for r in dyn["runs"])


def test_every_case_is_listed():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--list"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    from tests.light_models import LIGHT_MODELS

    assert out.stdout.split() == [*LIGHT_MODELS, "mobilenetv2_random", "gpt2_small_random",
                                  "mobilenetv2_random_batch"]
