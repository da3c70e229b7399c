"""``--help`` shows boolean flags without a value type; error text is printed literally (no rich markup)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def vlforge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vlforge.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("command", [[], ["profile"], ["doctor"], ["train"], ["tokens", "audit"]])
def test_help_shows_no_bool_metavar(command: list[str]) -> None:
    proc = vlforge(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--help" in proc.stdout and "<bool>" not in proc.stdout
    assert re.search(r"<(str|path|int|float|list)", proc.stdout) or not command  # values still show their type


def test_error_text_is_printed_literally(tmp_path: Path) -> None:
    fake = tmp_path / "matplotlib"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('matplotlib is hidden for this test')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = vlforge("profile", "--model", "tiny:qwen3_vl", "--plot", str(tmp_path / "x.png"), env=env)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'vlforge[plot]'" in proc.stderr, proc.stderr
