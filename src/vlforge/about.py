"""What is installed: vlforge, torch, transformers and Python, read from package metadata (nothing heavy imported).

Example:
    >>> version_line().startswith("vlforge ")
    True
    or: ``vlforge --version``; ``vlforge version --json``
"""

from __future__ import annotations

import json
import platform
from typing import Any

from vlforge.command import Cli, Job, always_ok
from vlforge.strict import StrictModel
from vlforge.versions import installed

PACKAGES = ("vlforge", "torch", "transformers")


def versions() -> dict[str, str | None]:
    """Installed versions (None: not installed) of vlforge, torch, transformers, and Python's."""
    return {**{name: installed(name) for name in PACKAGES}, "python": platform.python_version()}


def version_line() -> str:
    """``vlforge 0.1.0, torch 2.13.0+cpu, transformers 5.24.0, Python 3.11.7``."""
    found = versions()
    return ", ".join(f"{'Python' if name == 'python' else name} {found[name] or 'not installed'}" for name in found)


class VersionFlags(StrictModel):
    """``vlforge version`` takes no flag but ``--json``."""


def _render(flags: VersionFlags, found: dict[str, str | None], console: Any) -> None:
    console.file.write(version_line() + "\n")


JOB: Job[VersionFlags, dict] = Job(check=lambda flags: None, run=lambda flags: versions(), render=_render,
                                   to_json=lambda found: json.dumps(found), exit_code=always_ok)
CLI = Cli(flags=VersionFlags, job=JOB)
