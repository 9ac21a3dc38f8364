"""Kernels -> LLVM modules, made as the kernels come: LLVM compiles the first modules while the passes still
lower the last kernels (issue 13; svodc/codegen/compile.py KernelStream, fed by passes/pipeline.build_program).

A kernel is a *body* (its code over its parameters, `@<name>.body`) and a *wrapper* (`@<name>`: finds the
parameters in the buffer table and calls a body; llvm_ir.render_wrapper). Kernels whose bodies render to the
same text share one body, compiled once: identical code over different buffers (ResNet-50's repeated blocks),
or over different places in them and with different compared constants, through their templates (a recurrent
layer's steps: share.py). A kernel whose template matches no other kernel's keeps its own code.

The modules, from the kernels in program order:
- each new body goes into the next body module, `per_module` distinct bodies each (compile.KERNELS_PER_MODULE),
  in the order the bodies first appear. A kernel whose template changes nothing renders its own code and is
  placed when it comes; a kernel whose template does change something waits until a second kernel shares its
  template (then the template's body is placed) or until the end (then it is placed as the rules above say);
- then a module of every kernel's wrapper, in program order (a body's entry point is a global function, called
  across modules as the entry module calls the wrappers; _entry_point).
The modules are a function of the kernel list alone, and those made from its first n kernels are the first of
those made from all of them: streamed or made at the end, they are the same modules and the same bytes, on any
machine with any number of workers (reproducibility).
"""

from __future__ import annotations

from svodc.codegen.llvm_ir import FN_ATTRS, body_name, render_body, render_wrapper
from svodc.codegen.share import Template, template
from svodc.ir.uop import UOp
from svodc.policy import GemmBlocking
from svodc.program import Kernel
from svodc.target import Target

Rendered = tuple[str, set[str], dict[str, str]]  # body text, the intrinsics it declares, the helpers it calls
# The kernels that share one body: its first kernel's rendering is the body they all call; each kernel's
# template (None: its own code) says what its wrapper passes.
Unit = list[tuple[Kernel, Template | None, Rendered]]
# A module as made: (its name, the kernels whose bodies or wrappers it holds, IR text).
Module = tuple[str, list[Kernel], str]


def header(target: Target, name: str) -> list[str]:
    return [f"; ModuleID = '{name}'", f'target triple = "{target.triple}"', ""]


def attributes(target: Target) -> list[str]:
    tune = f' "tune-cpu"="{target.tune_cpu}"' if target.tune_cpu != "generic" else ""
    return [f"attributes #0 = {{ {FN_ATTRS}{tune} }}"]


def _body_key(kernel: Kernel, rendered: Rendered) -> str:
    """The rendered body with the kernel's name taken out: equal text is equal code, whatever made the
    kernels look alike."""
    return rendered[0].replace(f"@{body_name(kernel)}(", "@(", 1)


def _signature(kernel: Kernel, rendered: Rendered) -> str:
    """`declare void @<name>.body(types...)`, from the body's definition line."""
    line = rendered[0].split("\n", 1)[0]
    params = line[line.index("(") + 1:line.rindex(")")]
    types = ", ".join(p.rsplit(" %", 1)[0] for p in params.split(", "))
    return f"declare void @{body_name(kernel)}({types})"


def _entry_point(kernel: Kernel, body: str) -> list[str]:
    """The body as `@<name>.body.code` (internal) and `@<name>.body` (global: the wrappers' module calls it), which
    calls it. LLVM inlines the code into that one caller and simplifies it a second time there, as it did when
    the code was inlined into a wrapper in its own module; run once, a pad copy's 14-wide rows stayed 14
    scalar moves, not vectors (mobilenetv2 2 % and densenet121 1 % slower)."""
    name = body_name(kernel)
    head, rest = body.split("\n", 1)
    params = head[head.index("(") + 1:head.rindex(")")]
    args = ", ".join(f"{p.split(' ', 1)[0]} %{p.rsplit(' %', 1)[1]}" for p in params.split(", "))
    return [head.replace(f"@{name}(", f"@{name}.code(", 1) + "\n" + rest,
            f"define void @{name}({params}) #0 {{", f"  call void @{name}.code({args})", "  ret void", "}"]


