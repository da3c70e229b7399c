"""The one convention of every command: options -> checks before work -> run -> report -> exit code.

A job describes its command with a :class:`Job`: ``check`` refuses bad input before torch or transformers is
imported (one line, exit 2), ``run`` does the work and returns a report, ``render`` shows the report to people,
``to_json`` gives it to machines (only JSON on stdout with ``--json``) and ``exit_code`` reads the verdict
(:class:`vlforge.errors.ExitCode`). The CLI builds the options from its flags and calls :func:`execute`.

Example:
    >>> import io
    >>> from rich.console import Console
    >>> job = Job(check=lambda n: None, run=lambda n: n * 2, render=lambda n, r, c: c.print(f"twice: {r}"),
    ...           to_json=str, exit_code=lambda r: ExitCode.OK)
    >>> out = io.StringIO()
    >>> execute(job, 21, as_json=False, console=Console(file=out)), out.getvalue()
    (0, 'twice: 42\\n')
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vlforge.errors import ExitCode, Interrupted, Terminated
from vlforge.terminate import TerminateSignal

OptionsT = TypeVar("OptionsT")
ReportT = TypeVar("ReportT")


@dataclass(frozen=True)
class Job(Generic[OptionsT, ReportT]):
    """What a command does, in the order :func:`execute` calls it."""

    check: Callable[[OptionsT], None]
    """Checks before work: raise a :class:`~vlforge.errors.VlforgeError` (one line) for bad input."""
    run: Callable[[OptionsT], ReportT]
    """The work; returns the report."""
    render: Callable[[OptionsT, ReportT, Any], None]
    """The report for people, printed on a rich console: ``render(options, report, console)``."""
    to_json: Callable[[ReportT], str]
    """The report for machines (``--json``)."""
    exit_code: Callable[[ReportT], int]
    """The verdict as an :class:`~vlforge.errors.ExitCode`."""
    verdict_lines: Callable[[ReportT], list[str]] | None = None
    """Lines that name a failing verdict on stderr, with ``--json`` too (e.g. each failed check)."""


def execute(job: Job[OptionsT, ReportT], options: OptionsT, *, as_json: bool, console: Any) -> int:
    """Check, run, report (JSON on stdout, or the rendering on ``console``) and return the exit code. Ctrl-C is
    :class:`~vlforge.errors.Interrupted` (one line, exit 130) unless the job said more; SIGTERM inside
    :func:`vlforge.terminate.sigterm_raises` (the CLI's) is :class:`~vlforge.errors.Terminated` (exit 143)."""
    try:
        job.check(options)
        report = job.run(options)
        if as_json:
            sys.stdout.write(job.to_json(report) + "\n")  # plain write: no markup or wrapping touches the JSON
            sys.stdout.flush()
        else:
            job.render(options, report, console)
    except KeyboardInterrupt:
        raise Interrupted() from None
    except TerminateSignal:
        raise Terminated() from None
    for line in job.verdict_lines(report) if job.verdict_lines else ():
        sys.stderr.write(line + "\n")
    return int(job.exit_code(report))


@dataclass(frozen=True)
class Cli(Generic[OptionsT]):
    """A job as a command: the options model whose fields are its flags (:mod:`vlforge.flags`) and how they
    become the job's options."""

    flags: type
    """The options model: one field per flag or argument (name, type, default and help declared there)."""
    job: Job[Any, Any]
    to_options: Callable[[Any, bool], OptionsT] | None = None
    """``to_options(flags, as_json)`` -> the job's options; None: the flags model is the job's options."""
    json: bool = True
    """The command takes ``--json``."""


def always_ok(_report: Any) -> int:
    """``exit_code`` of a command whose report carries no verdict."""
    return ExitCode.OK
