"""Fuzzing the runtime with damaged and hostile bundles: 2,000 mutations here, `make fuzz` runs 10,000
(and holds each load to 1 s there).

Every mutation must end in BundleFormatError (or UnsupportedHostError) or in outputs identical to
the original's for the same code image; a crash, a hang, a wrong output or any other exception is a
failure, reported with the seed and index that replay it (python -m tests.fuzzing --seed S --only I).
"""

from __future__ import annotations

import numpy as np

from tests.fuzzing.driver import run_fuzz
from tests.summary import LINES

COUNT = 2000
SEED = 20260101  # fixed here so CI is reproducible; make fuzz draws a new seed each run


def test_two_thousand_mutations_never_crash_hang_or_change_outputs(small_bundle, fat_bundle, tmp_path):
    np.savez(tmp_path / "inputs.npz", **small_bundle[1])
    result = run_fuzz([small_bundle[0], fat_bundle[0]], tmp_path / "inputs.npz", COUNT, SEED)
    LINES.append(f"fuzz (2 bundles): {result.summary()}")
    assert sum(result.counts.values()) == COUNT
    assert not result.failures, result.summary()
    # Both kinds of ending occur: the fuzzer reaches past the first checks.
    assert result.counts["format_error"] > COUNT // 2 and result.counts["identical"] > COUNT // 20
    # The structural attacks (bombs, huge counts and sizes, many kernels) ran, each load within the
    # memory budget (the worker's over_budget outcome is a failure above).
    assert {"manifest_bomb", "huge_count", "huge_size", "kernel_count"} <= {m for m, _ in result.by_mutator}


def test_mutations_of_a_bundle_with_string_inputs_never_change_outputs(tmp_path):
    """Format 1.4: the vocabulary and the string dtype are fuzzed too (an edited vocabulary must be
    refused, never run with other ids: the variant binding covers it)."""
    import svodc
    from tests.string_models import category_codes

    model, feeds = category_codes()
    path = tmp_path / "strings.svod"
    path.write_bytes(svodc.compile(model, test_vectors=True))
    np.savez(tmp_path / "inputs.npz", **feeds)
    count = 500
    result = run_fuzz([path], tmp_path / "inputs.npz", count, SEED + 1)
    LINES.append(f"fuzz (string bundle): {result.summary()}")
    assert sum(result.counts.values()) == count
    assert not result.failures, result.summary()
    assert result.counts["format_error"] > count // 2 and result.counts["identical"] > count // 20
