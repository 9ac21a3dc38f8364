"""svodrt: the Svod runtime. Loads a .svod bundle and runs it; needs only numpy, msgpack, zstandard.

    import svodrt
    m = svodrt.load("model.svod")        # verify, map code r-x and weights read-only
    y = m.run({"x": x})                  # {input name: ndarray} -> {output name: ndarray}
"""

from __future__ import annotations

import os

from svodrt.errors import (
    BundleFormatError,
    BundleVersionError,
    InputError,
    RuntimeFailure,
    SvodError,
    UnsupportedHostError,
)
from svodrt.host import Host, detect_host
from svodrt.model import Model

__version__ = "0.1.0"


def load(source: str | os.PathLike | bytes, threads: int | None = None, host: Host | None = None,
         verify: bool = True) -> Model:
    """Load a bundle from a path or bytes.

    threads: threads per inference (default: the host's cores). host: pretend to be this host when
    choosing a code variant (tests). verify: check every section's sha256 (default on)."""
    return Model(source, threads=threads, host=host, verify=verify)


__all__ = ["BundleFormatError", "BundleVersionError", "Host", "InputError", "Model", "RuntimeFailure",
           "SvodError", "UnsupportedHostError", "detect_host", "load"]
