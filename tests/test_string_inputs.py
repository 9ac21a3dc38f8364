"""String inputs in the runtime (svodrt_strings/ids.py) and the format (1.4: the `string` dtype and the
manifest's `vocabulary`): interning per call, accepted and refused arrays, the checks on the
vocabulary, the CLI, and what an older runtime does with such a bundle."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import numpy as np
import pytest

import svodc
import svodrt
from svodrt.bundle import TensorInfo
from svodrt_strings.ids import StringTable
from tests.bundle_tools import manifest_of, repack
from tests.string_models import category_codes

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def codes_bundle() -> tuple[bytes, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(bundle, feeds, outputs for the feeds)."""
    model, feeds = category_codes()
    data = svodc.compile(model, target="x86_64", test_vectors=True)
    with svodrt.load(data, threads=1) as m:
        return data, feeds, m.run(feeds)


def _run(data: bytes, feeds: dict) -> dict[str, np.ndarray]:
    with svodrt.load(data, threads=1) as m:
        return m.run(feeds)


def test_new_strings_are_numbered_after_the_vocabulary_once_per_call_across_inputs():
    table = StringTable(["a", "b", ""])
    x, y = TensorInfo("x", "string", (2, 2)), TensorInfo("y", "string", (3,))
    ids = table.intern([x, y], {"x": np.array([["b", "new"], ["", "new"]]), "y": np.array(["other", "new", "a"],
                                                                                            dtype=object)})
    assert ids["x"].dtype == np.int32 and ids["x"].tolist() == [[1, 3], [2, 3]]
    assert ids["y"].tolist() == [4, 3, 0]  # "new" is 3 in both inputs; numbering restarts per call
    assert table.intern([y], {"y": np.array(["new", "new", "x"])})["y"].tolist() == [3, 3, 4]


def test_accepted_arrays_str_object_and_utf8_bytes_give_the_same_outputs(codes_bundle):
    data, feeds, want = codes_bundle
    color = feeds["color"]
    for variant in (color, color.astype(object), np.char.encode(color, "utf-8"),
                    np.asfortranarray(color), color.astype("<U40")):
        got = _run(data, {"color": variant, "other": feeds["other"]})
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{variant.dtype} {k}")


def test_unknown_empty_and_non_ascii_strings(codes_bundle):
    data = codes_bundle[0]
    color = np.array([["", "grün", "GRÜN"], ["東京", "red ", "red"]])
    got = _run(data, {"color": color, "other": np.array(["", "GRÜN", "red"])})
    assert got["code"].tolist() == [[4, 3, -1], [-1, -1, 0]]
    assert got["weight"].tolist() == [[-1.5, -1.5, -1.5], [4.0, -1.5, 0.25]]
    assert got["same"].tolist() == [[True, False, False], [False, False, True]]


@pytest.mark.parametrize("color,message", [
    (np.array([["red", 3, "x"], ["a", "b", "c"]], dtype=object), r"input 'color' element \[0, 1\] is a int, expected str"),
    (np.array([["red", "a", "x"], ["a", b"b", "c"]], dtype=object), r"element \[1, 1\] is a bytes, expected str"),
    (np.array([["red", "a", "x"], ["a", "b", None]], dtype=object), r"element \[1, 2\] is a NoneType"),
    (np.array([[b"ok", b"\xff\xfe", b"x"], [b"a", b"b", b"c"]]), r"element \[0, 1\] is not UTF-8: b'\\xff\\xfe'"),
    (np.zeros((2, 3), np.int32), r"input 'color' is a string input: pass a numpy array of str .*got dtype int32"),
    ([["red"] * 3] * 2, r"input 'color' is a string input: pass a numpy.ndarray of str, got list"),
    (np.array(["red"] * 3), r"input 'color' has rank 1 \(shape \[3\]\), expected rank 2"),
    (np.array([["red"] * 4] * 2), r"input 'color' dim 1: got 4, expected 3"),
], ids=["int", "bytes-in-object", "None", "bad-utf8", "ids", "list", "rank", "dim"])
def test_wrong_string_inputs_are_refused_naming_input_and_element(codes_bundle, color, message):
    data, feeds, _ = codes_bundle
    with pytest.raises(svodrt.InputError, match=message):
        _run(data, {"color": color, "other": feeds["other"]})


