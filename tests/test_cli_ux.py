"""Both command lines and the compiler's option errors, as a new user meets them (issue 14): one line
naming what, where and the fix; exit 2 for usage, 1 for failures; --version; suggestions; silent pipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import svodc
import svodrt
from svodc.errors import InputShapeError, ModelLoadError, ToolMissingError
from svodrt.format import FORMAT_MAJOR, FORMAT_MINOR
from svodrt_tools.cli import main as svodrt_main
from tests.onnx_util import make_model

BIN = os.path.dirname(sys.executable)
MODELS = Path(os.environ.get("SVOD_MODELS", Path(__file__).resolve().parents[2] / "shared" / "models"))


def run(tool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(BIN, tool), *args], capture_output=True, text=True)


def _cnn(k: int | str = 4) -> onnx.ModelProto:
    """x[N, k] -> MatMul -> Relu -> Softmax: a symbolic dim and three named kernels' worth of nodes."""
    w = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
                        helper.make_node("Relu", ["h"], ["r"], name="act"),
                        helper.make_node("Softmax", ["r"], ["y"], name="prob", axis=-1)],
                       {"x": (np.float32, ["N", k])}, ["y"], {"w": w})
    return model


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ux")
    src = folder / "m.onnx"
    onnx.save(_cnn(), src)
    path = svodc.compile_to_file(src, folder / "m.svod", dims={"N": 2})
    np.save(folder / "x.npy", np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32))
    return path


def test_option_names_the_model_lacks_are_errors_listing_what_it_has():
    with pytest.raises(InputShapeError, match=r"--dim nosuch: the model has no symbolic dim 'nosuch'; its dims are "
                                              r"\['N'\] \(inputs: x\['N', 4\]\)"):
        svodc.compile(_cnn(), dims={"nosuch": 1})
    with pytest.raises(InputShapeError, match=r"--input-shape nosuch: the model has no input 'nosuch'; its inputs "
                                              r"are x\['N', 4\]"):
        svodc.compile(_cnn(), input_shapes={"nosuch": (1, 3)})
    with pytest.raises(InputShapeError, match=r"--input-shape x=2x5: dim 1 is 5, but the model fixes it to 4"):
        svodc.compile(_cnn(), input_shapes={"x": (2, 5)})
    with pytest.raises(InputShapeError, match=r"with the shapes given \(--input-shape x=2x5 --dim K=5\) the model "
                                              r"does not compute: fc \(ai.onnx::MatMul.*check them against the model's "
                                              r"inputs x\['N', 'K'\]"):
        svodc.compile(_cnn(k="K"), input_shapes={"x": (2, 5)}, dims={"K": 5})
    with pytest.raises(InputShapeError, match=r"dims\['N'\] = '1' \(str\): a dim must be an int >= 0"):
        svodc.compile(_cnn(), dims={"N": "1"})
    with pytest.raises(ModelLoadError, match="is a directory, not an .onnx file"):
        svodc.compile(str(Path(__file__).parent))


