"""Every example in the vlforge.data docstrings runs."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import vlforge.data

MODULES = sorted(m.name for m in pkgutil.iter_modules(vlforge.data.__path__, "vlforge.data."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