def test_model_describes_string_inputs(codes_bundle):
    from svodrt_tools.describe import describe_bundle

    data, _, _ = codes_bundle
    with svodrt.load(data, threads=1) as m:
        assert [(t.name, t.dtype, t.shape) for t in m.inputs] == [("color", "string", (2, 3)),
                                                                   ("other", "string", (3,))]
        assert "color: string[2, 3]" in repr(m)
        assert "the model knows 6 strings" in describe_bundle(m.bundle)
        assert m.bundle.header.minor >= 4 and manifest_of(data)["vocabulary"] == list(m.bundle.vocabulary)


def test_cli_runs_string_inputs_from_npy_files(codes_bundle, tmp_path):
    data, feeds, want = codes_bundle
    (tmp_path / "m.svod").write_bytes(data)
    np.save(tmp_path / "color.npy", feeds["color"])  # a '<U' array: loads without pickle
    np.savez(tmp_path / "other.npz", other=feeds["other"])
    r = subprocess.run([os.path.join(BIN, "svodrt"), "run", str(tmp_path / "m.svod"), "--input",
                        f"color={tmp_path / 'color.npy'}", "--input", str(tmp_path / "other.npz"), "-o",
                        str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "code: int64[2, 3]" in r.stdout
    with np.load(tmp_path / "out.npz") as out:
        for k in want:
            np.testing.assert_array_equal(out[k], want[k])
    np.save(tmp_path / "objects.npy", feeds["color"].astype(object), allow_pickle=True)
    r = subprocess.run([os.path.join(BIN, "svodrt"), "run", str(tmp_path / "m.svod"), "--input",
                        f"color={tmp_path / 'objects.npy'}", "--input", str(tmp_path / "other.npz")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "allow_pickle" in r.stderr  # object arrays would need pickle: refused


def _set(path, value):
    def edit(m):
        node = m
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value(node[path[-1]]) if callable(value) else value
    return edit


@pytest.mark.parametrize("edit,message", [
    (lambda m: m.pop("vocabulary"), r"manifest\.vocabulary: is missing"),
    (_set(["vocabulary", 1], 7), r"vocabulary\[1\]: has type int, expected str"),
    (_set(["vocabulary", 2], "red"), r"vocabulary\[2\]: 'red' repeats an earlier string"),
    (_set(["vocabulary", 0], "x" * 70000), r"vocabulary\[0\]: has 70000 characters, over the limit 65536"),
    (_set(["vocabulary"], lambda v: v[1:] + v[:1]), r"variants\[0\]\.binding: does not match"),
    (_set(["vocabulary"], lambda v: [*v, "extra"]), r"variants\[0\]\.binding: does not match"),
    (_set(["outputs", 0, "dtype"], "string"), r"variants\[0\]\.binding: does not match"),  # 1.6: a string output
], ids=["missing", "not-str", "repeat", "too-long", "reordered", "extended", "string-output"])
def test_vocabulary_edits_are_refused_by_name(codes_bundle, edit, message):
    data = codes_bundle[0]
    m = copy.deepcopy(manifest_of(data))
    edit(m)
    with pytest.raises(svodrt.BundleFormatError, match=message):
        svodrt.load(repack(data, m))


FORMAT_1_3_COMMIT = "435d68a"  # main just before format 1.4: its svodrt is a format 1.3 runtime


def test_a_format_1_3_runtime_refuses_a_string_input_naming_it(codes_bundle, tmp_path):
    """Compatibility promise of 1.4 (docs/bundle-format.md): an older runtime refuses a bundle with a
    string input, naming the tensor and the dtype, before it maps anything."""
    from tests.bundle_tools import old_runtime_load

    out = old_runtime_load(FORMAT_1_3_COMMIT, 3, codes_bundle[0], tmp_path)
    assert "manifest field inputs[0].dtype: 'string' is not one of" in out


def test_string_inputs_on_the_gpu_path(stub, codes_bundle, llvm_workers):
    """The GPU runner interns like the CPU one and uploads the ids (kernels emulated on this CPU, the
    stand-in driver: tests/gpu)."""
    from tests.gpu.harness import emulate, run_on_stub

    model, feeds = category_codes()
    got = run_on_stub(stub, svodc.compile(model, target="sm_90"), emulate(model, workers=llvm_workers), feeds, "cuda:0")
    want = codes_bundle[2]
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
