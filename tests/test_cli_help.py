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


def _command_paths(command, path=()) -> list[tuple[str, ...]]:
    """Every command and sub-command (the groups build theirs when asked for)."""
    import click

    paths = [path]
    ctx = click.Context(command)
    for name in command.list_commands(ctx) if hasattr(command, "list_commands") else []:
        paths += _command_paths(command.get_command(ctx, name), (*path, name))
    return paths


def test_no_command_or_sub_command_shows_bool_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    from vlforge.cli import _command

    command = _command()
    paths = _command_paths(command)
    assert ("tokens", "audit") in paths and ("doctor",) in paths
    for path in paths:
        code = command.main(args=[*path, "--help"], prog_name="vlforge", standalone_mode=False)
        out = capsys.readouterr().out
        assert code in (0, None) and "--help" in out, path
        assert "<bool>" not in out, (path, [line for line in out.splitlines() if "<bool>" in line])


def test_report_text_quoting_brackets_is_printed_literally() -> None:
    from io import StringIO

    from rich.console import Console

    from vlforge.diagnosis.facts import Facts
    from vlforge.diagnosis.report import BenchStatus, DoctorReport
    from vlforge.diagnosis.rules import Finding
    from vlforge.doctor import render

    finding = Finding(rule="untrained-template-token", severity="error", subject="[INST]",
                      message="the policy must generate '[INST]' [bold]", cost="-",
                      fix="vlforge tokens fix --model ./ckpt[v2] --tags '[INST]'", source="x", facts={"tags": "[INST]"})
    rep = DoctorReport(facts=Facts(device="cpu"), findings=[finding],
                       bench=BenchStatus("skipped", "no conv in ./ckpt[v2]"))
    console = Console(file=StringIO(), width=300)
    render(rep, console)
    text = console.file.getvalue()
    assert "'[INST]' [bold]" in text and "--model ./ckpt[v2] --tags '[INST]'" in text and "tags=[INST]" in text
    assert "no conv in ./ckpt[v2]" in text
