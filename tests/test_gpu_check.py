"""scripts/gpu_check.py, the prepared on-hardware check: its --dry-run runs the preparation here (compile for
sm_90, expected outputs from onnxruntime, the bounded-batch bundle at two sizes) and checks each bundle's GPU
variant and the runs' input shapes, stopping before the GPU calls (make test-gpu: ~1 min here); and the
acceptance goals it reports for resnet50 batch 1 (fp32 against torch.compile, f16 against fp32)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.gpu_sweep
def test_dry_run_prepares_and_checks_a_light_model_and_the_bounded_bundle(tmp_path):
    cases = "squeezenet,mobilenetv2_random_batch,resnet50_f16"
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--only", cases,
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.rstrip().endswith("dry run: stopped before the GPU calls")
    checked = {c["model"]: c for c in json.loads((tmp_path / "gpu_check_dry_run.json").read_text())}
    if checked["mobilenetv2_random_batch"]["status"] == "skipped":
        pytest.skip(checked["mobilenetv2_random_batch"]["reason"])
    assert checked["squeezenet"]["status"] == "compiled" and checked["squeezenet"]["launches"] > 0
    f16 = checked["resnet50_f16"]
    assert f16["precision"] == "f16" and f16["mma_sync"] > 0 and checked["squeezenet"]["mma_sync"] == 0
    assert 0.0 < f16["precision_max_error"] < 1e-2
    dyn = checked["mobilenetv2_random_batch"]
    assert dyn["dims"] == ["batch"] and [r["label"] for r in dyn["runs"]] == ["b1", "b8"]
    assert all((tmp_path / "bundles" / r["outputs"]).exists() for r in dyn["runs"])


def test_every_case_is_listed():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--list"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    from tests.light_models import LIGHT_MODELS

    assert out.stdout.split() == [*LIGHT_MODELS, "mobilenetv2_random", "gpt2_small_random",
                                  "mobilenetv2_random_batch", "resnet50_f16"]


def test_goals_compare_resnet50_fp32_with_torch_compile_and_with_its_f16_bundle():
    from scripts.gpu_check import goals, ratios

    def case(model: str, ms: float) -> dict:
        return {"model": model, "status": "ok", "runs": [{"label": "b1", "median_ms_graph": ms}]}

    torch = [{"case": "resnet50", "batch": 1, "eager_ms": 4.0, "compiled_ms": 2.0}]
    results = [case("resnet50", 2.5), case("resnet50_f16", 1.0)]
    g = goals(results, ratios(results, torch))
    assert g["fp32_over_torch_compile"] == 1.25 and g["fp32_over_torch_compile_goal_met"]
    assert g["f16_speedup_over_fp32"] == 2.5 and g["f16_speedup_over_fp32_goal_met"]
    g = goals([case("resnet50", 4.0), case("resnet50_f16", 3.0)], ratios(results[:1], [{**torch[0], "compiled_ms": 1.0}]))
    assert not g["fp32_over_torch_compile_goal_met"] and not g["f16_speedup_over_fp32_goal_met"]
    g = goals(results[:1], [])
    assert g["f16_speedup_over_fp32"].startswith("not measured") and "f16_speedup_over_fp32_goal_met" not in g
    assert g["fp32_over_torch_compile"].startswith("not measured")
