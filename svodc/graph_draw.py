"""`svodc inspect --graph`: the bundle's kernel graph in Graphviz's DOT language, each kernel labelled with
its op types and ONNX nodes; an edge where a kernel reads what another wrote (a kernel's first parameter
is the buffer it writes: docs/bundle-format.md). .dot files are written as text; other formats (.svg,
.png, .pdf) are rendered by Graphviz's `dot` program when it is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from svodc.errors import OutputWriteError, ToolMissingError
from svodrt.bundle import Bundle

MAX_NODES_SHOWN = 6  # ONNX node names per kernel label; the rest are counted


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def kernel_dot(b: Bundle) -> str:
    m = b.manifest
    node_ops = m.get("node_ops", {}) if isinstance(m.get("node_ops"), dict) else {}
    inputs = {t["id"]: t["name"] for t in m["inputs"]}
    outputs = {t["id"]: t["name"] for t in m["outputs"]}
    lines = ["digraph kernels {", "  rankdir=TB;", '  node [shape=box, fontname="sans-serif", fontsize=10];']
    for bid, n in inputs.items():
        lines.append(f"  in{bid} [label={_quote('input ' + n)}, shape=ellipse];")
    for bid, n in outputs.items():
        lines.append(f"  out{bid} [label={_quote('output ' + n)}, shape=ellipse];")
    writer: dict[int, int] = {}
    for i, k in enumerate(b.kernels):
        ops = "+".join(dict.fromkeys(str(node_ops.get(n, "?")) for n in k.provenance)) or "?"
        shown = list(k.provenance[:MAX_NODES_SHOWN])
        if len(k.provenance) > MAX_NODES_SHOWN:
            shown.append(f"(+{len(k.provenance) - MAX_NODES_SHOWN} more)")
        lines.append(f"  k{i} [label={_quote(chr(10).join([f'{k.name}: {ops}', *shown]))}];")
        for p in dict.fromkeys(k.params[1:]):
            if p in writer:
                lines.append(f"  k{writer[p]} -> k{i};")
            elif p in inputs:
                lines.append(f"  in{p} -> k{i};")
        writer[k.params[0]] = i
    for bid in outputs:
        if bid in writer:
            lines.append(f"  k{writer[bid]} -> out{bid};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_graph(b: Bundle, path: str | os.PathLike) -> None:
    """Write the kernel graph to path: DOT text for .dot/.gv, else rendered by Graphviz in that format."""
    out = Path(path)
    dot_text = kernel_dot(b)
    fmt = out.suffix.lstrip(".").lower()
    if fmt in ("dot", "gv"):
        data = dot_text.encode()
    else:
        dot = shutil.which("dot")
        if dot is None:
            raise ToolMissingError(f"--graph {out}: drawing {fmt or 'an image'} needs Graphviz's `dot` program "
                                   f"(apt install graphviz, brew install graphviz); or write DOT text: --graph "
                                   f"{out.with_suffix('.dot')}")
        r = subprocess.run([dot, f"-T{fmt}"], input=dot_text.encode(), capture_output=True, timeout=300)
        if r.returncode != 0:
            raise ToolMissingError(f"--graph {out}: Graphviz failed: {r.stderr.decode(errors='replace').strip()}")
        data = r.stdout
    try:
        fd, tmp = tempfile.mkstemp(dir=out.parent if str(out.parent) else ".", prefix=f".{out.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, out)
    except OSError as e:
        raise OutputWriteError(f"cannot write {str(out)!r}: {e.strerror or e}") from None