@pytest.mark.skipif(not (MODELS / "silero_vad").is_dir(), reason=f"silero_vad not in {MODELS} (set SVOD_MODELS)")
def test_silero_vad_names_sr_and_its_own_inputs_file_runs(tmp_path):
    src = MODELS / "silero_vad" / "model.onnx"
    with np.load(MODELS / "silero_vad" / "inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    shapes = {"input": feeds["input"].shape, "state": feeds["state"].shape}
    with pytest.raises(svodc.errors.UnsupportedModelError, match=r"\['sr'\].*--input-value sr=FILE\.npy"):
        svodc.compile(src, input_shapes=shapes, jobs=1)
    out = svodc.compile_to_file(src, tmp_path / "vad.svod", input_shapes=shapes, input_values={"sr": feeds["sr"]})
    r = run("svodrt", "run", str(out), "-i", str(MODELS / "silero_vad" / "inputs.npz"))
    assert r.returncode == 0, r.stderr
    assert "warning: ignoring input ['sr']: fixed at compile time (--input-value)" in r.stderr


def _svodrt(capsys, *args: str) -> tuple[int, str, str]:
    code = 0
    try:
        svodrt_main(list(args))
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_svodrt_run_errors_are_one_line_before_anything_runs(bundle, capsys, tmp_path):
    x = bundle.with_name("x.npy")
    cases = [(["run", str(bundle), "-i", str(x)], f"-i {x}: name the input, -i NAME={x}"),
             (["run", str(tmp_path / "nope.svod")], "cannot open bundle"),
             (["run", str(tmp_path)], "is a directory"),
             (["run", str(bundle), "-i", f"x={x}", "-o", "/nonexistent/out.npz"],
              "cannot write '/nonexistent/out.npz': No such file or directory")]
    for args, message in cases:
        code, out, err = _svodrt(capsys, *args)
        assert code == 1 and out == "" and message in err and len(err.strip().splitlines()) == 1, (args, err)
        assert ".tmp" not in err
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    code, _, err = _svodrt(capsys, "run", str(bundle), "-i", str(bad))
    assert code == 1 and f"input file {bad} is not a readable .npy/.npz" in err and len(err.strip().splitlines()) == 1
    code, out, err = _svodrt(capsys, "run", str(bundle), "-i", f"x={x}", "-o", str(tmp_path / "o.npz"))
    assert code == 0 and "y: float32[2, 8]" in out and sorted(p.name for p in tmp_path.iterdir()) == ["bad.npz", "o.npz"]


def test_both_clis_share_exit_codes_versions_and_suggestions(capsys):
    format_version = f"bundle format {FORMAT_MAJOR}.{FORMAT_MINOR}"
    code, out, _ = _svodrt(capsys, "--version")
    assert code == 0 and out.startswith("svodrt ") and format_version in out
    code, _, err = _svodrt(capsys, "rn", "m.svod")
    assert code == 2 and "did you mean run?" in err
    code, _, err = _svodrt(capsys, "run", "m.svod", "--inptu", "x")
    assert code == 2 and "did you mean --input?" in err
    r = run("svodc", "--version")
    assert r.returncode == 0 and r.stdout.startswith("svodc ") and format_version in r.stdout
    r = run("svodc", "compil", "m.onnx")
    assert r.returncode == 2 and "Did you mean 'compile'?" in r.stderr
    r = run("svodc", "compile", "--quite", "m.onnx")
    assert r.returncode == 2 and "Did you mean '--quiet'?" in r.stderr
    r = run("svodc", "compile", "/nonexistent.onnx")
    assert r.returncode == 1 and r.stderr.count("\n") == 1


def test_broken_pipes_are_silent(bundle):
    for cmd in ([os.path.join(BIN, "svodrt"), "info", "-v", str(bundle)],
                [os.path.join(BIN, "svodc"), "inspect", str(bundle)]):
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.readline()
        p.stdout.close()  # like `| head -1`
        err = p.stderr.read().decode()
        p.wait()
        assert err == "", err


def test_svodc_without_the_compiler_extra_names_the_extra(tmp_path):
    """A runtime-only install: onnx, llvmlite and click cannot be imported (make test-install checks a real one)."""
    hide = ("import sys; sys.modules.update(onnx=None, llvmlite=None, click=None)\n"
            "from svodrt_tools.launch import svodc; svodc()\n")
    r = subprocess.run([sys.executable, "-c", hide, "--version"], capture_output=True, text=True)
    assert r.returncode == 1 and "ModuleNotFoundError" not in r.stderr
    assert r.stderr.strip() == "svodc: the compiler is not installed (missing onnx, llvmlite, click): pip install " \
                               "'svod[compiler]'"


def test_compile_reports_stages_when_done_and_the_host_target_note(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_cnn(), src)
    lines, ticks = [], []
    svodc.compile_to_file(src, tmp_path / "m.svod", dims={"N": 1}, progress=lines.append,
                          kernels_done=lambda done, total: ticks.append((done, total)))
    stages = [line.split()[0] for line in lines]
    assert stages == ["import", "optimize", "test", "codegen", "bundle"], lines
    assert all(line.endswith(" s") for line in lines)
    assert ticks and ticks[-1][0] == ticks[-1][1] and [d for d, _ in ticks] == list(range(1, len(ticks) + 1))
    r = run("svodc", "compile", str(src), "--dim", "N=1", "-o", str(tmp_path / "h.svod"), "-v")
    assert r.returncode == 0, r.stderr
    assert "note: --target host compiles for this machine's CPU" in r.stderr and "--target " in r.stderr
    assert "  codegen " in r.stderr and "  bundle " in r.stderr
    r = run("svodc", "compile", str(src), "--dim", "N=1", "-o", str(tmp_path / "q.svod"), "-q")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""


def test_profile_names_op_types_and_writes_a_trace_and_a_chart(bundle, capsys, tmp_path):
    trace, chart = tmp_path / "trace.json", tmp_path / "profile.svg"
    code, out, _ = _svodrt(capsys, "profile", str(bundle), "-i", f"x={bundle.with_name('x.npy')}", "--repeat", "2",
                           "--trace", str(trace), "--chart", str(chart))
    assert code == 0
    with svodrt.load(bundle, threads=1) as m:
        kernels = m.bundle.kernels
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in events] == [k.name for k in kernels]
    assert all(e["dur"] >= 0 and e["tid"] == 0 for e in events)
    named = {n for e in events for n in e["args"]["onnx_nodes"]}
    assert {"fc", "act", "prob"} <= named and {"MatMul", "Relu", "Softmax"} <= {o for e in events for o in e["args"]["op_types"]}
    for k in kernels:
        assert k.name in out  # whole names, no 40-character cut
    root = ET.parse(chart).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "time by op type" in texts and kernels[0].name in texts


def test_inspect_graph_writes_dot_and_explains_a_missing_graphviz(bundle, tmp_path, monkeypatch):
    from svodc import graph_draw
    from svodrt.bundle import parse_bundle

    b = parse_bundle(bundle.read_bytes())
    dot = tmp_path / "g.dot"
    graph_draw.write_graph(b, dot)
    text = dot.read_text()
    assert text.startswith("digraph kernels {") and all(f"{k.name}:" in text for k in b.kernels)
    assert "in0 -> k0" in text and "fc" in text and "-> out" in text
    monkeypatch.setattr(graph_draw.shutil, "which", lambda _name: None)
    with pytest.raises(ToolMissingError, match=r"needs Graphviz's `dot` program .* or write DOT text: --graph .*g\.dot"):
        graph_draw.write_graph(b, tmp_path / "g.svg")
    assert not (tmp_path / "g.svg").exists()
