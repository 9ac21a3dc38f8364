"""ONNX model -> tensor-level UOp graph.

The importer reads the model with the `onnx` package, resolves every graph input's shape (symbolic
dims must be fixed by the options for now), turns initializers into WEIGHTs by reference to their
data, and imports the nodes (graph_import.py: one registered handler per node in dependency order,
nested scopes for subgraphs, function bodies for ops without a handler). Every node that cannot be
handled is collected, and all of them are reported at once.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import onnx

# Importing the op families registers their handlers.
import svodc.frontend.ops  # noqa: F401
from svodc.errors import (
    InputShapeError,
    InvalidModelError,
    ModelLoadError,
    UnsupportedModelError,
    UnsupportedNode,
    WeightsError,
)
from svodc.frontend.boundary import graph_input, graph_output
from svodc.frontend.dims import DimTable, bounded_axes, check_bounded
from svodc.frontend.dtypes import UnsupportedDType, onnx_to_dtype
from svodc.frontend.graph_import import POISON, GraphImporter, Scope
from svodc.frontend.option_check import check_options, check_value_dims_used, describe_inputs, fixes_unknown_dims
from svodc.frontend.qdq import MS as MS_DOMAIN
from svodc.frontend.qdq import fuse_qdq
from svodc.frontend.strings import Vocabulary
from svodc.frontend.values import EdgeStrings, ZipMapValue
from svodc.frontend.weights import ExternalData, weight_files
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.provenance import Provenance
from svodc.ir.uop import UOp, toposort
from svodc.options import CompileOptions
from svodc.program import ImportedGraph

ModelSource = str | os.PathLike | bytes | onnx.ModelProto


def load_model(source: ModelSource) -> onnx.ModelProto:
    if isinstance(source, onnx.ModelProto):
        return source
    try:
        if isinstance(source, bytes):
            return onnx.load_from_string(source)
        path = Path(source)
        if path.is_dir():
            raise ModelLoadError(f"model path {str(path)!r} is a directory, not an .onnx file")
        if not path.exists():
            raise ModelLoadError(f"model file {str(path)!r} does not exist")
        if not path.is_file():
            raise ModelLoadError(f"model path {str(path)!r} is not a regular file (a FIFO or device)")
        # external data stays where it is: frontend/weights.py maps it relative to the model's folder
        return onnx.load(str(path), load_external_data=False)
    except ModelLoadError:
        raise
    except Exception as e:  # protobuf raises DecodeError, RuntimeWarning-derived errors, OSError...
        where = "model bytes" if isinstance(source, bytes) else repr(str(source))
        raise ModelLoadError(f"cannot parse {where} as an ONNX model: {type(e).__name__}: {e}") from e


def import_model(source: ModelSource, options: CompileOptions | None = None,
                 base_dir: str | os.PathLike | None = None) -> ImportedGraph:
    """base_dir: where the model's external data files are (default: the model file's folder)."""
    options = options or CompileOptions()
    if base_dir is None and isinstance(source, (str, os.PathLike)):
        base_dir = Path(source).parent
    external = ExternalData(Path(base_dir) if base_dir is not None else None)
    model = load_model(source)
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    opsets = {o.domain if o.domain != "ai.onnx" else "": o.version for o in model.opset_import}
    if not opsets:  # (a model may import only other domains: ai.onnx.ml alone, say)
        raise InvalidModelError("the model imports no opset")
    for domain, version in opsets.items():
        newest = newest_opset(domain)
        if newest is not None and version > newest:
            raise InvalidModelError(f"the model imports {domain or 'ai.onnx'} opset {version}, newer than the "
                                    f"{newest} this onnx package ({onnx.__version__}) knows: upgrade onnx, or convert "
                                    f"the model down with onnx.version_converter")
    if not model.graph.output:
        raise InvalidModelError("the model declares no graph outputs: there is nothing to compute")
    graph = model.graph
    prov = Provenance()
    scope = Scope()
    vocabulary = Vocabulary()

    for init in graph.initializer:
        scope.set(init.name, _weight(init, external, vocabulary))
    supplied = weight_files(options.weights, graph)
    for name, (dtype, array) in supplied.items():  # --weights: supply or override
        scope.set(name, UOp(Ops.WEIGHT, dtype, (), ConstData(array)))
    for init in graph.sparse_initializer:
        raise UnsupportedModelError([UnsupportedNode(init.values.name, "sparse_initializer", "", opsets.get("", 0),
                                                     "sparse initializers are not supported")])
    names = {vi.name for vi in graph.input}
    check_options(graph, options, {init.name for init in graph.initializer})
    unknown = {n for n in options.input_values if n not in names and n.split("[")[0] not in names}
    if unknown:
        raise InputShapeError(f"--input-value names {sorted(unknown)}, which are not inputs of the model")
    inputs = []
    problems: list[UnsupportedNode] = []
    initialized = {init.name for init in graph.initializer}
    check_bounded([vi for vi in graph.input if vi.name not in initialized], options.dims, options.input_shapes,
                  options.input_values)
    dim_table = DimTable()
    for vi in graph.input:
        if vi.name in scope.values:  # an initializer listed as an input (IR < 4): a constant
            continue
        try:
            value, bundle_inputs = graph_input(vi, options, vocabulary, dim_table)
        except UnsupportedModelError as e:  # e.g. a string input: listed with the nodes that fail
            problems += e.nodes
            scope.set(vi.name, POISON)
            continue
        scope.set(vi.name, value)
        inputs += bundle_inputs

    importer = GraphImporter(prov, lambda init: _weight(init, external, vocabulary), vocabulary,
                             bounded_axes(dim_table) if dim_table.dims else None, options.loop_bounds,
                             options.dims, options.step_loops)
    nodes, contrib = fuse_qdq(graph, set(supplied))  # QDQ patterns as the quantized ops (frontend/qdq.py)
    if contrib:
        opsets.setdefault(MS_DOMAIN, 1)
    problems += importer.import_graph_nodes(graph, scope, opsets, nodes)
    outputs, zipmaps, edge = [], [], []
    for vi in graph.output:
        v = scope.get(vi.name, None)
        if v is None:
            raise InvalidModelError(f"graph output {vi.name!r} is not produced by any node")
        if v is POISON:
            continue
        if isinstance(v, ZipMapValue):
            zipmaps.append((vi.name, v.keys))
        if isinstance(v, EdgeStrings):
            edge.append((vi.name, v, "output"))
        outputs += graph_output(vi.name, v)  # string outputs are ids: svodrt decodes them (format 1.5)
    edge = _string_program(vocabulary, dim_table, edge, inputs)
    if problems and all(p.shape_error for p in problems) and fixes_unknown_dims(graph, options):
        given = " ".join([f"--input-shape {k}={'x'.join(map(str, v))}" for k, v in options.input_shapes.items()]
                         + [f"--dim {k}={v}" for k, v in options.dims.items()])
        inputs = describe_inputs(graph, {init.name for init in graph.initializer})
        raise InputShapeError(f"with the shapes given ({given}) the model does not compute: {problems[0]}; check "
                              f"them against the model's inputs {inputs}")
    if problems:
        raise UnsupportedModelError(problems)
    sized = {d[0] for n in toposort([o for _, o in outputs]) if n.op is Ops.SIZED for d in n.arg.dims if d}
    check_value_dims_used(options, sized, set(dim_table.dims))
    producer = f"{model.producer_name} {model.producer_version}".strip()
    return ImportedGraph(inputs, outputs, prov, producer, frozenset(importer.expanded), vocabulary.strings,
                         tuple(zipmaps), tuple(edge), importer.op_types, tuple(dim_table.dims.values()),
                         dim_table.input_axes)


def _string_program(vocabulary: Vocabulary, dim_table: DimTable, returned: list[tuple[str, EdgeStrings, str]],
                    inputs: list[tuple[str, UOp]]) -> list[tuple[str, EdgeStrings, str]]:
    """svodrt's string program (format 1.8) in order: the results code reads, which become code inputs
    after the graph's (appended to `inputs`), the `returned` graph outputs that are not among them, checks."""
    bounded = set(dim_table.input_axes)
    for name, (step, x) in vocabulary.edge_inputs.items():
        if reads := bounded & {s for s in step.sources if isinstance(s, str)}:
            raise InputShapeError(f"{step.op} {name!r} reads {sorted(reads)}, which have bounded dims: string ops on "
                                  "run-time strings need fixed input shapes (fix them with --input-shape)")
        for axis, dim, lo, hi in step.bounded:  # StringSplit's substrings: up to maxsplit + 1 of them
            dim_table.bind(name, axis, dim, lo, hi)
            bounded.add(name)
        inputs.append((name, x))
    names = {name for name, _, _ in returned}
    return [(name, step, "both" if name in names else "input") for name, (step, _) in vocabulary.edge_inputs.items()
            ] + [e for e in returned if e[0] not in vocabulary.edge_inputs] + [
        (step.name, step, "check") for step in vocabulary.edge_checks]


@functools.cache
def newest_opset(domain: str) -> int | None:
    """The newest opset of an ONNX domain that the installed onnx package has schemas for; None for
    custom domains (their versions are the model's business)."""
    if domain == "":
        return onnx.defs.onnx_opset_version()
    versions = [s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.domain == domain]
    return max(versions) if versions else None


def _weight(init: onnx.TensorProto, external: ExternalData, vocabulary: Vocabulary) -> UOp:
    try:
        dtype = onnx_to_dtype(init.data_type, where=f"initializer {init.name!r}")
        if dtype is dtypes.string:  # interned: the tensor holds ids (frontend/strings.py)
            return vocabulary.constant(onnx.numpy_helper.to_array(init), f"initializer {init.name!r}")
        array = external.array(init, dtype)
    except UnsupportedDType as e:
        raise UnsupportedModelError([UnsupportedNode(init.name, "initializer", "", 0, str(e))]) from None
    except WeightsError:
        raise
    except Exception as e:
        raise InvalidModelError(f"initializer {init.name!r} cannot be read: {e}") from e
    return UOp(Ops.WEIGHT, dtype, (), ConstData(np.asarray(array, dtype=dtype.np)))
