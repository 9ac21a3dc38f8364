"""RegexFullMatch's patterns: ONNX (and onnxruntime) use RE2's syntax; svodrt matches with Python's `re`.

python_pattern() rewrites an RE2 pattern into the `re` pattern that matches the same strings, for the
subset where that is a faithful rewrite, and refuses the rest with the construct named:
- RE2's Perl classes are ASCII (`\\d` is [0-9], `\\w` [0-9A-Za-z_], `\\b` between them): the pattern runs
  with `(?a)`; RE2's `\\s` is [\\t\\n\\f\\r ] (no \\v), written out. `$` without `(?m)` is the end of the text
  in RE2 (Python's `$` also matches before a final newline): `\\Z`. RE2's `\\z` is Python's `\\Z`.
- Flags only as a leading `(?m)`, `(?s)` or `(?ms)`: RE2's `(?i)` folds case by Unicode rules
  (`k` matches U+212A KELVIN SIGN), which `re` in ASCII mode does not; `(?U)` means ungreedy in RE2.
- Refused as RE2 lacks them, or reads them otherwise: backreferences and other `\\digit` escapes,
  lookarounds, atomic groups, possessive quantifiers, conditionals, comments, `{,n}` (a literal in
  RE2), counts over 1000, `\\Z`, `\\pN`, `\\Q..\\E`, `\\C`, `\\N`, `\\u`, `\\U`, POSIX `[[:alpha:]]`
  classes (a set of characters in `re`), `\\b` and `\\S` inside a class.
"""

from __future__ import annotations

import re

from svodc.frontend.context import Unsupported

SPACE = "\\t\\n\\f\\r "  # RE2's \s
LEADING_FLAGS = re.compile(r"\(\?([ms]+)\)")
COUNT = re.compile(r"\{(\d*)(,?)(\d*)\}")
REFUSED_ESCAPES = {"Z": "\\Z (RE2 has \\z)", "p": "\\p classes", "P": "\\P classes", "Q": "\\Q...\\E", "E": "\\E",
                   "C": "\\C", "N": "\\N{...}", "u": "\\u escapes", "U": "\\U escapes", "G": "\\G"}


def python_pattern(pattern: str) -> str:
    """The `re` pattern equivalent to RE2 `pattern`; Unsupported naming what has no faithful rewrite."""
    def refuse(what: str) -> Unsupported:
        return Unsupported(f"pattern {pattern!r}: {what} is not supported (RE2 has no such construct, or reads it "
                           "differently from Python's re, which svodrt matches with)")

    out, i, n = ["(?a)"], 0, len(pattern)
    flags = LEADING_FLAGS.match(pattern)
    multiline = flags is not None and "m" in flags.group(1)
    if flags:
        out.append(flags.group(0))
        i = flags.end()
    in_class, class_start, after_quantifier = False, -1, False
    while i < n:
        c, quantifier = pattern[i], False
        if c == "\\":
            e = pattern[i + 1] if i + 1 < n else ""
            if e.isdigit():
                raise refuse(f"\\{e} (a backreference or octal escape)")
            if e in REFUSED_ESCAPES or (in_class and e in "bBS"):
                raise refuse(REFUSED_ESCAPES.get(e, f"\\{e} inside a character class"))
            out.append({"s": SPACE if in_class else f"[{SPACE}]", "S": f"[^{SPACE}]", "z": "\\Z"}.get(e, "\\" + e))
            i += 2
            after_quantifier = False
            continue
        if in_class:
            if pattern.startswith("[:", i):
                raise refuse("a POSIX class [:name:]")
            in_class = not (c == "]" and i > class_start + 1 and not (i == class_start + 2
                                                                      and pattern[class_start + 1] == "^"))
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class, class_start = True, i
        elif c == "(" and pattern.startswith("(?", i):
            if not (pattern.startswith("(?:", i) or pattern.startswith("(?P<", i)):
                raise refuse(f"the group {pattern[i:i + 4]!r}... (lookarounds, inline flags, atomic groups, comments)")
        elif c == "$" and not multiline:
            c = "\\Z"
        elif c in "*+?":
            if c == "+" and after_quantifier:
                raise refuse("a possessive quantifier")
            quantifier = c != "?" or not after_quantifier  # a `?` after a quantifier makes it lazy
        elif c == "{" and (count := COUNT.match(pattern, i)):
            lo, comma, hi = count.groups()
            if comma and not lo:
                raise refuse("{,n}")
            if max(int(lo or 0), int(hi or 0)) > 1000:
                raise refuse("a repeat count over 1000")
            if after_quantifier:
                raise refuse("a quantifier after a quantifier")
            out.append(count.group(0))
            i = count.end()
            after_quantifier = True
            continue
        out.append(c)
        after_quantifier = quantifier
        i += 1
    python = "".join(out)
    try:
        re.compile(python)
    except re.error as e:
        raise Unsupported(f"pattern {pattern!r} is not a valid regular expression: {e}") from None
    return python
