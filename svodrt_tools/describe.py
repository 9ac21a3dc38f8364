"""A human-readable description of a bundle (svodrt info, svodc inspect)."""

from __future__ import annotations

from pathlib import Path

from svodrt.bundle import Bundle, Source, parse_bundle
from svodrt.format import GPU_KINDS
from svodrt.host import Host, detect_host
from svodrt.model import variant_problem
from svodrt_gpu.plan import gpu_variant


def _size(n: float) -> str:
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            break
        n /= 1024
    return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"


def describe_bundle(b: Bundle, host: Host | None = None, verbose: bool = False) -> str:
    host = host or detect_host()
    m = b.manifest
    producer = m.get("producer", {})
    lines = [f"format {b.header.major}.{b.header.minor}, made by {producer.get('name')} {producer.get('version')}",
             "inputs:"]
    steps = {e[0]: e for e in b.edge_outputs}  # format 1.8: inputs run() fills from the string inputs
    lines += [f"  {t}" + (f"  (filled by run(): {steps[t.name][1]} of {', '.join(map(str, steps[t.name][2]))})"
                          if t.name in steps else "") for t in b.inputs]  # bounded dims by name (format 1.5)
    if any(t.dtype == "string" for t in b.inputs):
        lines.append(f"  (string inputs: numpy arrays of str; the model knows {len(b.vocabulary)} strings)")
    lines += ["outputs:"] + [f"  {t}" for t in b.outputs] + [
        f"  {name}  (computed by run(): {op} of {', '.join(map(str, src))})"
        for name, op, src, _, role in b.edge_outputs if role in ("output", "both")]
    lines.append("code variants (the first one this host's CPU can run is used, unless a GPU device is asked for):")
    chosen = None
    for v in b.variants:
        if v.kind != "cpu":
            g = gpu_variant(b, v) if v.kind in GPU_KINDS else None  # a later format's kind: its code only
            cubin = f" + cubin {_size(g.cubin.length)}" if g and g.cubin else ""
            launches = len(g.launches) if g else 0
            lines.append(f"  {v.describe()}  code {_size(v.section.length)}{cubin}, {launches} launches; "
                         f"load with device='{v.kind}:N'")
            continue
        mark = "*" if chosen is None and variant_problem(v, host) is None else " "
        chosen = chosen or (v if mark == "*" else None)
        feats = ", ".join(v.features) if v.features else "baseline"
        lines.append(f" {mark}{v.arch}:{v.cpu}  code {_size(v.section.length)}, {len(v.fixups)} fixups; "
                     f"needs {feats}")
    if chosen is None:
        lines.append(f"  (none runs on this {host.arch} host)")
    lines.append(f"memory: arena {_size(b.arena_size)}, weights {_size(b.weights_size)} "
                 f"({m.get('byte_order', 'little')}-endian data)")
    lines.append("sections:")
    lines += [f"  {s.name}: {_size(s.length)} at offset {s.offset}" for s in b.sections]
    lines.append(f"kernels: {len(b.kernels)}")
    if verbose:
        kinds = [k.get("kind") if isinstance(k, dict) else None for k in m.get("kernels", [])]
        for k, kind in zip(b.kernels, kinds, strict=False):
            src = ", ".join(k.provenance[:6]) + (f" (+{len(k.provenance) - 6})" if len(k.provenance) > 6 else "")
            lines.append(f"  {k.name}{f' [{kind}]' if isinstance(kind, str) else ''}: {src or '-'}")
    return "\n".join(lines)


def describe(path: str | Path, verbose: bool = False) -> str:
    src = Source.open(path)  # regular files only; read by offset, bounded like load()
    try:
        return describe_bundle(parse_bundle(src), verbose=verbose)
    finally:
        src.close()
