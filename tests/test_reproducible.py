"""The same model with the same options gives byte-identical bundles (CPU and GPU variants, ptxas and
ld.lld outputs included), whatever the process, folder, file name, hash seed or number of compile
workers."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.bundle_tools import vectors_of
from tests.onnx_util import small_cnn

BIN = os.path.dirname(sys.executable)


def test_two_processes_in_two_folders_give_identical_bytes(tmp_path):
    model = small_cnn()[0].SerializeToString()
    runs = [(tmp_path / "one" / "deep" / "er", "model.onnx", "1", "1"), (tmp_path / "two", "other-name.onnx", "2", "3")]
    outputs = []
    for folder, name, hash_seed, jobs in runs:
        folder.mkdir(parents=True)
        (folder / name).write_bytes(model)
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        r = subprocess.run([os.path.join(BIN, "svodc"), "compile", name, "-o", "out.svod", "-j", jobs,
                            "--target", "x86_64-linux-gnu:x86-64-v3,x86-64,sm_90,gfx942"], cwd=folder, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        outputs.append((folder / "out.svod").read_bytes())
    assert outputs[0] == outputs[1]
    assert vectors_of(outputs[0])  # the reference outputs are part of what must repeat
