"""svodrt_strings: a bundle's strings at the edge: string ids (`ids.py`, format 1.4) and the string program
(manifest `edge_outputs`, formats 1.6 and 1.8, docs/bundle-format.md "Strings"): string ops svodrt runs in Python
on string inputs before native code, outside the core runtime's line budget (docs/architecture.md "Runtime").
svodrt imports it only for a bundle that has strings (`edge.py`, for svodrt's Runner; `manifest.py` and the program's
parse_steps, for svodrt/schema.py); it imports svodrt, never the reverse at module level, and only stdlib and numpy
besides. svodc folds constant string ops with the same `edge_value`, so folding and run time agree."""

from svodrt_strings.manifest import parse_vocabulary, parse_zipmaps
from svodrt_strings.program import EDGE_OPS, StringProgram, edge_value, normalize, parse_steps

__all__ = ["EDGE_OPS", "StringProgram", "edge_value", "normalize", "parse_steps", "parse_vocabulary", "parse_zipmaps"]
