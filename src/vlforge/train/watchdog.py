"""Heartbeats between the processes of a run: a rank that dies or stalls ends the others in bounded time.

Each rank's :class:`Heartbeats` thread writes ``BEAT STEP STATE`` under its own key of the process group's c10d
store (torchrun's TCPStore) every ``interval`` seconds and watches the key of the next rank (the last watches rank
0): every rank is watched by one other, and the store serves two reads and a write per rank and interval whatever
the number of ranks. Time is measured on the watching host only (since the key last changed), so clocks need not
agree.

- A watched rank still marked running whose key has not changed for ``training.rank_timeout`` seconds (a stopped
  process, a lost host) is announced under the run's verdict key, and every rank's thread that reads the verdict
  ends its process at once with one log line naming that rank and the step it was in (exit 5), instead of a
  collective waiting ``training.ddp_timeout`` and a traceback.
- A rank that ends marks its key ``done`` or ``failed MESSAGE``. When a collective of this rank fails (gloo
  reports a peer's exit at once), :meth:`Heartbeats.lost` names the rank that is gone within a few intervals: its
  watcher finds it failed, ended or silent and announces it. The trainer then raises :class:`RankLostError`
  (exit 5). torchrun sends SIGTERM to the remaining workers when one fails; the lost rank is named before that
  could read as a preemption.

Example (how a key reads):
    >>> parse_beat(b"12 40 failed data: out of samples")
    (12, 40, 'failed', 'data: out of samples')
    >>> in_step(40), in_step(0)
    ('in step 40', 'while starting')
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from vlforge.dist import DistContext
from vlforge.errors import ExitCode, VlforgeError, first_line

logger = logging.getLogger(__name__)

MAX_INTERVAL = 2.0
"""Seconds between heartbeats at most (a quarter of ``rank_timeout`` when that is shorter)."""
LOST_AFTER = 3
"""Heartbeat intervals without a change after which a rank counts as gone once a collective has failed."""


class RankLostError(VlforgeError):
    """Another process of the run died, failed or stopped responding."""

    exit_code = ExitCode.ENVIRONMENT


def in_step(step: int) -> str:
    """``in step N`` (the optimiser step in progress), or ``while starting`` before the first one."""
    return f"in step {step}" if step > 0 else "while starting"


def parse_beat(value: bytes | str) -> tuple[int, int, str, str]:
    """(beat, step, state, message) of a heartbeat key's value."""
    text = value.decode() if isinstance(value, bytes) else value
    beat, step, state, *message = text.split(" ", 3)
    return int(beat), int(step), state, message[0] if message else ""


