"""`svodrt profile`'s outputs: a table naming each kernel's op types and ONNX nodes, a Chrome/Perfetto
trace (chrome://tracing, ui.perfetto.dev: one complete "X" event per kernel on the one profiling thread,
laid end to end in execution order) and an SVG chart (time by op type, slowest kernels), written
directly so it needs nothing beyond the runtime's dependencies."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from xml.sax.saxutils import escape

import numpy as np

from svodrt.model import KERNEL_FN


@dataclass(frozen=True)
class KernelRow:
    kernel: str
    seconds: float
    nodes: tuple[str, ...]
    ops: tuple[str, ...]  # distinct op types of its nodes, in order ("?" where the bundle does not say)

    @property
    def op_label(self) -> str:
        return "+".join(self.ops) or "?"


def kernel_times(model, feeds, repeat: int = 10) -> list[tuple[str, float, tuple[str, ...]]]:
    """Time each kernel of a loaded CPU model alone (single-threaded, its own entry point): [(kernel, median
    seconds, ONNX nodes)], in execution order. Times are the calling thread's CPU time, so a busy machine that
    preempts the thread does not inflate them. Lives here, not in svodrt: a tool, not the minimal runtime; it
    goes through the model's own call path (_call: checked inputs, an arena, the buffer table)."""
    model._begin()  # the code stays mapped until _end (raises ModelClosedError after close())
    try:
        fns = [KERNEL_FN(model._code.address + off) for off in model.variant.kernels]
        times: list[list[float]] = [[] for _ in fns]

        def each_kernel(table, _sync, dims=None) -> None:
            for _ in range(repeat):
                for i, fn in enumerate(fns):
                    t0 = time.thread_time()
                    fn(table, dims, 0, 1)
                    times[i].append(time.thread_time() - t0)

        arrays, dims = model._prepare(feeds)
        model._call(arrays, each_kernel, dims=dims)
    finally:
        model._end()
    return [(k.name, float(np.median(t)), k.provenance) for k, t in zip(model.bundle.kernels, times, strict=True)]


def kernel_rows(model, timings: list[tuple[str, float, tuple[str, ...]]]) -> list[KernelRow]:
    """kernel_times' rows with op types from the manifest's `node_ops` (bundles from svodc 0.1.0 on)."""
    node_ops = model.bundle.manifest.get("node_ops", {})
    node_ops = node_ops if isinstance(node_ops, dict) else {}
    return [KernelRow(k, t, tuple(nodes), tuple(dict.fromkeys(str(node_ops.get(n, "?")) for n in nodes)))
            for k, t, nodes in timings]


def print_table(rows: list[KernelRow], top: int) -> None:
    total = sum(r.seconds for r in rows) or 1e-12
    width = max([len("kernel"), *(len(r.kernel) for r in rows)])
    print(f"{'kernel':{width}s} {'ms':>8s} {'%':>6s}  op types: onnx nodes")
    for r in sorted(rows, key=lambda r: -r.seconds)[:top]:
        print(f"{r.kernel:{width}s} {1e3 * r.seconds:8.3f} {100 * r.seconds / total:6.1f}  {r.op_label}: "
              f"{', '.join(r.nodes) or '-'}")
    print(f"{'total (sum of medians)':{width}s} {1e3 * total:8.3f}")
    by_op = by_op_type(rows)
    print("by op type: " + ", ".join(f"{op} {1e3 * t:.3f} ms" for op, t in by_op[:10]))


def by_op_type(rows: list[KernelRow]) -> list[tuple[str, float]]:
    """Time per op-type label, largest first (a fused kernel counts under its combined label)."""
    acc: dict[str, float] = defaultdict(float)
    for r in rows:
        acc[r.op_label] += r.seconds
    return sorted(acc.items(), key=lambda kv: -kv[1])


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def trace_events(rows: list[KernelRow]) -> dict:
    events, ts = [], 0.0
    for i, r in enumerate(rows):
        dur = r.seconds * 1e6
        events.append({"name": r.kernel, "cat": r.op_label, "ph": "X", "ts": round(ts, 3), "dur": round(dur, 3),
                       "pid": 0, "tid": 0, "args": {"index": i, "op_types": list(r.ops), "onnx_nodes": list(r.nodes)}})
        ts += dur
    meta = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "svodrt profile"}}]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def write_trace(rows: list[KernelRow], path: str) -> None:
    _atomic_write(path, json.dumps(trace_events(rows), indent=0))


def _bars(title: str, items: list[tuple[str, float]], y: int, width: int) -> tuple[list[str], int]:
    out = [f'<text x="10" y="{y}" font-weight="bold">{escape(title)}</text>']
    y += 10
    peak = max((t for _, t in items), default=0) or 1e-12
    for label, t in items:
        w = max(1.0, (width - 420) * t / peak)
        out.append(f'<rect x="300" y="{y}" width="{w:.1f}" height="14" fill="#4a7ebb"/>')
        out.append(f'<text x="295" y="{y + 11}" text-anchor="end">{escape(label[:48])}</text>')
        out.append(f'<text x="{305 + w:.1f}" y="{y + 11}">{1e3 * t:.3f} ms</text>')
        y += 18
    return out, y + 20


def chart_svg(rows: list[KernelRow], title: str, top: int = 15) -> str:
    width = 900
    body, y = _bars("time by op type", by_op_type(rows)[:top], 50, width)
    slow = [(f"{r.kernel} ({r.op_label})", r.seconds) for r in sorted(rows, key=lambda r: -r.seconds)[:top]]
    more, y = _bars(f"slowest {len(slow)} kernels", slow, y, width)
    total = sum(r.seconds for r in rows)
    head = f'<text x="10" y="24" font-size="16">{escape(title)}: {len(rows)} kernels, {1e3 * total:.3f} ms</text>'
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" font-family="sans-serif" '
            f'font-size="12">\n{head}\n' + "\n".join(body + more) + "\n</svg>\n")


def write_chart(rows: list[KernelRow], path: str, title: str) -> None:
    _atomic_write(path, chart_svg(rows, title))