class ModuleBuilder:
    """The modules of one CPU target's kernels (see the module docstring): add() each kernel in program order,
    which returns the body modules it completed; finish() returns the rest, the wrappers' module last."""

    def __init__(self, target: Target, blocking: GemmBlocking, per_module: int):
        self.target, self.blocking, self.per_module = target, blocking, per_module
        self.kernels: list[Kernel] = []  # every kernel added, in order
        self.units: dict[str, Unit] = {}  # body key -> unit, in order of first appearance
        self._unit_of: dict[int, tuple[Unit, Template | None]] = {}  # id(kernel) -> its unit, its template
        self._waiting: dict[tuple[UOp, int], list[tuple[Kernel, Template]]] = {}  # changed templates, by template
        self._placed: dict[tuple[UOp, int], Unit] = {}  # changed templates whose body is placed
        self._new: list[Unit] = []  # units whose bodies no module holds yet
        self._count = 0  # modules made

    def _render(self, kernel: Kernel, tmpl: Template | None) -> Rendered:
        return render_body(kernel, self.target, self.blocking, tmpl)

    def _place(self, members: list[tuple[Kernel, Template | None]], rendered: Rendered) -> list[Module]:
        """members run the body rendered (from members[0]): a body placed before, or a new one."""
        key = _body_key(members[0][0], rendered)
        unit = self.units.get(key)
        if unit is None:
            unit = self.units[key] = []
            self._new.append(unit)
        unit.extend((k, t, rendered) for k, t in members)
        for k, t in members:
            self._unit_of[id(k)] = (unit, t)
        return self._bodies_module() if len(self._new) >= self.per_module else []

    def add(self, kernel: Kernel) -> list[Module]:
        self.kernels.append(kernel)
        tmpl = template(kernel)
        if not tmpl.changed:  # its template is its own code
            return self._place([(kernel, None)], self._render(kernel, None))
        key = (tmpl.ast, len(kernel.params))
        if key in self._placed:  # a template already shared: its body is placed
            unit = self._placed[key]
            unit.append((kernel, tmpl, unit[0][2]))
            self._unit_of[id(kernel)] = (unit, tmpl)
            return []
        group = self._waiting.setdefault(key, [])
        group.append((kernel, tmpl))
        if len(group) < 2:
            return []
        out = self._place(group, self._render(*group[0]))  # shared from now on: the template's body
        self._placed[key] = self._unit_of[id(kernel)][0]
        return out

    def finish(self, nin: int) -> list[Module]:
        """The remaining body modules and the wrappers' module (nin: the program's inputs, which the buffer table
        holds first). A template no other kernel shared: its body is
        shared if another template or kernel renders alike (the text decides), else the kernel's own code."""
        alone: dict[str, list[tuple[Kernel, Template]]] = {}
        renderings: dict[str, Rendered] = {}
        for key, group in self._waiting.items():
            if key in self._placed:
                continue
            (k, tmpl), = group
            rendered = self._render(k, tmpl)
            text = _body_key(k, rendered)
            renderings.setdefault(text, rendered)
            alone.setdefault(text, []).append((k, tmpl))
        out: list[Module] = []
        for text, members in alone.items():
            if len(members) == 1 and text not in self.units:
                k = members[0][0]
                out += self._place([(k, None)], self._render(k, None))
            else:
                out += self._place(members, renderings[text])
        while self._new:
            out += self._bodies_module()
        return out + [self._wrappers_module(nin)]

    def _bodies_module(self) -> list[Module]:
        chunk, self._new = self._new[:self.per_module], self._new[self.per_module:]
        bodies: list[str] = []
        declares: set[str] = set()
        shared: dict[str, str] = {}
        for unit in chunk:
            first, _, (body, intrinsics, helpers) = unit[0]
            bodies += _entry_point(first, body)
            declares |= intrinsics
            shared.update(helpers)
        name = f"bodies{self._count}"
        self._count += 1
        text = "\n".join([*header(self.target, name), *sorted(declares), "", *[shared[n] for n in sorted(shared)],
                          *bodies, "", *attributes(self.target), ""])
        return [(name, [u[0][0] for u in chunk], text)]

    def _wrappers_module(self, nin: int) -> Module:
        """Every kernel's wrapper, in program order; the bodies they call are declared."""
        firsts, wrappers = {}, []
        for k in self.kernels:
            unit, tmpl = self._unit_of[id(k)]
            first, _, rendered = unit[0]
            firsts.setdefault(body_name(first), _signature(first, rendered))
            wrappers.append(render_wrapper(k, nin, body_name(first), tmpl))
        text = "\n".join([*header(self.target, "wrappers"), *firsts.values(), "", *wrappers, "",
                          *attributes(self.target), ""])
        return ("wrappers", list(self.kernels), text)


def kernel_modules(kernels: list[Kernel], nin: int, target: Target, blocking: GemmBlocking,
                   per_module: int) -> list[Module]:
    """All the kernels' modules at once (ModuleBuilder)."""
    b = ModuleBuilder(target, blocking, per_module)
    out = [m for k in kernels for m in b.add(k)]
    return out + b.finish(nin)


def render_units(kernels: list[Kernel], target: Target, blocking: GemmBlocking) -> list[Unit]:
    """The kernels grouped by the body they run, in order of first appearance (tests, inspection)."""
    b = ModuleBuilder(target, blocking, 1 << 30)
    for k in kernels:
        b.add(k)
    b.finish(0)
    return list(b.units.values())
