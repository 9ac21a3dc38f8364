"""The string program: its steps parsed and checked from the manifest, and run on a call's feeds.

A step is (name, op, sources, attrs, role). Sources are string inputs, earlier steps' results or (StringConcat
only) a one-string constant. role: "output" (run() returns the result), "input" (the result fills a code input
of that name, interned to ids like any string input), "both", or "check" (OneHotEncoder zeros=0: an unknown
category is an InputError, no result). Steps run in manifest order before any input reaches native code.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from svodrt.errors import InputError
from svodrt.format import STRING
from svodrt.runner import check_input, check_shape
from svodrt.schema import TensorInfo, fail
from svodrt_strings.ids import strings_of

EDGE_OPS = {  # op: (its attributes' types, its result's dtype; StringSplit's result 0, the substrings, is strings)
    "StringNormalizer": ({"case": str, "case_sensitive": bool, "stopwords": list}, "string"),
    "StringConcat": ({}, "string"), "RegexFullMatch": ({"pattern": str}, "bool"),
    "StringSplit": ({"delimiter": str, "maxsplit": int, "result": int}, "int64"),
    "OneHotEncoder": ({"categories": list}, "")}  # a check: no result


def parse_steps(raw: list, inputs: list[TensorInfo], outputs: list[TensorInfo]) -> tuple[tuple, ...]:
    """The manifest's `edge_outputs` (1.6's four-item and 1.8's five-item entries) as (name, op, sources, attrs,
    role) in order; a BundleFormatError naming the entry for anything else."""
    by_name, taken, out = {t.name: t for t in inputs}, {t.name for t in outputs + inputs}, []
    ready = {t.name for t in inputs if t.dtype == STRING} - {  # what a step may read
        e[0] for e in raw if type(e) is list and len(e) == 5 and isinstance(e[0], str)}
    ints = {t.name for t in inputs if t.dtype in ("int64", "int32")}  # ... and a OneHotEncoder check
    for i, e in enumerate(raw):
        if type(e) is list and len(e) == 4 and e[1] == "StringNormalizer" and isinstance(e[2], str):
            e = [e[0], e[1], [e[2]], e[3], "output"]  # format 1.6
        if not _step_ok(e, ready, ints, taken, by_name):
            raise fail(f"edge_outputs[{i}]", "must be [name, op, [source], attrs, role] (1.6: "
                       "[new output name, 'StringNormalizer', string input, {case, case_sensitive, stopwords}])")
        (ready if e[4] in ("input", "both") and by_name[e[0]].dtype == STRING else taken).add(e[0])
        out.append((e[0], e[1], tuple(e[2]), e[3], e[4]))
    return tuple(out)


def _step_ok(e: Any, ready: set, ints: set, taken: set, by_name: dict) -> bool:
    if not (type(e) is list and len(e) == 5 and isinstance(e[1], str) and e[1] in EDGE_OPS and isinstance(e[0], str)
            and type(e[2]) is list and type(e[3]) is dict):
        return False
    (spec, dtype), a, t = EDGE_OPS[e[1]], e[3], by_name.get(e[0])
    ready = ready | ints if e[1] == "OneHotEncoder" else ready
    try:
        re.compile(a.get("pattern", ""))
    except (re.error, TypeError):
        return False
    return (set(a) == set(spec) and all(type(a[k]) is v for k, v in spec.items()) and a.get("result", 1) in (0, 1)
            and a.get("case", "NONE") in ("NONE", "LOWER", "UPPER") and a.get("maxsplit", 0) >= -1
            and all(isinstance(w, str) for w in a.get("stopwords", [])) and len(e[2]) == 1 + (e[1] == "StringConcat")
            and all(s in ready if isinstance(s, str) else e[1] == "StringConcat" and type(s) is list and len(s) == 1
                    and isinstance(s[0], str) for s in e[2]) and (e[1] == "OneHotEncoder") == (e[4] == "check")
            and (e[4] == "check" or (e[4] == "output" and e[0] not in taken) or (
                e[4] in ("input", "both") and t is not None and e[0] not in ready
                and t.dtype == ("string" if a.get("result") == 0 else dtype)))
            and all(type(k) is type(a["categories"][0]) in (str, int) for k in a.get("categories", [])))


class Completed(dict):  # feeds that StringProgram.complete filled already (run() and check_inputs both ask)
    pass


class StringProgram:
    """A bundle's steps, run on each call's feeds (svodrt/runner.py asks for it only when there are steps)."""

    def __init__(self, steps: tuple[tuple, ...], inputs: Sequence[TensorInfo]):
        self.steps = steps
        self.roles = {s[0]: s[4] for s in steps}  # the names run() computes: code inputs and outputs
        self._inputs = {t.name: t for t in inputs}

    def complete(self, feeds: Mapping[str, object]) -> Mapping[str, object]:
        """feeds with the steps' results added: the code inputs they fill and the outputs run() returns."""
        if isinstance(feeds, Completed) or not isinstance(feeds, Mapping):
            return feeds
        if given := [k for k in feeds if k in self.roles]:
            raise InputError(f"input {given[0]!r} is computed by the model from its string inputs: do not pass it")
        env = Completed(feeds)
        for name, op, sources, attrs, role in self.steps:
            value = edge_value(op, [self._arg(s, env) for s in sources], attrs)
            if role != "check":
                env[name] = value
        return env

    def _arg(self, s: str | list, env: dict) -> np.ndarray:
        if isinstance(s, list):  # StringConcat's constant string
            return np.array(s[0], dtype=object)
        if s in self.roles:
            return env[s]
        t = self._inputs[s]
        if s not in env:
            raise InputError(f"missing input {s!r} ({t.dtype}{list(t.shape)})")
        check_shape(t, env[s])
        if t.dtype != STRING:  # a OneHotEncoder check's integers
            return check_input(t, env[s])
        return np.array(strings_of(t, env[s]), dtype=object).reshape(env[s].shape)


