"""Importing the nodes of a graph: one handler call per node, in dependency order, in a scope.

- Scopes nest: a subgraph (the branches of If, the bodies of Loop and Scan) is imported in a child
  scope of the node that owns it, so it reads values of the enclosing graphs by name.
- An op without a handler whose schema defines it as a function (`onnx.defs` `function_body`, or a
  context-dependent function built for the node's attributes and input types) is inlined: the body's
  nodes are renamed into the caller's scope under a unique prefix and imported like any other node,
  at the body's own opset. The op types expanded this way are recorded (`expanded`).
- Every node that cannot be handled is collected (never just the first); values computed from a
  failed node are poisoned so their consumers are skipped rather than reported twice.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools

import onnx
import onnx.defs

from svodc.errors import InvalidModelError, UnsupportedNode
from svodc.frontend.context import NeedsConstant, NodeContext, Unsupported
from svodc.frontend.dtypes import UnsupportedDType, dtype_to_onnx
from svodc.frontend.registry import NoHandler, lookup
from svodc.frontend.strings import Vocabulary, string_use_problem
from svodc.frontend.values import EdgeStrings, OptionalValue, SequenceValue, Value, ZipMapValue
from svodc.ir.provenance import Provenance
from svodc.ir.shapes import ShapeError
from svodc.ir.uop import UOp

POISON = object()  # the value of an output whose node failed: consumers are skipped silently
_MISSING = object()


class Scope:
    """Values by name; lookups fall back to the enclosing scope."""

    def __init__(self, parent: Scope | None = None):
        self.parent = parent
        self.values: dict[str, object] = {}

    def get(self, name: str, default: object = _MISSING) -> object:
        s: Scope | None = self
        while s is not None:
            if name in s.values:
                return s.values[name]
            s = s.parent
        return default

    def set(self, name: str, value: object) -> None:
        self.values[name] = value

    def names(self) -> set[str]:
        out: set[str] = set()
        s: Scope | None = self
        while s is not None:
            out |= s.values.keys()
            s = s.parent
        return out


class SubgraphUnsupported(Unsupported):
    """Nodes inside a subgraph cannot be compiled; the importer reports them, not the owning node."""

    def __init__(self, graph_name: str, problems: list[UnsupportedNode]):
        super().__init__(f"in subgraph {graph_name!r}: " + "; ".join(str(p) for p in problems))
        self.problems = problems


def _with(label: UnsupportedNode, reason: str, needs: tuple[str, ...] = ()) -> UnsupportedNode:
    return UnsupportedNode(label.name, label.op_type, label.domain, label.opset, reason, needs)


class GraphImporter:
    def __init__(self, prov: Provenance, weight_of_initializer, vocabulary: Vocabulary, bounded_axes=None,
                 loop_bounds: dict[str, int] | None = None,
                 dim_bounds: dict[str, object] | None = None, step_loops: bool = True):
        self.prov = prov
        self.step_loops = step_loops  # CompileOptions.step_loops
        self.dim_bounds = dim_bounds or {}  # CompileOptions.dims, for value-sized dims (frontend/runtime_dims.py)
        self.bounded_axes = bounded_axes  # UOp -> which axes a bounded dim sizes (frontend/dims.py), or None
        self.loop_bounds = loop_bounds or {}  # CompileOptions.loop_bounds
        self.weight_of_initializer = weight_of_initializer  # onnx.TensorProto -> UOp
        self.vocabulary = vocabulary  # the model's strings (frontend/strings.py)
        self.expanded: set[str] = set()  # op types imported through their function bodies
        self.op_types: dict[str, str] = {}  # node name (as provenance names it) -> op type, for profiles
        self._ids = itertools.count()

    # ------------------------------------------------------------------ graphs
    def import_graph_nodes(self, graph: onnx.GraphProto, scope: Scope, opsets: dict[str, int],
                           nodes: list[onnx.NodeProto] | None = None) -> list[UnsupportedNode]:
        """nodes: the graph's nodes as a frontend pass rewrote them (default: graph.node)."""
        problems: list[UnsupportedNode] = []
        for node in dependency_order(graph.node if nodes is None else nodes, scope.names()):
            self.import_node(node, scope, opsets, problems)
        return problems

    def run_subgraph(self, graph: onnx.GraphProto, inputs: list[Value | None], outer: Scope,
                     opsets: dict[str, int]) -> list[Value | None]:
        """Import a subgraph in a child scope of `outer` with its formal inputs bound to `inputs`."""
        scope = Scope(outer)
        for init in graph.initializer:
            scope.set(init.name, self.weight_of_initializer(init))
        for vi, v in zip(graph.input, inputs, strict=False):
            scope.set(vi.name, v)
        problems = self.import_graph_nodes(graph, scope, opsets)
        if problems:
            raise SubgraphUnsupported(graph.name, problems)
        outs = []
        for vi in graph.output:
            v = scope.get(vi.name, None)
            if v is POISON or v is None:
                raise Unsupported(f"subgraph {graph.name!r} does not produce its output {vi.name!r}")
            outs.append(v)
        return outs

    # ------------------------------------------------------------------ nodes
    def import_node(self, node: onnx.NodeProto, scope: Scope, opsets: dict[str, int],
                    problems: list[UnsupportedNode]) -> None:
        domain = "" if node.domain == "ai.onnx" else node.domain
        opset = opsets.get(domain)
        label = UnsupportedNode(node.name, node.op_type, domain, opset or 0, "")
        self.op_types[node.name or node.output[0]] = f"{domain}.{node.op_type}" if domain else node.op_type
        if opset is None:
            problems.append(_with(label, f"the model imports no opset for domain {domain!r}"))
            return self._poison(node, scope)
        srcs = [scope.get(name, None) if name else None for name in node.input]
        if any(s is POISON for s in srcs):
            # An input comes from a node that already failed: skip it, but still report an op that
            # could never compile, so one error lists every offending node of the model.
            try:
                lookup(domain, node.op_type, opset)
            except NoHandler as e:
                if not _has_function(node.op_type, domain, opset):
                    problems.append(_with(label, str(e)))
            return self._poison(node, scope)
        try:
            handler, version = lookup(domain, node.op_type, opset)
        except NoHandler as e:
            body = function_body(node, domain, opset, srcs)
            if body is None:
                problems.append(_with(label, str(e)))
                return self._poison(node, scope)
            return self._inline(node, body, scope, opsets, problems, label)

        def subgraph_runner(g: onnx.GraphProto, inputs: list[Value | None]) -> list[Value | None]:
            return self.run_subgraph(g, inputs, scope, opsets)

        if not handler.strings and (why := string_use_problem(node.op_type, srcs, ())):
            problems.append(_with(label, why))
            return self._poison(node, scope)
        ctx = NodeContext(node, srcs, version, opset, subgraph_runner, self.vocabulary, self.bounded_axes,
                          self.loop_bounds, self.dim_bounds, realize=self.prov.ask_realize,
                          step_loops=self.step_loops)
        try:
            result = handler.fn(ctx)
            outs = [result] if isinstance(result, UOp | SequenceValue | OptionalValue | ZipMapValue | EdgeStrings) \
                else list(result)
            for o in outs:
                if isinstance(o, UOp):
                    _ = o.shape  # shape errors belong to this node
            if not handler.strings and (why := string_use_problem(node.op_type, (), outs)):
                raise Unsupported(why)  # e.g. Cast to STRING: the handler would cast numbers to "ids"
        except SubgraphUnsupported as e:  # report the nodes inside, which are what cannot compile
            problems.extend(e.problems)
            return self._poison(node, scope)
        except NeedsConstant as e:
            problems.append(dataclasses.replace(_with(label, str(e), e.inputs), needs_dims=getattr(e, "dims", ())))
            return self._poison(node, scope)
        except (Unsupported, UnsupportedDType, ShapeError) as e:
            problems.append(dataclasses.replace(_with(label, str(e)), shape_error=isinstance(e, ShapeError)))
            return self._poison(node, scope)
        outs += [None] * (len(node.output) - len(outs))
        for name, o in zip(node.output, outs, strict=False):
            if name:
                if o is None:
                    problems.append(_with(label, f"output {name!r} is not produced by this implementation"))
                    o = POISON
                scope.set(name, o)
        self.prov.tag_new([o for o in _tensors(outs)], list(_tensors(srcs)), [node.name or node.output[0]])

    def _poison(self, node: onnx.NodeProto, scope: Scope) -> None:
        for name in node.output:
            if name:
                scope.set(name, POISON)

    def _inline(self, node: onnx.NodeProto, body: onnx.FunctionProto, scope: Scope, outer_opsets: dict[str, int],
                problems: list[UnsupportedNode], label: UnsupportedNode) -> None:
        prefix = f"{node.name or node.output[0]}/{node.op_type}#{next(self._ids)}/"
        nodes = inline_nodes(node, body, prefix, schema_defaults(node.op_type, label.domain, label.opset))
        # the body's own opsets; domains it does not declare keep the caller's
        opsets = {**outer_opsets, **{("" if o.domain == "ai.onnx" else o.domain): o.version for o in body.opset_import}}
        inner: list[UnsupportedNode] = []
        for n in dependency_order(nodes, scope.names()):
            self.import_node(n, scope, opsets, inner)
        if inner:
            needs = tuple(dict.fromkeys(n for p in inner for n in p.needs_values))
            dims = tuple(dict.fromkeys(n for p in inner for n in p.needs_dims))
            why = "; ".join(f"{p.op_type}: {p.reason}" for p in inner)
            problems.append(dataclasses.replace(_with(label, f"no handler, and its ONNX function body does not "
                                                             f"compile: {why}", needs), needs_dims=dims))
            return self._poison(node, scope)
        self.expanded.add(node.op_type if not label.domain else f"{label.domain}.{node.op_type}")


