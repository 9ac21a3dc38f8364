"""Which bundles `svodrt serve PATH` serves: a bundle file (one model, named by its file), or a folder
of bundles (NAME.svod), or versioned models (NAME/VERSION/ANY.svod, VERSION all digits), or both."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from svodrt.errors import SvodError


class RepositoryError(SvodError):
    """PATH names no bundle, or two bundles claim one model name and version."""


@dataclass(frozen=True)
class BundleEntry:
    name: str
    version: str | None
    path: Path


def _versions(folder: Path) -> list[BundleEntry]:
    entries = []
    for vdir in sorted(p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()):
        files = sorted(vdir.glob("*.svod"))
        if len(files) != 1:
            raise RepositoryError(f"{vdir}: a version folder holds exactly one .svod bundle, it has {len(files)}")
        entries.append(BundleEntry(folder.name, vdir.name, files[0]))
    return entries


def find_bundles(path: str | Path) -> list[BundleEntry]:
    """The models under PATH, sorted by name then version; a RepositoryError if there are none."""
    root = Path(path)
    if root.is_file():
        return [BundleEntry(root.stem, None, root)]
    if not root.is_dir():
        raise RepositoryError(f"{root}: no such bundle or folder")
    entries: list[BundleEntry] = []
    for p in sorted(root.iterdir()):
        if p.is_file() and p.suffix == ".svod":
            entries.append(BundleEntry(p.stem, None, p))
        elif p.is_dir():
            entries.extend(_versions(p))
    seen: dict[tuple[str, str | None], Path] = {}
    names_unversioned = {e.name for e in entries if e.version is None}
    for e in entries:
        if (e.name, e.version) in seen:
            raise RepositoryError(f"model {e.name!r} version {e.version} is both {seen[e.name, e.version]} and "
                                  f"{e.path}")
        if e.version is not None and e.name in names_unversioned:
            raise RepositoryError(f"model {e.name!r} is both {root / (e.name + '.svod')} and versioned in "
                                  f"{e.path.parent}")
        seen[e.name, e.version] = e.path
    if not entries:
        raise RepositoryError(f"{root}: no .svod bundles (NAME.svod or NAME/VERSION/*.svod) in this folder")
    return entries
