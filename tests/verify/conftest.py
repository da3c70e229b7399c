"""Fixtures of the verify tests: tiny models loaded in bfloat16 once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def loaded_bf16(tiny_checkpoint):
    """``loaded_bf16("qwen3_vl") -> LoadedModel`` (bfloat16, CPU), loaded once per family."""
    from vlforge.models import load

    cache = {}

    def get(family: str):
        if family not in cache:
            cache[family] = load(tiny_checkpoint(family), dtype="bfloat16", device="cpu")
        return cache[family]

    return get
