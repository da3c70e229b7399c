"""Fixtures of the profile tests: tiny models loaded once per session through vlforge.models.load."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def loaded_tiny(tiny_checkpoint):
    """``loaded_tiny("qwen3_vl") -> LoadedModel`` (float32, CPU), loaded once per family."""
    from vlforge.models import load

    cache = {}

    def get(family: str):
        if family not in cache:
            cache[family] = load(tiny_checkpoint(family), dtype="float32", device="cpu")
        return cache[family]

    return get
