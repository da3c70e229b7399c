"""Stop signals: a scheduler's SIGTERM (or SLURM's ``--signal=USR1``) ends a run at a step boundary with a checkpoint.

While a run trains, :class:`StopSignals` handles the signals of ``training.stop_signals``. A signal only marks a
request; each rank's requests ride on the next step's label-count all-reduce (no extra collective), so under
torchrun, where only some ranks may get the signal, every rank learns of it at the same step. Every rank finishes
that step, the checkpoint is saved, the metrics and ``data_report.json`` are written, and every rank raises
:class:`PreemptedError` (exit 4); ``checkpointing.resume: auto`` continues from that checkpoint exactly.

A second stop signal, or the end of ``training.stop_grace_period`` seconds after the first, exits at once
(``128 + the signal's number``, as if the signal had killed the process) with one log line naming the newest
complete checkpoint. A thread woken through Python's signal wake-up fd does this, so it works while the main thread
waits in a collective. An unfinished checkpoint stays a ``.tmp-checkpoint-STEP`` directory: never resumed from,
removed when the next run starts. Signals within REPEAT_WINDOW seconds of the first count as one request (a
scheduler and torchrun may each deliver one). DataLoader workers ignore the stop signals
(:func:`worker_init`: a scheduler that signals every process must not kill a worker mid-step) and end with the run.

Example:
    >>> import os, signal, time
    >>> with StopSignals(["SIGUSR1"], grace=60) as stops:
    ...     os.kill(os.getpid(), signal.SIGUSR1)
    ...     time.sleep(0.2)
    ...     stops.requests(), stops.names()
    ([1], ['SIGUSR1'])
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from vlforge.errors import ExitCode, Interrupted, Terminated, VlforgeError
from vlforge.terminate import TerminateSignal

logger = logging.getLogger(__name__)

REPEAT_WINDOW = 2.0
"""Seconds after the first stop signal within which another one is the same request."""
_installed: list[StopSignals] = []  # the instance whose handlers are set (one at a time)
_fork_hook = False


class PreemptedError(VlforgeError):
    """The run stopped on a stop signal after saving a checkpoint at a step boundary."""

    exit_code = ExitCode.PREEMPTED


class InterruptedRunError(Interrupted):
    """The run was interrupted from the keyboard (Ctrl-C) outside the configured stop signals: no checkpoint of its
    own, the newest complete one stays."""


class TerminatedRunError(Terminated):
    """SIGTERM ended the run outside the configured stop signals (``training.stop_signals`` without it, or before
    the run's handlers were set): no checkpoint of its own, the newest complete one stays."""


def interruption(error: BaseException) -> BaseException | None:
    """The Ctrl-C (``KeyboardInterrupt``) or SIGTERM (:class:`~vlforge.terminate.TerminateSignal`) that is
    ``error`` or behind it (torch reports a save cut by one as a short write or a ``CheckpointException``)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, (KeyboardInterrupt, TerminateSignal)):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def stopped_by(interrupt: BaseException, where: str, newest: str) -> Interrupted:
    """The one line of a run ended by ``interrupt`` (Ctrl-C or SIGTERM) ``where`` it was, and what a rerun takes."""
    if isinstance(interrupt, TerminateSignal):
        return TerminatedRunError(f"terminated (SIGTERM) {where}; {newest}")
    return InterruptedRunError(f"interrupted (Ctrl-C) {where}; {newest}")


class StopSignals:
    """The handlers of ``names`` while a run trains (a context manager; restores the previous ones).

    ``newest``: a function saying which complete checkpoint a rerun continues from, for the line of an exit at
    once.
    """

    def __init__(self, names: list[str], grace: float, newest: Callable[[], str] | None = None) -> None:
        self.names_ = list(names)
        self.signums = [int(getattr(signal, name)) for name in names]
        self.grace, self.newest = grace, newest
        self.first: tuple[int, float] | None = None  # the first stop signal and when it came
        self.received: set[int] = set()
        self._previous: dict[int, Any] = {}
        self._wakeup: tuple[int, int] | None = None  # (read end, write end)
        self._old_fd: int | None = None  # the wake-up fd before ours (None: ours was never set)
        self._timer: threading.Timer | None = None
        self._watcher: threading.Thread | None = None
        self._closed = False
        self.exporting: str | None = None
        """Set while the finished run exports: what a stop there leaves (the checkpoint is complete)."""

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def __enter__(self) -> StopSignals:
        self.install()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def install(self) -> None:
        """Handle the signals (from the main thread only; elsewhere the signals keep their actions)."""
        if not self.signums:
            return
        if threading.current_thread() is not threading.main_thread():
            logger.debug("stop signals: not the main thread; %s keep their default actions", ", ".join(self.names_))
            return
        global _fork_hook
        try:  # a Ctrl-C part-way (it can land between any two lines) undoes what was set
            self._wakeup = os.pipe()
            os.set_blocking(self._wakeup[1], False)
            self._old_fd = signal.set_wakeup_fd(self._wakeup[1], warn_on_full_buffer=False)
            for signum in self.signums:
                self._previous[signum] = signal.signal(signum, _noted)
            self._watcher = threading.Thread(target=self._watch, name="vlforge-stop-signals", daemon=True)
            self._watcher.start()
            _installed.append(self)
            if not _fork_hook:  # once per process, at the first run (importing this module changes nothing)
                os.register_at_fork(after_in_child=_forked)
                _fork_hook = True
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Restore the previous handlers; a later signal has its old effect."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._wakeup is None:
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if self._old_fd is not None:
            signal.set_wakeup_fd(self._old_fd)
        if self in _installed:
            _installed.remove(self)
        with contextlib.suppress(OSError):
            os.write(self._wakeup[1], b"\0")  # wakes the watcher, which then ends
        if self._watcher is not None and self._watcher.ident is not None:  # started
            self._watcher.join(timeout=5)
        for fd in self._wakeup:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wakeup = None

    # -- what the trainer reads -----------------------------------------------------------------------------------
    def requests(self) -> list[int]:
        """Per configured signal: 1 when this process received it (summed over ranks on the step's all-reduce)."""
        return [1 if signum in self.received else 0 for signum in self.signums]

    def names(self) -> list[str]:
        return list(self.names_)

    # -- the watcher thread ---------------------------------------------------------------------------------------
    def _watch(self) -> None:
        read_end = self._wakeup[0]
        while True:
            try:
                data = os.read(read_end, 64)
            except OSError:
                return
            if not data or 0 in data:
                return
            for signum in data:
                if signum in self.signums and not self._closed:
                    self._received(signum)

    def _received(self, signum: int) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = (signum, now)
            self.received.add(signum)
            self._timer = threading.Timer(self.grace, self._expired)
            self._timer.daemon = True
            self._timer.start()
            return
        self.received.add(signum)
        if now - self.first[1] > REPEAT_WINDOW:
            self._exit_now(signum, f"a second {signal.Signals(signum).name}")

    def _expired(self) -> None:
        if not self._closed and self.first is not None:
            waited = "while the finished run exported" if self.exporting else "before the checkpoint was written"
            self._exit_now(self.first[0], f"the stop grace period (training.stop_grace_period = {self.grace:g} s) "
                                          f"ended {waited}")

    def _exit_now(self, signum: int, why: str) -> None:
        if self.exporting:
            logger.error("%s: exiting at once, the export unfinished; %s", why, self.exporting)
        else:
            logger.error("%s: exiting at once without saving; %s", why,
                         self.newest() if self.newest else "the complete checkpoints are kept")
        for handler in logging.getLogger("vlforge").handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(128 + signum)


def _noted(signum: int, frame: Any) -> None:
    """The Python-level handler: nothing to do (the watcher thread acts on the wake-up fd's byte)."""


def _forked() -> None:
    """In a process forked while a run trains: its signals no longer reach the run's watcher."""
    if _installed:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)


def worker_init(names: list[str]) -> Callable[[int], None] | None:
    """A DataLoader ``worker_init_fn`` that ignores the stop signals ``names`` in the worker (torch's own SIGTERM
    handler there would end the worker, and the run with it, when a scheduler signals every process); None for none."""
    return functools.partial(_ignore, [int(getattr(signal, name)) for name in names]) if names else None


def _ignore(signums: list[int], _worker_id: int) -> None:
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)
