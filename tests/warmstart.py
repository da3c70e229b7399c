"""Warm start for the suite's subprocesses: a server that imported torch and transformers forks each run.

**Why.** A ``vlforge ...`` or ``python -m vlforge.train`` subprocess spends about 6 s importing torch and
transformers' model classes before its work starts (most of that in ``torch.distributed.tensor``, dynamo and
sympy, pulled in by transformers); the suite starts hundreds of them, plus every torchrun rank.

**How.** Each pytest process starts one server (:func:`start`): a plain Python process that imports the
third-party modules the runs need - never a vlforge module, so every run imports vlforge itself, fresh - and
waits on a Unix socket. Its tools are small client scripts in a ``bin`` folder (:func:`tools`): ``python``
and ``vlforge`` (and ``torchrun``). A client sends its arguments, working directory, environment and its
stdin/stdout/stderr file descriptors; the server forks; the child takes those descriptors as its own standard
streams, the client's directory, environment, ``argv`` and file-size limit (``RLIMIT_FSIZE``: tests of a full disk
set it), and runs the program (``vlforge``'s entry point,
``-m MODULE`` or a script) as ``__main__``, exiting through the interpreter's normal shutdown (atexit
handlers, non-daemon threads). The server reports the child's exit status to the client, which exits with
it (or dies of the same signal). The client forwards SIGTERM/SIGINT/SIGHUP to the child, and the child kills
itself when its client disappears (a SIGKILLed client, a timeout). In the child ``sys.executable`` is the
``python`` client, so torchrun's ranks and any nested run are warm too.

**When it does not serve** (the client then ``exec``\\ s the real program, unchanged): no server in the
environment, a Python option other than ``-u``, ``-c CODE``, or an environment that differs from the server's
in a variable read at import time (everything but :data:`RUNTIME_VARIABLES`: ``HF_*``, ``TORCH_*``,
``TRANSFORMERS_*``, ``PYTHON*``, ... force a real start). ``OMP_NUM_THREADS`` (torchrun sets it to 1) is
applied with ``torch.set_num_threads``. Tests of import-time behaviour (``tests/test_import_state.py``,
``tests/models/test_import_vlforge.py``) start ``sys.executable`` directly and are never served.

The server never runs a torch operation before forking (no OpenMP pool to inherit) and its Python code runs in
one thread; the one other thread after its imports is numpy's OpenBLAS pool, which OpenBLAS itself shuts down
around a fork. Its imported heap is frozen (``gc.freeze``) before it serves, as pre-fork servers do: a child's
garbage collections and interpreter shutdown skip it. Where triton is installed (torch imports it), its nanobind
bindings would report the frozen objects as leaks when a served run ends: the run's last exit hook sends the final
teardown's stderr to /dev/null (:func:`quiet_frozen_nanobind`).
``VLFORGE_TEST_WARM=0`` turns the warm start off for a whole run (every tool ``exec``\\ s the real program).
"""

from __future__ import annotations

import array
import atexit
import contextlib
import gc
import importlib
import io
import json
import os
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

SOCKET_VARIABLE = "VLFORGE_TEST_WARM_SOCKET"
SWITCH_VARIABLE = "VLFORGE_TEST_WARM"
KEEP_VARIABLE = "VLFORGE_TEST_WARM_KEEP"  # 1: keep the server's folder (its log names every run, served or not)

#: Variables that may differ between the server and a served run: read at run time only (or applied here).
RUNTIME_VARIABLES = frozenset({
    "PATH", "PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES", "TERM", "NO_COLOR", "FORCE_COLOR",
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "CUDA_VISIBLE_DEVICES", "GLOO_SOCKET_IFNAME",
    "PYTHONPATH",  # added to sys.path in the child, as the interpreter would
    "TORCHINDUCTOR_CACHE_DIR",  # torch sets it itself while transformers imports (a path, read when compiling)
})
RUNTIME_PREFIXES = (
    "TORCHELASTIC_", "PYTEST_", "VLFORGE_",
    "_TORCHINDUCTOR_",  # torch's own run-time state (set in a test process by an earlier in-process run)
    "WANDB_",  # wandb is never imported by the server; its child reads them when it imports wandb
)

#: Third-party modules the server imports (each if installed); vlforge itself is never imported there.
WARM_MODULES = (
    "numpy", "yaml", "pydantic", "typer", "rich.console", "rich.table", "rich.logging", "jinja2", "PIL.Image",
    "av", "safetensors.torch", "tokenizers", "torch", "torch.nn", "torch.distributed", "torch.distributed.run",
    "torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict", "torch.utils.checkpoint", "torch.utils.data", "transformers",
    "transformers.modeling_utils", "transformers.processing_utils", "transformers.image_processing_utils",
    "transformers.video_processing_utils", "transformers.models.auto.modeling_auto",
    "transformers.models.auto.processing_auto", "transformers.models.auto.tokenization_auto", "peft",
)

