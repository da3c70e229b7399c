"""Errors vlforge raises for users: one line, naming the file, key or module at fault.

Example:
    >>> from vlforge.errors import VlforgeError, PatchError
    >>> issubclass(PatchError, VlforgeError)
    True
"""

from __future__ import annotations


class VlforgeError(Exception):
    """Base class of every user-facing vlforge error (the CLI prints it as one line, exit 2)."""

    exit_code: int = 2


class PatchError(VlforgeError, ValueError):
    """A patch was asked to do something it cannot (bad option, a name that matches nothing)."""


class ModelLoadError(VlforgeError):
    """A checkpoint directory, preset or hub id could not be loaded."""


class ConfigError(VlforgeError, ValueError):
    """A configuration file or override is invalid."""


class DataError(VlforgeError):
    """A dataset file or sample is invalid."""


class OutputError(ConfigError):
    """An output path cannot be written, or holds files vlforge did not write and must not touch."""
