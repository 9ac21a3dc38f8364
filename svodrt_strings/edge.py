"""The strings at a bundle's edge, for svodrt's Runner (svodrt/runner.py): string inputs in as int32 ids (format
1.4), string and ZipMap outputs decoded (1.6), the string program's results (1.6/1.8). Runner makes one only for a
bundle with string inputs or outputs, ZipMap or edge outputs; a numeric model never imports this package."""

from __future__ import annotations

from collections.abc import Mapping

from svodrt.format import STRING
from svodrt.runner import check_shape
from svodrt_strings.ids import StringTable
from svodrt_strings.program import StringProgram


class Edge:
    def __init__(self, bundle) -> None:
        self.string_inputs = [t for t in bundle.inputs if t.dtype == STRING]
        self.string_outputs = [t.name for t in bundle.outputs if t.dtype == STRING]
        self.table, self.zipmaps = StringTable(bundle.vocabulary), bundle.zipmaps
        self.program = StringProgram(bundle.edge_outputs, bundle.inputs) if bundle.edge_outputs else None
        self.computed = self.program.roles if self.program else {}  # names run() computes
        self.checks_inputs = bool(self.string_inputs or self.computed)  # no fast path for the inputs then

    def complete(self, feeds: Mapping[str, object]) -> Mapping[str, object]:
        """feeds with the string program's results added (the code inputs it fills, the outputs run() returns)."""
        return feeds if self.program is None else self.program.complete(feeds)

    def intern(self, feeds: Mapping[str, object]) -> Mapping[str, object]:
        """feeds with string inputs as int32 ids, one numbering per call (svodrt_strings/ids.py)."""
        if not self.string_inputs:
            return feeds
        for t in self.string_inputs:  # dims first: interning costs a dict lookup per string
            check_shape(t, feeds[t.name])
        return {**feeds, **self.table.intern(self.string_inputs, feeds)}

    def decode(self, result: dict, feeds: Mapping[str, object]) -> None:
        """The outputs as run() returns them: string ids -> str, ZipMap scores -> dicts, the program's outputs."""
        for name in self.string_outputs:
            result[name] = self.table.decode(result[name], self.string_inputs, feeds)
        for name, keys in self.zipmaps:
            result[name] = [dict(zip(keys, row, strict=True)) for row in result[name].tolist()]
        result.update((name, feeds[name]) for name, role in self.computed.items() if role in ("output", "both"))