_HEADER = struct.Struct("!I")


# --------------------------------------------------------------------------- server


def _import_warm(transformers_names: list[str]) -> None:
    for name in WARM_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    import transformers

    for name in transformers_names:  # a family a older transformers lacks is simply not warm
        with contextlib.suppress(Exception):
            getattr(transformers, name)


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    data = b""
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(data)[0]:
        chunk, ancillary, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(3 * fds.itemsize))
        if not chunk:
            raise ConnectionError("client closed the connection mid-request")
        data += chunk
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return json.loads(data[_HEADER.size:]), list(fds)


def _differing(request: dict, served: dict[str, str]) -> list[str]:
    env = request["env"]
    keys = set(env) ^ set(served) | {k for k in set(env) & set(served) if env[k] != served[k]}
    return sorted(k for k in keys if k not in RUNTIME_VARIABLES and not k.startswith(RUNTIME_PREFIXES))


class _Run:
    """One served program, set up and run in the forked child."""

    def __init__(self, request: dict, fds: list[int], conn: socket.socket, python_tool: str) -> None:
        self.request, self.fds, self.conn, self.python_tool = request, fds, conn, python_tool

    def _streams(self, unbuffered: bool) -> None:
        for target, fd in enumerate(self.fds):
            os.dup2(fd, target)
            os.close(fd)
        for number, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
            old = getattr(sys, name)
            mode = "rb" if number == 0 else "wb"
            raw = io.FileIO(number, mode, closefd=False)
            tty = raw.isatty()
            binary = raw if (unbuffered and number) else (io.BufferedReader(raw) if number == 0 else
                                                           io.BufferedWriter(raw))
            stream = io.TextIOWrapper(binary, encoding=old.encoding, errors=old.errors,
                                      line_buffering=number == 2 or (tty and number == 1),
                                      write_through=unbuffered)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)

    def _watch_client(self) -> None:
        """Die with the client: a SIGKILLed client (a test's timeout, a killed launch) closes the socket."""
        import threading

        def watch() -> None:
            with contextlib.suppress(OSError):
                while self.conn.recv(1):
                    pass
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, name="warmstart-client-watch", daemon=True).start()

    def run(self) -> int | None:
        request = self.request
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)
        self._streams(request["unbuffered"])
        if "triton" in sys.modules:
            atexit.register(quiet_frozen_nanobind)  # registered first, so it runs after the program's own hooks
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if request.get("fsize") is not None:
            import resource

            with contextlib.suppress(ValueError, OSError):  # a limit lower than the server's: always allowed
                resource.setrlimit(resource.RLIMIT_FSIZE, tuple(request["fsize"]))
        extra = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
        sys.path[1:1] = [str(Path(request["cwd"], entry)) for entry in extra if entry not in sys.path]
        threads = request["env"].get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            import torch

            torch.set_num_threads(int(threads))
        with contextlib.suppress(ImportError):
            import numpy

            numpy.random.seed()
        sys.executable = self.python_tool
        self._watch_client()
        kind, target, args = request["kind"], request["target"], request["args"]
        import runpy

        if kind == "entry":
            module, _, function = target.partition(":")
            sys.argv = [request["argv0"], *args]
            sys.path[0] = str(Path(request["argv0"]).parent)
            return getattr(importlib.import_module(module), function)()
        if kind == "module":
            sys.argv = [target, *args]
            sys.path[0] = request["cwd"]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
            return None
        sys.argv = [target, *args]
        sys.path[0] = str(Path(request["cwd"], target).resolve().parent)
        runpy.run_path(target, run_name="__main__")
        return None


