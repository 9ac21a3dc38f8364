"""String ids at the edge (format 1.4): strings reach native code as int32 ids. svodrt imports this only for a
bundle with string inputs or outputs, ZipMap or edge outputs (svodrt/runner.py), like the string program.

The compiler interned the model's own strings into the bundle's `vocabulary` and compiled string ops
into ops on ids. run() gives a vocabulary string its index and any other string a new id past the
vocabulary, the same for equal strings across the call's string inputs. Invariant (the compiler only
lets ops with it touch strings): outputs depend only on which ids are equal and which vocabulary entry
an id is, never on a new id's value, so test vectors can store ids (svodrt_tools/verify.py). Accepted: numpy
str arrays, object arrays of str, bytes arrays (UTF-8); anything else is an InputError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from svodrt.errors import InputError
from svodrt.format import MAX_STRING_ID
from svodrt.schema import TensorInfo


class StringTable:
    """A bundle's vocabulary, with the index of each string, built once at load."""

    def __init__(self, vocabulary: Sequence[str]):
        self.vocabulary = tuple(vocabulary)
        self.ids = {s: i for i, s in enumerate(self.vocabulary)}

    def intern(self, inputs: Sequence[TensorInfo], feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        """{name: int32 ids with the array's shape} for the string inputs among `inputs`; one numbering
        of new strings shared by all of them."""
        known, fresh = self.ids, {}
        base = len(known)
        lists = [(t, feeds[t.name], strings_of(t, feeds[t.name])) for t in inputs]
        total = sum(len(strings) for _, _, strings in lists)
        if base + total > MAX_STRING_ID:
            raise InputError(f"string inputs hold {total} strings in all; at most {MAX_STRING_ID - base} fit the "
                             "int32 ids this model computes with")
        out = {}
        for t, value, strings in lists:
            # setdefault's default is computed before the insert: a new string gets base + (count so far)
            ids = np.fromiter((known[s] if s in known else fresh.setdefault(s, base + len(fresh)) for s in strings),
                              np.int32, count=len(strings))
            out[t.name] = ids.reshape(value.shape)  # type: ignore[union-attr]
        return out

    def decode(self, ids: np.ndarray, inputs: Sequence[TensorInfo], feeds: Mapping[str, object]) -> np.ndarray:
        """A string output: ids -> an object array of str. An id past the vocabulary is one of this
        call's input strings (the compiled code only moves those): intern() numbers them again."""
        known = dict(enumerate(self.vocabulary))
        if ids.size and int(ids.max()) >= len(known):
            again = self.intern(inputs, feeds)
            for t in inputs:
                known.update(zip(again[t.name].reshape(-1).tolist(), strings_of(t, feeds[t.name]), strict=True))
        out = np.empty(ids.shape, dtype=object)
        out.reshape(-1)[:] = [known.get(i, "") for i in ids.reshape(-1).tolist()]
        return out


def strings_of(t: TensorInfo, value: object) -> list[str]:
    """The elements of a string input, row-major, as str; InputError for anything else."""
    if not isinstance(value, np.ndarray) or isinstance(value, np.ma.MaskedArray):
        raise InputError(f"input {t.name!r} is a string input: pass a numpy.ndarray of str, got {type(value).__name__}")
    kind = value.dtype.kind
    flat = value.reshape(-1).tolist()
    if kind == "U":
        return flat
    if kind == "S":
        out = []
        for i, b in enumerate(flat):
            try:
                out.append(b.decode("utf-8"))
            except UnicodeDecodeError:
                raise InputError(f"input {t.name!r} element {_position(value, i)} is not UTF-8: {b[:40]!r}") from None
        return out
    if kind == "O":
        for i, s in enumerate(flat):
            if not isinstance(s, str):
                raise InputError(f"input {t.name!r} element {_position(value, i)} is a {type(s).__name__}, "
                                 f"expected str ({s!r:.40})")
        return flat
    raise InputError(f"input {t.name!r} is a string input: pass a numpy array of str (dtype '<U' or object), "
                     f"got dtype {value.dtype}")


def _position(value: np.ndarray, i: int) -> list[int]:
    return [int(k) for k in np.unravel_index(i, value.shape)] if value.ndim else []
