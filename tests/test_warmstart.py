"""The suite's warm start (tests/warmstart.py) behaves like starting the program: streams, exit codes, signals,
environment; what it cannot serve starts for real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import warmstart

PROBE = """
import json, os, sys
print(json.dumps({"ppid": os.getppid(), "executable": sys.executable, "argv": sys.argv, "cwd": os.getcwd(),
                  "stdin": sys.stdin.read(), "torch": "torch" in sys.modules, "mark": os.environ.get("VLFORGE_TEST_MARK")}))
print("to stderr", file=sys.stderr)
code = sys.argv[1] if len(sys.argv) > 1 else "0"
if code == "raise":
    raise ValueError("boom")
if code == "term":
    os.kill(os.getpid(), 15)
sys.exit(int(code))
"""


@pytest.fixture(scope="module")
def tools() -> warmstart.Tools:
    found = warmstart.tools()
    if found is None:
        pytest.skip("the warm start is off (VLFORGE_TEST_WARM=0)")
    return found


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    return path


def run(tools: warmstart.Tools, *args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(tools.python), *args], capture_output=True, text=True, timeout=120,
                          env={**warmstart.server_environment(), **(env or {})}, **kwargs)


def test_a_script_is_served_with_its_streams_arguments_and_directory(tools, probe, tmp_path):
    proc = run(tools, str(probe), "0", input="piped in", cwd=tmp_path, env={"VLFORGE_TEST_MARK": "m1"})
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["ppid"] != os.getpid()  # forked by the server, not started by this process
    assert seen["torch"]  # imported before the fork
    assert seen["executable"] == str(tools.python)  # nested runs are warm too
    assert seen["argv"] == [str(probe), "0"] and seen["cwd"] == str(tmp_path)
    assert seen["stdin"] == "piped in" and seen["mark"] == "m1"
    assert proc.stderr == "to stderr\n"


@pytest.mark.parametrize(("code", "returncode", "stderr"), [
    ("3", 3, "to stderr"), ("raise", 1, "ValueError: boom"), ("term", -signal.SIGTERM, "to stderr")])
def test_exit_codes_exceptions_and_signals_reach_the_caller(tools, probe, code, returncode, stderr):
    proc = run(tools, str(probe), code)
    assert proc.returncode == returncode and stderr in proc.stderr


def test_a_module_runs_as_main(tools):
    proc = run(tools, "-m", "json.tool", input='{"b": 1}')
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"b": 1}


@pytest.mark.parametrize("args", [("-c", "import os; print(os.getppid())"), ("-I", "-c", "import os; print(os.getppid())")])
def test_options_it_cannot_serve_start_the_real_interpreter(tools, args):
    proc = run(tools, *args)
    assert proc.returncode == 0 and int(proc.stdout) == os.getpid()  # exec'd in place: this process's child


def test_an_environment_read_at_import_time_starts_the_real_interpreter(tools, probe):
    proc = run(tools, str(probe), env={"TRANSFORMERS_VERBOSITY": "error"})
    assert proc.returncode == 0 and json.loads(proc.stdout)["ppid"] == os.getpid()
    assert not json.loads(proc.stdout)["torch"]


def test_no_server_starts_the_real_interpreter(tools, probe):
    env = {k: v for k, v in warmstart.server_environment().items() if k != warmstart.SOCKET_VARIABLE}
    proc = subprocess.run([str(tools.python), str(probe)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout)["ppid"] == os.getpid()


def _served(proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + 60
    while (pid := warmstart.served_pid(proc.pid)) is None:
        assert proc.poll() is None and time.monotonic() < deadline, "the run was not served"
        time.sleep(0.02)
    return pid


def _gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]
        except (FileNotFoundError, ProcessLookupError):  # reaped between the signal check and the read
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("how", ["sigkill-client", "terminate", "kill-helper"])
def test_a_killed_or_terminated_client_takes_its_run_with_it(tools, tmp_path, how):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(600)\n")
    proc = subprocess.Popen([str(tools.python), str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=warmstart.server_environment())
    child = _served(proc)
    assert child in warmstart.descendants(proc.pid)
    if how == "sigkill-client":
        proc.kill()
    elif how == "terminate":
        proc.terminate()
    else:
        warmstart.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == (-signal.SIGTERM if how == "terminate" else -signal.SIGKILL)
    assert _gone(child), f"served pid {child} still runs"


def test_the_warm_vlforge_is_the_cli(tools):
    proc = subprocess.run([str(tools.vlforge), "nosuchcommand"], capture_output=True, text=True, timeout=120,
                          env=warmstart.server_environment())
    assert proc.returncode == 2 and "No such command" in proc.stderr
    real = subprocess.run([sys.executable, "-m", "vlforge.cli", "nosuchcommand"], capture_output=True, text=True,
                          timeout=120)
    assert (real.returncode, real.stdout, real.stderr) == (proc.returncode, proc.stdout, proc.stderr)


def test_the_tally_counts_served_and_cold_runs(tools, probe):
    before = warmstart.tally()
    run(tools, str(probe))
    run(tools, str(probe), env={"TRANSFORMERS_VERBOSITY": "error"})
    after = warmstart.tally()
    assert (after["served"], after["cold"]) == (before["served"] + 1, before["cold"] + 1)
    assert "TRANSFORMERS_VERBOSITY" in after["variables"]


def test_a_server_that_failed_to_start_sends_its_clients_to_the_real_program(tools, probe, tmp_path):
    (tmp_path / "gone.sock.failed").touch()  # what a server whose imports raised leaves beside its socket
    env = {**warmstart.server_environment(), warmstart.SOCKET_VARIABLE: str(tmp_path / "gone.sock")}
    start = time.monotonic()
    proc = subprocess.run([str(tools.python), str(probe)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout)["ppid"] == os.getpid()
    assert time.monotonic() - start < 60  # not the 120 s a client waits for a server still importing
