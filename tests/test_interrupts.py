"""Ctrl-C in any command is one error line and exit 130 (typer alone would exit 130 without a word)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from vlforge.command import Job, execute
from vlforge.errors import ExitCode, Interrupted, VlforgeError


def _interrupted(_options):
    raise KeyboardInterrupt


def test_ctrl_c_in_a_command_is_an_error_of_its_own_with_exit_130():
    job = Job(check=lambda options: None, run=_interrupted, render=lambda *a: None, to_json=str,
              exit_code=lambda report: ExitCode.OK)
    with pytest.raises(Interrupted) as caught:
        execute(job, None, as_json=False, console=Console(file=io.StringIO()))
    assert isinstance(caught.value, VlforgeError) and caught.value.exit_code == ExitCode.INTERRUPTED == 130
    assert str(caught.value) == "interrupted (Ctrl-C)" and caught.value.__suppress_context__


def test_ctrl_c_before_the_command_runs_is_the_same_line(monkeypatch, capsys):
    import vlforge.cli as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "check_startup", interrupted)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["version"])
    assert stopped.value.code == ExitCode.INTERRUPTED
    assert capsys.readouterr().err.strip() == "error: interrupted (Ctrl-C)"
