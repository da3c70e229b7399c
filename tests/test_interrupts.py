"""Ctrl-C in any command is one error line and exit 130 (typer alone would exit 130 without a word); SIGTERM one line
and exit 143 (the default action ends the process without one)."""

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


def _terminated(_options):
    import os
    import signal

    os.kill(os.getpid(), signal.SIGTERM)
    raise AssertionError("SIGTERM did not stop the job")


def test_sigterm_in_a_command_is_one_line_and_exit_143_and_the_handler_is_restored(monkeypatch):
    import signal

    from vlforge.errors import Terminated
    from vlforge.terminate import sigterm_raises

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    job = Job(check=lambda options: None, run=_terminated, render=lambda *a: None, to_json=str,
              exit_code=lambda report: ExitCode.OK)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(Terminated) as caught, sigterm_raises():
            execute(job, None, as_json=False, console=Console(file=io.StringIO()))
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert caught.value.exit_code == ExitCode.TERMINATED == 143 and str(caught.value) == "terminated (SIGTERM)"


def test_sigterm_keeps_its_handler_under_torchrun_or_when_someone_set_one(monkeypatch):
    import signal

    from vlforge.terminate import sigterm_raises

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        monkeypatch.setenv("WORLD_SIZE", "2")
        with sigterm_raises():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        monkeypatch.delenv("WORLD_SIZE")
        def mine(*_args):
            return None

        signal.signal(signal.SIGTERM, mine)
        with sigterm_raises():
            assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_terminated_cli_process_says_so_and_exits_143(tmp_path):
    """A real process, SIGTERM while the CLI's start-up check runs (standing in for any long step of a command)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = ("import os, signal, time, sys\n"
              "import vlforge.cli as cli\n"
              "def slow():\n"
              "    print('ready', flush=True)\n"
              "    time.sleep(60)\n"
              "cli.check_startup = slow\n"
              "cli.main(['version'])\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if k != "WORLD_SIZE"})
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip() == "error: terminated (SIGTERM)", err
    assert time.monotonic() - started < 30


def _script(tmp_path, body: str):
    import subprocess
    import sys
    import textwrap

    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    env = {k: v for k, v in __import__("os").environ.items() if k != "WORLD_SIZE"}
    return subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def test_sigterm_ends_a_process_stuck_in_native_code_after_the_grace_period(tmp_path):
    """The handler cannot run while the main thread is inside C code: the watcher ends the process, the same line."""
    import signal
    import time

    proc = _script(tmp_path, """
        import hashlib
        import vlforge.terminate as terminate
        terminate.GRACE_SECONDS = 0.5
        with terminate.sigterm_raises():
            try:
                print("ready", flush=True)
                hashlib.pbkdf2_hmac("sha256", b"x", b"y", 200_000_000)  # minutes inside one C call
            finally:
                print("finally ran", flush=True)
    """)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip() == "error: terminated (SIGTERM)", err
    assert "finally ran" not in out and time.monotonic() - started < 20


def test_a_child_forked_inside_takes_sigterm_by_default_and_the_parent_goes_on(tmp_path):
    proc = _script(tmp_path, """
        import os, signal, time
        import vlforge.terminate as terminate
        terminate.GRACE_SECONDS = 0.3
        with terminate.sigterm_raises():
            child = os.fork()
            if child == 0:
                time.sleep(30)
                os._exit(0)
            os.kill(child, signal.SIGTERM)
            _, status = os.waitpid(child, 0)
            time.sleep(1.5)  # past the grace period: a byte from the child would have ended this process
            print("child", os.waitstatus_to_exitcode(status), "parent alive", flush=True)
    """)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == f"child {-15} parent alive"
