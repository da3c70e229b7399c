"""Package namespaces whose public names import their module on first use, not when the package loads.

vlforge's commands check their arguments before they import torch or transformers (an error in well under
a second, `--help` without loading either). A package ``__init__`` that imported every submodule eagerly
would defeat that: importing ``vlforge.diagnosis.facts`` would run ``vlforge/diagnosis/__init__.py`` and with it
every heavy module of the package. :func:`lazy_exports` makes the package's public names resolve on first
use (PEP 562), so ``from vlforge.diagnosis import report`` works as before and costs the import only then.

A public name may equal one of the package's submodules (``vlforge.diagnosis.report`` the function and
``vlforge/diagnosis/report.py``); Python's import system would set the package attribute to the submodule
when it loads, hiding the function, so the package keeps such names out of its attributes and always
answers the exported object (as the eager ``from .report import report`` used to).

Example:
    >>> import sys, types
    >>> sys.modules["demo_pkg"] = types.ModuleType("demo_pkg")
    >>> lazy_exports("demo_pkg", {"dumps": "json"})
    >>> sys.modules["demo_pkg"].dumps([1])
    '[1]'
    >>> "dumps" in dir(sys.modules["demo_pkg"])
    True
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class _LazyPackage(types.ModuleType):
    """A package module whose exported names come from ``_lazy_exports`` (name -> absolute module)."""

    _lazy_exports: dict[str, str]

    def __getattr__(self, name: str) -> Any:
        exports = vars(self).get("_lazy_exports", {})
        if name not in exports:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    def __setattr__(self, name: str, value: Any) -> None:
        exports = vars(self).get("_lazy_exports", {})
        if name in exports and isinstance(value, types.ModuleType) and value.__name__ == f"{self.__name__}.{name}":
            return  # the import system binding a submodule over an exported name of the same spelling
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(vars(self)) | set(vars(self).get("_lazy_exports", {})))


def lazy_exports(package: str, exports: dict[str, str]) -> None:
    """Make ``package`` (already in ``sys.modules``) answer each name of ``exports`` from its module on use.

    ``exports`` maps a public name to the absolute name of the module that defines it. Call it from the
    package's ``__init__``: ``lazy_exports(__name__, {"report": "vlforge.diagnosis.report", ...})``.
    """
    module = sys.modules[package]
    module.__class__ = _LazyPackage
    vars(module)["_lazy_exports"] = dict(exports)
    for name in exports:  # a submodule imported before this call may already sit under an exported name
        value = vars(module).get(name)
        if isinstance(value, types.ModuleType) and value.__name__ == f"{package}.{name}":
            del vars(module)[name]
