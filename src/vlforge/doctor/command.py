"""The job behind ``vlforge doctor``: build the report, print it (rich or JSON), return the exit code.

Example (CPU, environment only, what-if):
    vlforge doctor --assume torch=2.9.1,cudnn=91002,device=cuda,capability=12.0,dtype=bfloat16
    vlforge doctor --model tiny:qwen3_vl --dtype bf16 --bench-seconds 3 --json
    vlforge doctor --model ./Qwen3-VL-4B-Base --format r1 --no-bench    # + the zero-RL format's tags
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlforge.doctor.facts import DoctorError, parse_assume

if TYPE_CHECKING:
    from rich.console import Console

    from vlforge.doctor.tokens import TokenOptions

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
        vlforge.doctor.facts.DoctorError: --format is only used with --model (the tags are audited on a model's tokenizer and weights)
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
    from vlforge.doctor.tokens import TokenOptions

    split = tuple(t.strip() for item in tags or [] for t in item.split(","))
    options = TokenOptions(format=fmt, reward_regex=reward_regex, tags=split)
    return options if tokens else False


def run(
    model: str | None = None,
    *,
    dtype: str | None = None,
    assume: str | None = None,
    bench: bool = True,
    windows: int | None = None,
    bench_seconds: float | None = None,
    json_output: bool = False,
    console: Console | None = None,
    tokens: bool | TokenOptions = True,
) -> int:
    """Diagnose, print, and return 0 (nothing above info), 1 (warnings) or 3 (errors)."""
    from vlforge.doctor.render import render
    from vlforge.doctor.report import DEFAULT_BENCH_SECONDS, report
    from vlforge.tables import report_console

    bench_seconds = DEFAULT_BENCH_SECONDS if bench_seconds is None else bench_seconds
    rep = report(model, dtype, assume, bench, windows=windows, bench_seconds=bench_seconds, tokens=tokens)
    console = console or report_console()
    if json_output:
        # Plain write: no rich markup or wrapping may touch the JSON.
        console.file.write(rep.to_json() + "\n")
        console.file.flush()
    else:
        render(rep, console)
    return rep.exit_code
