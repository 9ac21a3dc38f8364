"""Reading and rewriting a bundle's manifest in tests: edit a field, re-pack it with a valid digest, so
the edit reaches the runtime's deeper checks instead of stopping at the manifest checksum."""

from __future__ import annotations

import hashlib
import struct

import msgpack
import zstandard

from svodrt.format import FLAG_MANIFEST_ZSTD, HEADER_SIZE, team_binding, unpack_header, variant_binding


def manifest_bytes(data: bytes) -> bytes:
    """The raw (msgpack) manifest, stored plain or zstd-compressed."""
    _, h = unpack_header(data[:HEADER_SIZE])
    stored = data[h.manifest_offset: h.manifest_offset + h.manifest_size]
    return zstandard.ZstdDecompressor().decompress(stored) if h.flags & FLAG_MANIFEST_ZSTD else stored


def manifest_of(data: bytes) -> dict:
    return msgpack.unpackb(manifest_bytes(data), raw=False)


def repack(data: bytes, manifest: object, rebind: bool = False, body: bytes | None = None) -> bytes:
    """`data` with its manifest replaced by `manifest` (any msgpack value), header fixed up to match.
    rebind: recompute every variant's binding digest too (for edits that are meant to be valid). body: what
    precedes the manifest instead of data's (header included; its header is rewritten)."""
    _, h = unpack_header(data[:HEADER_SIZE])
    if rebind:
        for v in manifest["variants"]:
            v["binding"] = variant_binding(v, manifest["sections"][v["section"]]["sha256"], manifest)
            if "team" in v:
                v["team_binding"] = team_binding(v)
    raw = msgpack.packb(manifest, use_bin_type=True)
    stored = zstandard.ZstdCompressor(level=3).compress(raw)
    body = data[:h.manifest_offset] if body is None else body
    header = h.__class__(h.major, h.minor, h.header_size, h.flags | FLAG_MANIFEST_ZSTD, h.reserved,
                         len(body) + len(stored), len(body), len(stored), len(raw),
                         hashlib.sha256(raw).digest()[:8])
    return header.pack() + body[HEADER_SIZE:] + stored


def vectors_of(data: bytes) -> list:
    """The bundle's test vectors as msgpack gives them: its `tests` section (format 1.9), else its manifest's."""
    m = manifest_of(data)
    for s in m["sections"]:
        if s["kind"] == "tests":
            return msgpack.unpackb(data[s["offset"]: s["offset"] + s["length"]], raw=False)
    return m.get("test_vectors", [])


def with_test_vectors(data: bytes, vectors: list) -> bytes:
    """A format 1.9 bundle with its `tests` section (the last one) holding `vectors`, its table entry updated."""
    m = manifest_of(data)
    s = next(s for s in m["sections"] if s["kind"] == "tests")
    packed = msgpack.packb(vectors, use_bin_type=True)
    s["length"], s["sha256"] = len(packed), hashlib.sha256(packed).digest()
    return repack(data, m, body=data[:s["offset"]] + packed)


def with_wrong_test_vector(data: bytes) -> bytes:
    """A float32 bundle whose first test vector expects output 0's first value off by 0.5: every checksum
    still matches, only running the vector shows it."""
    vectors = vectors_of(data)
    want = bytearray(vectors[0]["outputs"][0])
    want[0:4] = struct.pack("<f", struct.unpack("<f", want[0:4])[0] + 0.5)
    vectors[0]["outputs"][0] = bytes(want)
    return with_test_vectors(data, vectors)


def run_old_runtime(commit: str, minor: int, script: str, tmp_path) -> str:
    """Run `script` (argv[1]: tmp_path) in a fresh interpreter that imports the svodrt of `commit` (this
    repository's history; a format 1.`minor` runtime) from tmp_path: what it prints. Skips when the
    commit is not in this checkout's history."""
    import subprocess
    import sys
    import tarfile
    from io import BytesIO
    from pathlib import Path

    import pytest

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run(["git", "-C", str(root), "archive", commit, "svodrt"], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"the format 1.{minor} runtime (commit {commit}) is not in this checkout's history: "
                    f"{r.stderr.decode(errors='replace').strip()[:200]}")
    with tarfile.open(fileobj=BytesIO(r.stdout)) as tar:
        tar.extractall(tmp_path, filter="data")
    script = f"""
import svodrt, sys
assert svodrt.__file__.startswith(sys.argv[1]), svodrt.__file__
from svodrt.format import FORMAT_MINOR
assert FORMAT_MINOR == {minor}
""" + script
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def old_runtime_load(commit: str, minor: int, bundle: bytes, tmp_path) -> str:
    """Load `bundle` with the svodrt of `commit` (a format 1.`minor` runtime) in a fresh interpreter:
    what it prints (the BundleFormatError it raises, or nothing)."""
    (tmp_path / "b.svod").write_bytes(bundle)
    return run_old_runtime(commit, minor, """
try:
    svodrt.load(sys.argv[1] + "/b.svod")
except svodrt.BundleFormatError as e:
    print(e)
""", tmp_path)
