"""The oldest torch and transformers vlforge runs with, and the one-line refusal of older ones.

These minimums are the lower bounds in pyproject.toml (a test checks they agree) and the versions the matrix
(``make matrix``, ``scripts/version_matrix.py``) installs as its oldest point. A family that needs a newer
transformers than the global minimum says so in its record (``Family.transformers_min`` in
:mod:`vlforge.models.families`), checked by :func:`require_transformers` when a model of it is loaded.

The check reads the installed versions from the package metadata: neither torch nor transformers is imported,
so ``vlforge --help`` stays fast and an old transformers cannot fail with a traceback before the check runs.

Example:
    >>> from vlforge.versions import parse
    >>> parse("2.11.0+cu130") >= parse(TORCH_MIN)
    True
"""

from __future__ import annotations

import importlib.metadata
import re

from vlforge.errors import VlforgeError

TRANSFORMERS_MIN = "5.17"
"""transformers 5.17 is what GPU hosts commonly carry beside torch 2.11; the matrix runs the core suite on it."""
TORCH_MIN = "2.11"
"""torch 2.11 (CUDA 13.0) ran the GPU check (``scripts/gpu_check.sh``) and, on the CPU, the version matrix's core
suite (its ``torch_oldest`` point); torch 2.13 (CPU) runs everything here."""
MINIMUMS = {"transformers": TRANSFORMERS_MIN, "torch": TORCH_MIN}


class VersionError(VlforgeError):
    """An installed package is older than vlforge supports (or missing)."""


def parse(text: str) -> tuple[int, ...]:
    """``"5.17.0"`` -> ``(5, 17, 0)``; a local or pre-release suffix (``+cu130``, ``.dev0``, ``rc1``) is ignored."""
    match = re.match(r"\s*(\d+(?:\.\d+)*)", text)
    if match is None:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def installed(package: str) -> str | None:
    """The installed version of ``package`` (from its metadata), or None when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def problem(package: str, minimum: str, version: str | None, needed_by: str = "vlforge") -> str | None:
    """The one-line refusal when ``version`` of ``package`` is below ``minimum`` (or missing), else None."""
    want = f"pip install '{package}>={minimum}'"
    if version is None:
        return f"{needed_by} needs {package} >= {minimum}, which is not installed here: {want}"
    if parse(version) < parse(minimum):
        return f"{needed_by} needs {package} >= {minimum}, this environment has {package} {version}: {want}"
    return None


def startup_problem() -> str | None:
    """The refusal line for the first installed package below vlforge's minimum, or None (the CLI's start-up)."""
    for package, minimum in MINIMUMS.items():
        line = problem(package, minimum, installed(package))
        if line is not None:
            return line
    return None


def check_startup() -> None:
    """Raise :class:`VersionError` (one line) when torch or transformers is older than vlforge supports."""
    line = startup_problem()
    if line is not None:
        raise VersionError(line)


def require_transformers(what: str, minimum: str) -> None:
    """Raise :class:`VersionError` when the installed transformers is older than ``minimum`` (empty: none), which
    ``what`` (e.g. "Qwen3.5 (qwen3_5)") needs."""
    if minimum:
        line = problem("transformers", minimum, installed("transformers"), needed_by=what)
        if line is not None:
            raise VersionError(line)