def _tensors(values) -> list[UOp]:
    return [v for v in values if isinstance(v, UOp)]


# ---------------------------------------------------------------------------------- functions
def _type_proto(v: Value | None) -> onnx.TypeProto:
    if isinstance(v, UOp):
        return onnx.helper.make_tensor_type_proto(dtype_to_onnx(v.dtype), list(v.shape))
    if isinstance(v, SequenceValue):
        return onnx.helper.make_sequence_type_proto(onnx.helper.make_tensor_type_proto(dtype_to_onnx(v.dtype), None))
    return onnx.TypeProto()


def _has_function(op_type: str, domain: str, opset: int) -> bool:
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return False
    return schema.has_function or schema.has_context_dependent_function


def _body_version(versions: list[int], opset: int) -> int:
    """The body written for the newest opset the model imports; a body is written in the ops of some
    opset but defines the schema it belongs to, so when every body is newer than the model (HardSigmoid-6
    has one written in opset 18 ops) the oldest one still defines this op."""
    older = [v for v in versions if v <= opset]
    return max(older) if older else min(versions)


def function_body(node: onnx.NodeProto, domain: str, opset: int, srcs: list[Value | None]) -> onnx.FunctionProto | None:
    """The op's function body at the model's opset (None when the schema defines none)."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
    data = None
    if schema.has_function and schema.function_opset_versions:
        data = schema.get_function_with_opset_version(_body_version(schema.function_opset_versions, opset))
    elif schema.has_context_dependent_function and schema.context_dependent_function_opset_versions:
        version = _body_version(schema.context_dependent_function_opset_versions, opset)
        types = [_type_proto(s).SerializeToString() for s in srcs]
        try:
            data = schema.get_context_dependent_function_with_opset_version(version, node.SerializeToString(), types)
        except Exception:  # the builder rejects input types it has no body for
            return None
    if not data:
        return None
    body = onnx.FunctionProto()
    body.ParseFromString(data)
    return body


def inline_nodes(node: onnx.NodeProto, body: onnx.FunctionProto, prefix: str,
                 schema_attrs: dict[str, onnx.AttributeProto]) -> list[onnx.NodeProto]:
    """The body's nodes with formal inputs/outputs renamed to the caller's, other values prefixed,
    and attribute references (`ref_attr_name`) replaced by the caller's attributes or the defaults."""
    rename: dict[str, str] = {"": ""}
    for i, formal in enumerate(body.input):
        rename[formal] = node.input[i] if i < len(node.input) else ""
    for i, formal in enumerate(body.output):
        rename[formal] = node.output[i] if i < len(node.output) else prefix + formal
    caller_attrs = {a.name: a for a in node.attribute}
    defaults = {**schema_attrs, **{a.name: a for a in body.attribute_proto}}

    def attr(a: onnx.AttributeProto) -> onnx.AttributeProto | None:
        if a.ref_attr_name:
            src = caller_attrs.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
            if src is None:
                return None
            out = onnx.AttributeProto()
            out.CopyFrom(src)
            out.name = a.name
            return out
        if a.type == onnx.AttributeProto.GRAPH:
            out = onnx.AttributeProto()
            out.CopyFrom(a)
            _rename_graph(out.g, rename, prefix, attr)
            return out
        return a

    out = []
    for n in body.node:
        new = onnx.NodeProto()
        new.op_type, new.domain = n.op_type, n.domain
        new.name = prefix + (n.name or n.op_type)
        new.input.extend(rename.get(x, prefix + x) for x in n.input)
        new.output.extend(rename.setdefault(x, prefix + x) for x in n.output)
        new.attribute.extend(a for a in map(attr, n.attribute) if a is not None)
        out.append(new)
    return out


