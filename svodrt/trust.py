"""Signed bundles (docs/bundle-format.md "Trust model"). Checksums find damage; a signature names the
origin. A signed manifest holds `signature`: {"key": a 32-byte Ed25519 public key, "ed25519": 64 bytes},
over signed_message(): a domain tag, the sha256 of the manifest without its signature (msgpack) and
every section's sha256. With a trust policy (load(trust=...)) a bundle must carry a valid signature by
a trusted key, else UntrustedBundleError before any code is read. `cryptography` (the svod[sign]
extra) is imported only to check or make a signature."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

import msgpack

from svodrt.errors import BundleFormatError, UntrustedBundleError

DOMAIN = b"svod bundle signature v1\x00"
TrustSpec = str | os.PathLike | bytes | Iterable[str | os.PathLike | bytes]


def signed_message(manifest: dict) -> bytes:
    """What the signature signs: one canonical re-encoding of the parsed manifest, so the bytes a
    signer and a verifier hash are those of the same objects."""
    unsigned = msgpack.packb({k: v for k, v in manifest.items() if k != "signature"}, use_bin_type=True)
    return DOMAIN + hashlib.sha256(unsigned).digest() + b"".join(bytes(s["sha256"]) for s in manifest["sections"])


def fingerprint(key: bytes) -> str:
    return "ed25519:" + hashlib.sha256(key).hexdigest()[:16]


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise UntrustedBundleError("checking signatures needs the `cryptography` package: pip install "
                                   "'svod[sign]'") from None
    return InvalidSignature, serialization, ed25519


def public_key_bytes(spec: str | os.PathLike | bytes) -> bytes:
    """A raw 32-byte Ed25519 public key from raw bytes, PEM bytes or a PEM file's path."""
    if isinstance(spec, bytes) and len(spec) == 32:
        return spec
    pem = spec if isinstance(spec, bytes) else Path(spec).read_bytes()
    _, serialization, ed25519 = _crypto()
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError as e:
        raise UntrustedBundleError(f"trusted key {spec!r:.60} is not a PEM public key: {e}") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise UntrustedBundleError(f"trusted key {spec!r:.60} is not an Ed25519 key")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def trusted_keys(trust: TrustSpec) -> frozenset[bytes]:
    specs = [trust] if isinstance(trust, (str, os.PathLike, bytes)) else list(trust)
    return frozenset(public_key_bytes(s) for s in specs)


def signature(manifest: dict) -> tuple[bytes, bytes] | None:
    """(public key, signature) as the manifest states them, unchecked; None when unsigned."""
    sig = manifest.get("signature")
    if sig is None:
        return None
    if not (isinstance(sig, dict) and isinstance(sig.get("key"), bytes) and len(sig["key"]) == 32
            and isinstance(sig.get("ed25519"), bytes) and len(sig["ed25519"]) == 64):
        raise BundleFormatError("manifest field signature: must be a map of a 32-byte `key` and a 64-byte "
                                "`ed25519` signature")
    return sig["key"], sig["ed25519"]


def check_signature(manifest: dict, trusted: frozenset[bytes] | None) -> str | None:
    """The signer's fingerprint after checking the signature, or None for an unsigned bundle without a
    policy. trusted: the keys a policy accepts (None: no policy, any valid signer)."""
    found = signature(manifest)
    if found is None:
        if trusted is not None:
            raise UntrustedBundleError("the bundle is not signed; this trust policy accepts only bundles signed by "
                                       f"{', '.join(sorted(map(fingerprint, trusted)))} (svodc compile --sign KEY)")
        return None
    key, sig = found
    if trusted is not None and key not in trusted:
        raise UntrustedBundleError(f"the bundle is signed by {fingerprint(key)}, a key this trust policy does not "
                                   "trust; nothing of it was run")
    invalid, _, ed25519 = _crypto()
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(key).verify(sig, signed_message(manifest))
    except invalid:
        raise UntrustedBundleError(f"the signature by {fingerprint(key)} does not match the bundle: it was modified "
                                   "after signing; nothing of it was run") from None
    return fingerprint(key)
