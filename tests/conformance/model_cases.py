"""The onnx package's model tests beyond the node cases: `onnx/backend/test/data/{pytorch-converted,
pytorch-operator,simple}`. Each folder holds a model.onnx and test_data_set_*/{input,output}_*.pb;
each data set becomes one Case, run by the same worker pool as the node cases (runner.py)."""

from __future__ import annotations

from pathlib import Path

import onnx

from tests.conformance.cases import Case, _value

SUITES = ("pytorch-converted", "pytorch-operator", "simple")
# The onnx backend runner's default tolerances for model tests.
RTOL, ATOL = 1e-3, 1e-7
# Cases that are not run, by name prefix, with why.
NOT_RUN = {
    "test_gradient_of_": "training-only: ai.onnx.preview.training Gradient has no inference semantics",
}


def data_root() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data"


def not_run_reason(name: str) -> str | None:
    return next((why for prefix, why in NOT_RUN.items() if name.startswith(prefix)), None)


def _load(path: Path, type_proto: onnx.TypeProto):
    """A .pb as the value kind the model's input or output declares (tensor, sequence, optional)."""
    kind = type_proto.WhichOneof("value")
    proto = {"sequence_type": onnx.SequenceProto, "optional_type": onnx.OptionalProto}.get(kind, onnx.TensorProto)()
    proto.ParseFromString(path.read_bytes())
    return _value(proto)


def collect_model_cases() -> list[Case]:
    """Every data set of every model test, as Cases named `<suite>/<test>[/<data set>]`, sorted."""
    cases = []
    for suite in SUITES:
        for folder in sorted((data_root() / suite).iterdir()):
            model_bytes = (folder / "model.onnx").read_bytes()
            graph = onnx.load_from_string(model_bytes).graph
            sets = sorted(folder.glob("test_data_set_*"))
            for ds in sets:
                inputs = [_load(ds / f"input_{i}.pb", vi.type) for i, vi in enumerate(graph.input)
                          if (ds / f"input_{i}.pb").exists()]
                outputs = [_load(ds / f"output_{i}.pb", vi.type) for i, vi in enumerate(graph.output)]
                name = f"{suite}/{folder.name}" + (f"/{ds.name}" if len(sets) > 1 else "")
                cases.append(Case(name, suite, "", model_bytes, inputs, outputs, RTOL, ATOL))
    return cases
