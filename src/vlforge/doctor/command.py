"""``vlforge doctor`` as a :class:`~vlforge.command.Job`: flags checked before work, the diagnosis, the tables or
JSON, exit 0 (nothing above info), 1 (warnings) or 3 (errors).

Example (CPU, environment only, what-if):
    vlforge doctor --assume torch=2.9.1,cudnn=91002,device=cuda,capability=12.0,dtype=bfloat16
    vlforge doctor --model tiny:qwen3_vl --dtype bf16 --bench-seconds 3 --json
    vlforge doctor --model ./Qwen3-VL-4B-Base --format r1 --no-bench    # + the zero-RL format's tags
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from vlforge.command import Cli, Job
from vlforge.diagnosis.facts import DoctorError, parse_assume
from vlforge.flags import Flag
from vlforge.strict import StrictModel

if TYPE_CHECKING:
    from vlforge.diagnosis.report import DoctorReport
    from vlforge.diagnosis.tokens import TokenOptions

def check_options(
    model: str | None, *, assume: str | None, bench: bool, windows: int | None, bench_seconds: float | None,
    tokens: bool, fmt: str | None, reward_regex: str | None, tags: list[str] | None,
) -> None:
    """Refuse, before anything loads, ``--assume`` values it cannot read and flags the run would ignore.

    Example:
        >>> check_options(None, assume=None, bench=True, windows=None, bench_seconds=None, tokens=True,
        ...               fmt="r1", reward_regex=None, tags=None)
        Traceback (most recent call last):
        ...
        vlforge.diagnosis.facts.DoctorError: --format is only used with --model (the tags are audited on a model's tokenizer and weights)
    """
    parse_assume(assume)
    token_flags = [flag for flag, value in (("--format", fmt), ("--reward-regex", reward_regex), ("--tags", tags))
                   if value]
    if token_flags and not tokens:
        raise DoctorError(f"{', '.join(token_flags)} would be ignored with --no-tokens; drop one of them")
    if token_flags and model is None:
        raise DoctorError(f"{', '.join(token_flags)} is only used with --model "
                          "(the tags are audited on a model's tokenizer and weights)")
    bench_flags = [flag for flag, value in (("--windows", windows), ("--bench-seconds", bench_seconds))
                   if value is not None]
    if bench_flags and not bench:
        raise DoctorError(f"{', '.join(bench_flags)} would be ignored with --no-bench; drop one of them")
    if bench_flags and model is None:
        raise DoctorError(f"{', '.join(bench_flags)} is only used with --model (the measurement times its convs)")


def token_options(
    tokens: bool = True, fmt: str | None = None, reward_regex: str | None = None, tags: list[str] | None = None,
) -> bool | TokenOptions:
    """The ``tokens`` argument of :func:`report` from CLI flags (``--tags`` items may be comma-separated)."""
    from vlforge.diagnosis.tokens import TokenOptions

    split = tuple(t.strip() for item in tags or [] for t in item.split(","))
    options = TokenOptions(format=fmt, reward_regex=reward_regex, tags=split)
    return options if tokens else False


class DoctorOptions(StrictModel):
    """``vlforge doctor``'s flags."""

    unknown_label = "option"
    model: Annotated[str | None, Flag("--model", "-m")] = None
    """Checkpoint dir or preset (tiny:qwen3_vl, real:qwen3_vl_2b)."""
    dtype: str | None = None
    """Compute dtype of the run: float32, bf16, fp16."""
    assume: str | None = None
    """What-if facts: torch=2.9.1,cudnn=91002,device=cuda,..."""
    bench: Annotated[bool, Flag(negatable=True)] = True
    """Measure the patch convs here."""
    windows: int | None = Field(default=None, ge=1)
    """Windows per measured call (default: a 1024x1024 image)."""
    bench_seconds: float | None = Field(default=None, gt=0)
    """Time budget of the measurement [default: 5]."""
    tokens: Annotated[bool, Flag(negatable=True)] = True
    """Audit untrained special tokens of the chat template (reads the checkpoint's embeddings, a few seconds)."""
    fmt: Annotated[str | None, Flag("--format")] = None
    """Also audit a reward format's tags: r1."""
    reward_regex: str | None = None
    """Also audit the literal tags of this reward regex."""
    tags: list[str] = Field(default_factory=list)
    """Also audit these tags (comma-separated, repeatable)."""


def check(options: DoctorOptions) -> None:
    check_options(options.model, assume=options.assume, bench=options.bench, windows=options.windows,
                  bench_seconds=options.bench_seconds, tokens=options.tokens, fmt=options.fmt,
                  reward_regex=options.reward_regex, tags=options.tags)


def run(options: DoctorOptions) -> DoctorReport:
    """Diagnose (facts, rules, the measurement with a model, the tokens audit)."""
    from vlforge.diagnosis.report import DEFAULT_BENCH_SECONDS, report

    bench_seconds = DEFAULT_BENCH_SECONDS if options.bench_seconds is None else options.bench_seconds
    return report(options.model, options.dtype, options.assume, options.bench, windows=options.windows,
                  bench_seconds=bench_seconds,
                  tokens=token_options(options.tokens, options.fmt, options.reward_regex, options.tags))


def render(options: DoctorOptions, report: DoctorReport, console: Any) -> None:
    from vlforge.doctor.render import render as tables

    tables(report, console)


JOB: Job[DoctorOptions, DoctorReport] = Job(
    check=check, run=run, render=render, to_json=lambda report: report.to_json(),
    exit_code=lambda report: report.exit_code,
)
CLI = Cli(flags=DoctorOptions, job=JOB)
