"""Shared fixtures: tiny checkpoints written once per test session into a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic_cpu() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """Factory fixture: ``tiny_checkpoint("qwen3_vl", seed=0) -> Path`` of a written tiny checkpoint."""
    from vlforge.models.tiny import write_tiny

    cache: dict[tuple[str, int], Path] = {}

    def make(family: str, seed: int = 0) -> Path:
        key = (family, seed)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"tiny-{family}-{seed}")
            cache[key] = write_tiny(family, out, seed=seed)
        return cache[key]

    return make