def _tcp_store(timeout: float) -> Any:
    """A client of the default process group's TCPStore of its own (so this thread never waits behind the main
    thread's store calls), or None when the group has no TCP store."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    if not isinstance(store, dist.TCPStore):
        return None
    return dist.TCPStore(store.host, store.port, is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=max(timeout, 5.0)))


class Heartbeats:
    """This rank's heartbeat thread (a context manager; nothing in one process). ``step``, the optimiser step in
    progress, is set by the training loop and published by the thread."""

    def __init__(self, ctx: DistContext, timeout: float, newest: Callable[[], str] | None = None) -> None:
        self.ctx, self.timeout, self.newest = ctx, timeout, newest
        self.interval = min(MAX_INTERVAL, timeout / 4)
        self.step = 0
        self.store: Any = None
        self.watched = (ctx.rank + 1) % ctx.world_size
        self._beat = 0
        self._seen: tuple[bytes, float] = (b"", 0.0)  # the watched rank's value, and when it last changed here
        self._verdict: str | None = None
        self._stop = threading.Event()
        self._explaining = False  # the main thread asks lost(): it, not the thread, ends this rank
        self._thread: threading.Thread | None = None
        self._store_failing_since: float | None = None
        run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        self._prefix = f"vlforge/heartbeat/{run}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"

    def _key(self, rank: int | str) -> str:
        return f"{self._prefix}{rank}"

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def __enter__(self) -> Heartbeats:
        self.start()
        return self

    def __exit__(self, kind: Any, error: BaseException | None, _tb: Any) -> None:
        self.stop(error)

    def start(self) -> None:
        """Publish the first beat, wait for every rank's (a barrier), then beat in a thread."""
        if not self.ctx.distributed:
            return
        try:
            self.store = _tcp_store(self.timeout)
        except Exception as error:  # a group without a reachable TCP store: no heartbeats, ddp_timeout applies
            logger.warning("heartbeats: no store client (%s); a stalled rank is found after training.ddp_timeout",
                           error)
        if self.store is None:
            return
        self._publish("run")
        self.ctx.barrier()  # every rank's key exists before any is read
        self._seen = (self.store.get(self._key(self.watched)), time.monotonic())
        self._thread = threading.Thread(target=self._run, name="vlforge-heartbeats", daemon=True)
        self._thread.start()

    def stop(self, error: BaseException | None = None) -> None:
        """End the thread and mark this rank ``done`` (or ``failed`` with the error's first line)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)
        self._thread = None
        state = "done" if error is None else f"failed {first_line(error)}"
        with contextlib.suppress(Exception):
            self._publish(state)

    # -- the thread -----------------------------------------------------------------------------------------------
    def _publish(self, state: str) -> None:
        self._beat += 1
        self.store.set(self._key(self.ctx.rank), f"{self._beat} {self.step} {state}")

    def _run(self) -> None:
        verdict_key = self._key("verdict")
        while not self._stop.wait(self.interval):
            try:
                self._publish("run")
                value = self.store.get(self._key(self.watched))
                verdict = self.store.get(verdict_key).decode() if self.store.check([verdict_key]) else None
            except Exception as error:  # the store's host is unreachable
                now = time.monotonic()
                self._store_failing_since = self._store_failing_since or now
                if now - self._store_failing_since >= self.timeout:
                    self._exit(f"the run's c10d store is unreachable ({first_line(error)})")
                continue
            self._store_failing_since = None
            if value != self._seen[0]:
                self._seen = (value, time.monotonic())
            if verdict is None:
                verdict = self._silent(self.timeout)
                if verdict is not None:
                    self._announce(verdict)
            self._verdict = verdict
            if verdict is not None and not (self._stop.is_set() or self._explaining):
                self._exit(verdict)

    def _silent(self, seconds: float) -> str | None:
        """The watched rank, when it is still marked running and its key has not changed for ``seconds``."""
        value, since = self._seen
        _, step, state, _ = parse_beat(value)
        waited = time.monotonic() - since
        if state == "run" and waited >= seconds:
            return f"rank {self.watched} stopped responding {in_step(step)} (no heartbeat for {waited:.0f} s)"
        return None

    def _ended(self) -> str | None:
        """The watched rank, when it marked itself failed or ended."""
        _, step, state, message = parse_beat(self._seen[0])
        if state == "failed":
            return f"rank {self.watched} failed {in_step(step)} ({message})"
        if state == "done":
            return f"rank {self.watched} ended {in_step(step)}"
        return None

    def _announce(self, verdict: str) -> str:
        """Record ``verdict`` under the run's verdict key unless another rank did first; returns the one kept."""
        with contextlib.suppress(Exception):
            return self.store.compare_set(self._key("verdict"), "", verdict).decode()
        return verdict

    def _exit(self, what: str) -> None:
        logger.error("%s, training.rank_timeout = %g s: rank %d stops %s; %s", what, self.timeout, self.ctx.rank,
                     in_step(self.step), self.newest() if self.newest else "its checkpoints are kept")
        for handler in logging.getLogger("vlforge").handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(ExitCode.ENVIRONMENT)

    # -- after a failed collective --------------------------------------------------------------------------------
    def lost(self) -> str | None:
        """Which rank is gone, after a collective of this rank failed: the run's verdict, or the watched rank when
        it failed, ended or its heartbeat stopped (then announced). Waits up to LOST_AFTER + 1 intervals; None
        when no rank is found gone."""
        if self._thread is None:
            return None
        self._explaining = True
        deadline = time.monotonic() + (LOST_AFTER + 1) * self.interval
        while True:
            found = self._verdict or self._ended() or self._silent(LOST_AFTER * self.interval)
            if found is not None:
                return found if found == self._verdict else self._announce(found)
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.interval / 4)