def normalize(x: np.ndarray, case: str, case_sensitive: bool, stopwords: Sequence[str]) -> np.ndarray:
    """ONNX StringNormalizer on a [C] or [1, C] array of str: elements equal to a stopword (ignoring case
    unless case_sensitive) are dropped, the rest change case; nothing left gives [""] ([[""]])."""
    fold = (lambda s: s) if case_sensitive else str.lower
    stops = {fold(w) for w in stopwords}
    change = {"LOWER": str.lower, "UPPER": str.upper}.get(case, lambda s: s)
    kept = [change(s) for s in x.reshape(-1).tolist() if fold(s) not in stops] or [""]
    out = np.empty(len(kept), dtype=object)
    out[:] = kept
    return out if x.ndim == 1 else out.reshape(1, -1)


def edge_value(op: str, args: list[np.ndarray], a: dict) -> np.ndarray:
    """One step on object arrays of str, as onnxruntime computes the op."""
    if op == "StringNormalizer":
        return normalize(args[0], a["case"], a["case_sensitive"], a["stopwords"])
    if op == "StringConcat":
        return np.array(np.frompyfunc(operator.add, 2, 1)(*args), dtype=object)
    x, flat = args[0], args[0].reshape(-1).tolist()
    if op == "OneHotEncoder":  # zeros=0: a check, no result
        if unknown := set(flat) - set(a["categories"]):
            raise InputError(f"OneHotEncoder (zeros=0): {sorted(unknown)[0]!r:.40} is none of its "
                             f"{len(a['categories'])} categories; onnxruntime fails such a run")
        return x
    if op == "RegexFullMatch":
        return np.array([re.fullmatch(a["pattern"], v) is not None for v in flat], dtype=bool).reshape(x.shape)
    parts = [v.split(a["delimiter"] or None, a["maxsplit"]) if v else [] for v in flat]  # "": none (onnxruntime)
    if a["result"]:
        return np.array([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    width = max(map(len, parts), default=0)
    out = np.empty((len(parts), width), dtype=object)
    if width:
        out[:] = [p + [""] * (width - len(p)) for p in parts]
    return out.reshape(*x.shape, width)
