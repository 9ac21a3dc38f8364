"""The compiler/runtime contract lives in svodrt/abi.py alone (issue 11): neither the code generators
nor the runtime may write an ABI number themselves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from svodrt import abi

ROOT = Path(__file__).resolve().parent.parent
SIDES = sorted([*ROOT.glob("svodc/codegen/*.py"), *ROOT.glob("svodrt/*.py")])
# Forms a literal ABI number takes on either side: an offset into the sync block or the buffer table
# in LLVM IR text, an index into a ctypes sync block or buffer table, a slot computed from 0/1/2, a
# constant of the contract defined again.
LITERALS = [
    (r"%sync, i64 \d", "a sync block offset in IR"),
    (r"%bufs, i64 \d", "a buffer table slot in IR"),
    (r"\bsync\[\d", "a sync block word by number"),
    (r"\btable\[\d", "a buffer table slot by number"),
    (r"\breturn [012], ", "a buffer table slot returned by number"),
    (r"\b2 \+ (nin|n_inputs|buf\.slot|len\()", "an I/O slot computed from 2"),
    (r"^\s*(SYNC_SIZE|SYNC_YIELD|SYNC_NEXT|SYNC_DONE|NEXT_OFFSET|DONE_OFFSET|ARENA_SLOT|WEIGHTS_SLOT)\b[\w, ]*=",
     "an ABI constant defined outside svodrt/abi.py"),
    (r'"svod_entry"', "the entry symbol spelled out"),
]


def literal_abi_numbers(text: str) -> list[str]:
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        found += [f"line {n}: {why}: {line.strip()}" for pattern, why in LITERALS if re.search(pattern, line)]
    return found


def test_the_scan_finds_what_the_code_used_to_write():
    old = """
  %fpp = getelementptr inbounds i8, ptr %sync, i64 8
                sync[1] = YIELD_FN  # offset 8: the entry's yield function
NEXT_OFFSET, DONE_OFFSET = 16, 20
        return 1, buf.offset
    return 2 + nin + buf.slot, 0
        lines.append(f"  %s{i} = getelementptr inbounds ptr, ptr %bufs, i64 7")
"""
    assert len(literal_abi_numbers(old)) == 6


@pytest.mark.parametrize("path", [p for p in SIDES if p.name != "abi.py"], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_literal_abi_number_outside_the_abi_module(path):
    assert not literal_abi_numbers(path.read_text()), path


@pytest.mark.parametrize("name", ["svodc/codegen/module.py", "svodc/codegen/llvm_ir.py", "svodrt/model.py"])
def test_both_sides_import_the_contract(name):
    assert "from svodrt.abi import" in (ROOT / name).read_text()


def test_entry_ir_uses_the_contract_offsets():
    from svodc.codegen.module import entry_module
    from svodc.target import parse_target

    text = entry_module([("k0", 4, 4), ("k1", 1, 4)], parse_target("x86_64:x86-64")[0])
    for offset in (abi.SYNC_YIELD, abi.SYNC_NEXT, abi.SYNC_DONE, abi.SYNC_TRACE):
        assert f"ptr %sync, i64 {offset}" in text
    assert f"@{abi.ENTRY}(" in text
    assert abi.SYNC_DONE + 4 <= abi.SYNC_TRACE and abi.SYNC_NEXT + 4 <= abi.SYNC_DONE
    assert abi.SYNC_TRACE % 8 == 0 and abi.SYNC_TRACE + 8 <= abi.SYNC_SIZE
