"""Errors vlforge raises for users (one line, naming the file, key or module at fault), the exit codes of every
command, and the one "did you mean" helper.

Example:
    >>> from vlforge.errors import VlforgeError, PatchError
    >>> issubclass(PatchError, VlforgeError), int(ExitCode.BAD_INPUT)
    (True, 2)
    >>> did_you_mean("lerning_rate", ["learning_rate", "seed"])
    "; did you mean 'learning_rate'?"
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from enum import IntEnum


class ExitCode(IntEnum):
    """What every vlforge command's exit status means (shown in every ``--help``)."""

    OK = 0
    """Done; nothing to report."""
    WARNING = 1
    """Done, with a warning-level verdict (e.g. doctor warnings, a weak token, a plan that does not fit)."""
    BAD_INPUT = 2
    """Bad input or a broken environment: a one-line error, nothing was run or written."""
    FAILED = 3
    """The check ran and its verdict is a failure (doctor errors, verify mismatches, untrained tokens; a training run
    that stopped on non-finite steps)."""
    PREEMPTED = 4
    """Training stopped on a stop signal (SIGTERM, SIGUSR1) after saving a checkpoint; the same command continues."""
    ENVIRONMENT = 5
    """Training stopped part-way because its environment failed: a write failed (a full disk) or another process of
    the run died or stalled; the newest complete checkpoint is intact and the same command continues from it."""
    INTERRUPTED = 130
    """Interrupted from the keyboard (Ctrl-C, SIGINT), as shells count it; training says where it stopped."""
    TERMINATED = 143
    """Ended by SIGTERM (``kill``, ``timeout``, a scheduler's time limit) where it was, as shells count it (one process;
    training takes SIGTERM as a stop signal: a checkpoint, then 4)."""


EXIT_CODES_HELP = ("Exit codes: 0 ok; 1 done with warnings; 2 bad input (one error line, nothing run); "
                   "3 the verdict is a failure; train only: 4 stopped by a signal after a checkpoint, 5 a write failed "
                   "or a process of the run was lost (the same command resumes); 130 interrupted (Ctrl-C); 143 terminated (SIGTERM).")


def close_matches(name: str, candidates: Iterable[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The candidates closest to a misspelled ``name`` (best first; empty when nothing is close)."""
    return difflib.get_close_matches(str(name), [str(c) for c in candidates], n=n, cutoff=cutoff)


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first non-empty line of ``error``'s message (its type's name when it has none), at most ``limit`` long."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__)[:limit]


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest candidate, or ``""``: appended to an error message."""
    found = close_matches(name, candidates)
    return f"; did you mean {found[0]!r}?" if found else ""


class VlforgeError(Exception):
    """Base class of every user-facing vlforge error (the CLI prints it as one line, exit 2)."""

    exit_code: int = ExitCode.BAD_INPUT


class Interrupted(VlforgeError):
    """Ctrl-C (SIGINT) stopped a command where it was (every command says so in one line; exit 130)."""

    exit_code = ExitCode.INTERRUPTED

    def __init__(self, message: str = "interrupted (Ctrl-C)") -> None:
        super().__init__(message)


class Terminated(Interrupted):
    """SIGTERM stopped a command where it was (one line, exit 143; see :func:`vlforge.terminate.sigterm_raises`)."""

    exit_code = ExitCode.TERMINATED

    def __init__(self, message: str = "terminated (SIGTERM)") -> None:
        super().__init__(message)


class PatchError(VlforgeError, ValueError):
    """A patch was asked to do something it cannot (bad option, a name that matches nothing)."""


class ModelLoadError(VlforgeError):
    """A checkpoint directory, preset or hub id could not be loaded."""


class ConfigError(VlforgeError, ValueError):
    """A configuration file or override is invalid."""


class DataError(VlforgeError):
    """A dataset file or sample is invalid."""


class OutputError(ConfigError):
    """An output path cannot be written, or holds files vlforge did not write and must not touch."""


class WriteError(VlforgeError):
    """Writing an output failed part-way (a full disk, a file-size limit, any OSError); what was there before stays."""

    exit_code = ExitCode.ENVIRONMENT