def schema_defaults(op_type: str, domain: str, opset: int) -> dict[str, onnx.AttributeProto]:
    """The default values the op's schema gives its optional attributes (Elu's alpha=1.0): a body
    refers to them when the caller leaves them out and the body declares no default of its own."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return {}
    return {name: a.default_value for name, a in schema.attributes.items()
            if a.default_value.type != onnx.AttributeProto.UNDEFINED}


def _rename_graph(g: onnx.GraphProto, rename: dict[str, str], prefix: str, attr) -> None:
    """Inside a nested graph of a function body, rename references to the function's values."""
    for n in g.node:
        for i, x in enumerate(n.input):
            if x in rename:
                n.input[i] = rename[x]
        new_attrs = [a2 for a2 in map(attr, n.attribute) if a2 is not None]
        del n.attribute[:]
        n.attribute.extend(new_attrs)
    for o in g.output:
        if o.name in rename:
            o.name = rename[o.name]


# ---------------------------------------------------------------------------------- order
def dependency_order(nodes, available: set[str]) -> list[onnx.NodeProto]:
    """Nodes in an order where every input is produced before use (Kahn's algorithm, the file's own
    order wherever it is valid). Raises on a cycle or on an input that nothing produces."""
    nodes = list(nodes)
    producers: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for o in node.output:
            if o:
                if o in producers:
                    raise InvalidModelError(f"value {o!r} is produced twice (node {node.name!r})")
                producers[o] = i
    deps: list[set[int]] = []
    for node in nodes:
        d = set()
        for name in [*node.input, *_outer_reads(node)]:
            if name == "" or (name in available and name not in producers):
                continue
            if name not in producers:
                raise InvalidModelError(f"node {node.name!r} ({node.op_type}) reads {name!r}, which is neither "
                                        "a graph input, an initializer nor the output of a node")
            d.add(producers[name])
        deps.append(d)
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(i)
    waiting = [len(d) for d in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, []):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = [nodes[i].name or nodes[i].op_type for i, w in enumerate(waiting) if w > 0][:5]
        raise InvalidModelError(f"the graph has a cycle through nodes {stuck}")
    return [nodes[i] for i in order]


def _outer_reads(node: onnx.NodeProto) -> list[str]:
    """Values a node's subgraphs read from the enclosing scope (they must be computed first)."""
    names: list[str] = []
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            local = {vi.name for vi in g.input} | {i.name for i in g.initializer}
            local |= {o for n in g.node for o in n.output}
            for n in g.node:
                names += [x for x in [*n.input, *_outer_reads(n)] if x and x not in local]
            names += [o.name for o in g.output if o.name not in local]
    return names