def quiet_frozen_nanobind() -> None:
    """The last exit hook of a served run when the server imported triton (torch does, whenever it is installed):
    triton's nanobind bindings report every object still alive at the very end of the shutdown, and the server's
    frozen heap holds theirs (a fresh process frees them, so only a served run would print ``nanobind: leaked``).
    The program's output is flushed first; stderr goes to /dev/null for the interpreter's final teardown alone."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)


def _send(conn: socket.socket, text: str) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(text.encode() + b"\n")


def serve(socket_path: str, python_tool: str, transformers_names: list[str]) -> _Run:
    """Import, listen, fork a child per request; returns only in a child, with the run it must do."""
    served_env = dict(os.environ)  # before the imports: torch sets TORCHINDUCTOR_CACHE_DIR while importing
    _import_warm(transformers_names)
    # The imported heap goes to the permanent generation (what pre-fork servers do): a child's collections and its
    # interpreter shutdown skip those millions of objects (an exit walks them several times: ~1.3 s each run).
    gc.collect()
    gc.freeze()
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path + ".tmp")
    listener.listen(64)
    os.rename(socket_path + ".tmp", socket_path)  # clients see the socket only once it listens
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    print(f"ready: {len(sys.modules)} modules imported, {threads} thread(s)", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    served: dict[int, int] = {}  # child pid -> client pid
    registry = _registry(socket_path)
    registry.mkdir(exist_ok=True)
    while os.getppid() == parent:
        for _key, _ in selector.select(timeout=0.05):
            conn, _ = listener.accept()
            try:
                conn.settimeout(10)
                request, fds = _recv_request(conn)
                conn.settimeout(None)
            except (OSError, ValueError, ConnectionError):
                conn.close()
                continue
            differing = _differing(request, served_env)
            if differing or len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                print(f"not served ({request['kind']} {request['target']}): differs in {differing}", flush=True)
                _send(conn, "X " + ",".join(differing))
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                selector.close()
                listener.close()
                for other in children.values():
                    other.close()
                return _Run(request, fds, conn, python_tool)
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            client = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))[0]
            (registry / str(client)).write_text(str(pid))
            served[pid] = client
            print(f"served ({request['kind']} {request['target']}) as pid {pid}", flush=True)
            _send(conn, f"P {pid}")
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            with contextlib.suppress(OSError, KeyError):
                (registry / str(served.pop(pid))).unlink()
            if conn is not None:
                _send(conn, f"S {status}")
                conn.close()
    raise SystemExit(0)  # the pytest process that started this server is gone


def _registry(socket_path: str) -> Path:
    """``<folder>/served/<client pid>`` holds the pid of the child serving that client while it runs."""
    return Path(socket_path).parent / "served"


def served_pid(client: int) -> int | None:
    """The pid of the process running the program for warm client ``client`` (None: not a served client)."""
    socket_path = os.environ.get(SOCKET_VARIABLE)
    if not socket_path:
        return None
    try:
        return int((_registry(socket_path) / str(client)).read_text())
    except (OSError, ValueError):
        return None


def _children(pid: int) -> list[int]:
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):  # the thread or process ended meanwhile
            found += [int(child) for child in children.read_text().split()]
    return found


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (Linux ``/proc``), children before grandchildren; a warm client's served
    process counts as its child (it is the program the client stands for)."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop(0)
        kids = _children(parent)
        child = served_pid(parent)
        if child is not None:
            kids.insert(0, child)
        found += kids
        queue += kids
    return found


def kill(pid: int, number: int = signal.SIGKILL) -> None:
    """Signal a run as a test would signal a process: the served program (when ``pid`` is a warm client)
    first, then ``pid`` itself."""
    for target in (served_pid(pid), pid):
        if target is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, number)


# --------------------------------------------------------------------------- client scripts

_CLIENT = r'''#!{python} -IS
"""Warm-start client ({tool}); see {module}."""
import array, json, os, resource, signal, socket, struct, sys, time

REAL = {real!r}
KIND = {kind!r}
TARGET = {target!r}


def real():
    os.execv(REAL[0], [*REAL, *sys.argv[1:]])


def request():
    if KIND != "python":
        return KIND, TARGET, sys.argv[1:], False
    args, unbuffered = sys.argv[1:], False
    while args and args[0] == "-u":
        args, unbuffered = args[1:], True
    if args[:1] == ["-m"] and len(args) > 1:
        return "module", args[1], args[2:], unbuffered
    if args and not args[0].startswith("-"):
        return "script", args[0], args[1:], unbuffered
    return None


def main():
    path = os.environ.get({socket_variable!r})
    what = request() if path and os.environ.get({switch_variable!r}, "1") != "0" else None
    if what is None:
        real()
    deadline = time.monotonic() + 120
    while not os.path.exists(path):  # the server is still importing
        if time.monotonic() > deadline or os.path.exists(path + ".failed"):
            real()
        time.sleep(0.05)
    kind, target, args, unbuffered = what
    body = json.dumps({{"kind": kind, "target": target, "args": args, "unbuffered": unbuffered,
                        "argv0": sys.argv[0], "cwd": os.getcwd(), "env": dict(os.environ),
                        "fsize": list(resource.getrlimit(resource.RLIMIT_FSIZE))}}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        conn.sendmsg([struct.pack("!I", len(body)) + body],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    except OSError:
        real()
    reader = conn.makefile("r")
    first = reader.readline().split(" ", 1)
    if first[0] != "P":
        conn.close()
        real()
    child = int(first[1])

    def forward(number, _frame):
        try:
            os.kill(child, number)
        except ProcessLookupError:
            pass

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, forward)
    line = reader.readline().split(" ", 1)
    if line[0] != "S":
        sys.stderr.write("warm-start server ended before the run (see {module})\n")
        sys.exit(1)
    status = int(line[1])
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    sys.exit(os.waitstatus_to_exitcode(status))


main()
'''


def _write_tool(folder: Path, tool: str, real: list[str], kind: str, target: str) -> Path:
    path = folder / tool
    path.write_text(_CLIENT.format(python=sys.executable, tool=tool, module=__file__, real=real, kind=kind,
                                   target=target, socket_variable=SOCKET_VARIABLE, switch_variable=SWITCH_VARIABLE))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


class Tools:
    """The warm ``bin`` folder of this process's server: ``python``, ``vlforge``, ``torchrun``."""

    def __init__(self, folder: Path) -> None:
        self.bin = folder
        self.python = folder / "python"
        self.vlforge = folder / "vlforge"
        self.torchrun = folder / "torchrun"


