"""Fixtures of the config tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def write_yaml(tmp_path: Path):
    """Factory: write YAML text into tmp_path and return the file's path."""

    def write(text: str, name: str = "run.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write
