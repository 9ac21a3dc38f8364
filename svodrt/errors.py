"""The runtime's exception types. Each message names what is wrong and where (section, field,
byte offset, input name, dimension) and, where it helps, what to do."""

from __future__ import annotations


class SvodError(Exception):
    """Base of every error svodrt raises on purpose."""


class BundleFormatError(SvodError):
    """The bundle is damaged, truncated, not a bundle, or inconsistent. Nothing of it was run."""


class BundleVersionError(BundleFormatError):
    """The bundle was written by a newer format major version than this runtime reads."""


class UnsupportedHostError(SvodError):
    """No code variant in the bundle can run on this machine (architecture or CPU features)."""


class DeviceError(SvodError):
    """A GPU driver is missing, has no such device, or refused an operation (the message names the
    driver function and its error)."""


class InputError(SvodError, ValueError):
    """An input does not match the model's declared inputs (name, dtype, rank, dimension, layout)."""


class RuntimeFailure(SvodError):
    """The operating system refused a resource the runtime needs (memory mapping, protection)."""


class ModelClosedError(SvodError, RuntimeError):
    """run() was called on a model after close()."""


class UntrustedBundleError(SvodError):
    """A trust policy refused the bundle: unsigned, signed by another key, or modified after signing."""
