"""``vlforge extract`` as a :class:`~vlforge.command.Job`: every check before torch, the extraction (works under
torchrun), its JSON summary.

Example (CPU, seconds):
    vlforge extract --model tiny:qwen3_vl --data examples/data/dataset.yaml --out /tmp/features
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from vlforge.command import Cli, Job
from vlforge.errors import ExitCode, Interrupted, Terminated
from vlforge.extract.options import ExtractOptions
from vlforge.flags import Flag
from vlforge.terminate import TerminateSignal

if TYPE_CHECKING:
    from vlforge.extract.runner import ExtractSummary


class ExtractFlags(ExtractOptions):
    """``vlforge extract``'s flags: the cache's options and the progress bar."""

    progress: Annotated[bool, Flag(negatable=True)] = True
    """Progress bar (rank 0)."""


def from_flags(flags: ExtractFlags, as_json: bool) -> ExtractRun:
    options = ExtractOptions(**flags.model_dump(exclude={"progress"}))
    return ExtractRun(options, progress=flags.progress and not as_json)


@dataclass(frozen=True)
class ExtractRun:
    """The options of the cache and whether this process shows a progress bar."""

    options: ExtractOptions
    progress: bool = True


def check(run: ExtractRun) -> None:
    """Output directory, data files and media folders, model reference, layers and features (< 1 s)."""
    from vlforge.extract.preflight import preflight

    preflight(run.options)


def extract(run: ExtractRun) -> ExtractSummary:
    """The extraction; Ctrl-C or SIGTERM part-way is one line saying the cache resumes."""
    from vlforge.extract.runner import run_extract

    try:
        return run_extract(run.options, progress=run.progress, raise_on_limit=False)
    except (KeyboardInterrupt, TerminateSignal) as caught:
        kept = f"{run.options.out} keeps every shard written so far; the same command resumes the cache"
        if isinstance(caught, TerminateSignal):
            raise Terminated(f"terminated (SIGTERM); {kept}") from None
        raise Interrupted(f"interrupted (Ctrl-C); {kept}") from None


def render(run: ExtractRun, summary: ExtractSummary, console: Any) -> None:
    """People read the log lines the extraction wrote; nothing more goes to stdout."""


def _exit_code(summary: ExtractSummary) -> int:
    """2 when the skipped share is over ``--max-skip-fraction`` (the cache and its report are written)."""
    return ExitCode.BAD_INPUT if summary.skip_limit else ExitCode.OK


JOB: Job[ExtractRun, ExtractSummary] = Job(
    check=check, run=extract, render=render, to_json=lambda summary: json.dumps(summary.to_dict(), indent=2),
    exit_code=_exit_code, verdict_lines=lambda summary: [f"error: {summary.skip_limit}"] if summary.skip_limit else [],
)
CLI = Cli(flags=ExtractFlags, job=JOB, to_options=from_flags)
