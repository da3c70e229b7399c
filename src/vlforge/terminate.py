"""SIGTERM as one line: inside :func:`sigterm_raises`, SIGTERM raises :class:`TerminateSignal` where the main thread
is (as Ctrl-C raises ``KeyboardInterrupt``), so a command ends with ``error: terminated (SIGTERM)``, exit 143, and
its ``finally`` blocks run.

Python runs a signal handler in the main thread between bytecodes only, so a main thread inside native code (a long
decode, a hung filesystem call) would hold it back. A watcher thread, woken by the signal's byte on a wake-up fd,
therefore ends the process itself - the same line, exit 143 - when the main thread has not raised within
:data:`GRACE_SECONDS`, and at once on a second SIGTERM. Processes forked inside take SIGTERM's default action.

Example:
    >>> with sigterm_raises():  # doctest: +SKIP
    ...     long_job()          # SIGTERM: TerminateSignal here (vlforge.command turns it into Terminated)
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from vlforge.errors import Terminated

GRACE_SECONDS = 10.0
"""How long the main thread has to raise after SIGTERM before the watcher ends the process."""
_active: list[int] = []  # the pid whose context is open (one at a time)
_fork_hook = False


class TerminateSignal(BaseException):
    """SIGTERM arrived: raised where the main thread was (a ``BaseException``, so no ``except Exception`` swallows
    it); :func:`vlforge.command.execute` turns it into :class:`~vlforge.errors.Terminated`."""


def _before_fork() -> None:
    """SIGTERM waits while a process forks inside the context: the child gets it after it left the parent's pipe."""
    if _active:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _after_fork_in_parent() -> None:
    if _active:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _after_fork_in_child() -> None:
    """In a child forked inside the context: its signals are its own (no wake-up bytes into the parent's pipe)."""
    if _active:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _exit_now() -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(f"error: {Terminated()}\n")
        sys.stderr.flush()
    os._exit(int(Terminated.exit_code))


def _watch(read_end: int, done: threading.Event) -> None:
    """Wait for SIGTERM's byte; then give the main thread :data:`GRACE_SECONDS` (a second SIGTERM: none)."""
    deadline = None
    while not done.is_set():
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([read_end], [], [], timeout)
        if done.is_set():
            return
        if not ready:  # the grace period ended: the main thread is stuck in native code
            _exit_now()
        try:
            data = os.read(read_end, 64)
        except OSError:
            return
        if not data:
            return
        for _ in range(data.count(signal.SIGTERM)):
            if deadline is not None:
                _exit_now()
            deadline = time.monotonic() + GRACE_SECONDS


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`TerminateSignal` in this process (see the module docstring).

    Left alone: another thread than the main one, a SIGTERM handler someone else set, a process of a torchrun launch
    of several processes (``WORLD_SIZE`` other than 1: torchrun ends its workers with SIGTERM, perhaps inside a
    collective that would hold the handler back) and an already open context."""
    if (threading.current_thread() is not threading.main_thread() or _active
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            or (os.environ.get("WORLD_SIZE") or "1").strip() != "1"):
        yield
        return
    global _fork_hook
    owner = os.getpid()

    def terminate(signum: int, _frame: Any) -> None:
        signal.signal(signum, signal.SIG_DFL)
        if os.getpid() != owner:  # a forked process that kept the handler: the default action
            os.kill(os.getpid(), signum)
            return
        raise TerminateSignal

    done = threading.Event()
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    old_fd: int | None = None
    watcher = threading.Thread(target=_watch, args=(read_end, done), name="vlforge-sigterm", daemon=True)
    try:
        old_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, terminate)
        _active.append(owner)
        if not _fork_hook:
            os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                                after_in_child=_after_fork_in_child)
            _fork_hook = True
        watcher.start()
        yield
    finally:
        done.set()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if old_fd is not None:
            signal.set_wakeup_fd(old_fd)
        if owner in _active:
            _active.remove(owner)
        with contextlib.suppress(OSError):
            os.write(write_end, b"\0")  # wakes the watcher, which sees `done` and ends
        if watcher.ident is not None:
            watcher.join(timeout=5)
        for fd in (read_end, write_end):
            with contextlib.suppress(OSError):
                os.close(fd)