def _write_tools(folder: Path) -> Tools:
    folder.mkdir(parents=True, exist_ok=True)
    real_bin = Path(sys.executable).parent
    _write_tool(folder, "python", [sys.executable], "python", "")
    _write_tool(folder, "vlforge", [sys.executable, str(real_bin / "vlforge")], "entry", "vlforge.cli:main")
    _write_tool(folder, "torchrun", [sys.executable, "-m", "torch.distributed.run"], "module",
                "torch.distributed.run")
    return Tools(folder)


# --------------------------------------------------------------------------- the pytest side

_STATE: dict[str, object] = {}


def start(transformers_names: list[str]) -> Tools:
    """Start this process's server (in the background; clients wait for its socket) and write its tools; sets
    :data:`SOCKET_VARIABLE` in ``os.environ`` so that subprocesses find it. Idempotent."""
    if "tools" in _STATE:
        return _STATE["tools"]  # type: ignore[return-value]
    folder = Path(tempfile.mkdtemp(prefix="vlforge-warm-"))
    tools = _write_tools(folder / "bin")
    socket_path = str(folder / "server.sock")
    log = open(folder / "server.log", "wb")  # noqa: SIM115 - the server's own output, kept for debugging
    proc = subprocess.Popen([sys.executable, __file__, "serve", socket_path, str(tools.python),
                             json.dumps(transformers_names)], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            env={k: v for k, v in os.environ.items() if k != SOCKET_VARIABLE})
    os.environ[SOCKET_VARIABLE] = socket_path
    _STATE.update(tools=tools, proc=proc, folder=folder, log=log, env=dict(os.environ))
    return tools


def server_environment() -> dict[str, str]:
    """The environment the server started with (a run with it is served), ``os.environ`` without a server."""
    env = _STATE.get("env")
    return dict(env) if isinstance(env, dict) else dict(os.environ)


def tally() -> dict[str, object]:
    """What this process's server did so far: runs served, runs started cold and the variables that caused it."""
    folder = _STATE.get("folder")
    lines = (folder / "server.log").read_text(errors="replace").splitlines() \
        if isinstance(folder, Path) and (folder / "server.log").is_file() else []
    cold = [line for line in lines if line.startswith("not served")]
    reasons = sorted({name for line in cold for name in line.partition("differs in ")[2].strip("[]").replace("'", "")
                      .split(", ") if name})
    return {"served": sum(line.startswith("served") for line in lines), "cold": len(cold), "variables": reasons}


def tools() -> Tools | None:
    """This process's warm tools (None before :func:`start` or with the warm start off)."""
    found = _STATE.get("tools")
    return found if isinstance(found, Tools) else None


def python() -> str:
    """The interpreter a test starts a vlforge run with: the warm ``python`` tool once :func:`start` ran
    (``-m MODULE`` and scripts are served), else this interpreter."""
    tools = _STATE.get("tools")
    return str(tools.python) if isinstance(tools, Tools) else sys.executable


def stop(report: Path | None = None) -> None:
    """Stop this process's server; ``report``: write :func:`tally` there as JSON first."""
    if report is not None and "folder" in _STATE:
        with contextlib.suppress(OSError):
            report.write_text(json.dumps(tally()))
    proc = _STATE.pop("proc", None)
    if isinstance(proc, subprocess.Popen):
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    log = _STATE.pop("log", None)
    if log is not None:
        log.close()  # type: ignore[union-attr]
    folder = _STATE.pop("folder", None)
    _STATE.pop("tools", None)
    os.environ.pop(SOCKET_VARIABLE, None)
    if isinstance(folder, Path) and os.environ.get(KEEP_VARIABLE, "0") == "0":
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def _server_main(argv: list[str]) -> int | None:
    socket_path, python_tool, names = argv
    sys.path[0] = "/nonexistent/warmstart-path0"  # not tests/: each run sets its own first entry
    try:
        run = serve(socket_path, python_tool, json.loads(names))
    except BaseException:
        if os.path.exists(socket_path):  # a served run never gets here; the server stopped after serving
            raise
        Path(socket_path + ".failed").touch()  # waiting clients start their program for real at once
        raise
    return run.run()


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    sys.exit(_server_main(sys.argv[2:]))
