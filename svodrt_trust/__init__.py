"""Signed bundles (docs/bundle-format.md "Trust model": the signature, what it covers, the policy), beside the runtime:
svodrt imports it only for a signed bundle or a load under a trust policy. `cryptography` (the svod[sign] extra) is
imported only to check a signature."""

from __future__ import annotations

import os

from svodrt.bundle import TrustSpec
from svodrt.errors import BundleFormatError, UntrustedBundleError
from svodrt.format import msgpack_sha256


def signed_message(manifest: dict) -> bytes:
    """What is signed (docs/bundle-format.md "Trust model"): signer and verifier hash the same parsed objects."""
    unsigned = msgpack_sha256({k: v for k, v in manifest.items() if k != "signature"})
    return b"svod bundle signature v1\x00" + unsigned + b"".join(bytes(s["sha256"]) for s in manifest["sections"])


def fingerprint(key: bytes) -> str:
    import hashlib
    return "ed25519:" + hashlib.sha256(key).hexdigest()[:16]


def _ed25519():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise UntrustedBundleError("checking signatures needs the `cryptography` package: pip install "
                                   "'svod[sign]'") from None
    return serialization, ed25519


def trusted_keys(trust: TrustSpec) -> frozenset[bytes]:
    """The raw public keys of a policy: each a 32-byte key, PEM bytes or a PEM file's path."""
    from pathlib import Path  # here, not at `import svodrt`
    keys = set()
    for spec in [trust] if isinstance(trust, (str, os.PathLike, bytes)) else trust:
        if isinstance(spec, bytes) and len(spec) == 32:
            keys.add(spec)
            continue
        serialization, ed25519 = _ed25519()
        try:
            key = serialization.load_pem_public_key(spec if isinstance(spec, bytes) else Path(spec).read_bytes())
        except ValueError as e:
            raise UntrustedBundleError(f"trusted key {spec!r:.60} is not a PEM public key: {e}") from None
        if not isinstance(key, ed25519.Ed25519PublicKey):
            raise UntrustedBundleError(f"trusted key {spec!r:.60} is not an Ed25519 key")
        keys.add(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    return frozenset(keys)


def check_signature(manifest: dict, trusted: frozenset[bytes] | None) -> str | None:
    """The signer's fingerprint once its signature is checked; None for an unsigned bundle without a
    policy (and then nothing is checked). trusted: the keys a policy accepts; None: no policy."""
    sig = manifest.get("signature")
    if sig is None:
        if trusted is None:
            return None
        raise UntrustedBundleError("the bundle is not signed; this trust policy accepts only bundles signed by "
                                   f"{', '.join(sorted(map(fingerprint, trusted)))} (svodc compile --sign KEY)")
    if not (isinstance(sig, dict) and isinstance(sig.get("key"), bytes) and len(sig["key"]) == 32
            and isinstance(sig.get("ed25519"), bytes) and len(sig["ed25519"]) == 64):
        raise BundleFormatError("manifest field signature: must be a map of a 32-byte `key` and a 64-byte "
                                "`ed25519` signature")
    key = sig["key"]
    if trusted is not None and key not in trusted:
        raise UntrustedBundleError(f"the bundle is signed by {fingerprint(key)}, a key this trust policy does not "
                                   "trust; nothing of it was run")
    _, ed25519 = _ed25519()
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(key).verify(sig["ed25519"], signed_message(manifest))
    except Exception:  # cryptography's InvalidSignature
        raise UntrustedBundleError(f"the signature by {fingerprint(key)} does not match the bundle: it was modified "
                                   "after signing; nothing of it was run") from None
    return fingerprint(key)
