"""The job behind ``vlforge doctor``: build the report, print it (rich or JSON), return the exit code.

Example (CPU, environment only, what-if):
    vlforge doctor --assume torch=2.9.1,cudnn=91002,device=cuda,capability=12.0,dtype=bfloat16
    vlforge doctor --model tiny:qwen3_vl --dtype bf16 --bench-seconds 3 --json
    vlforge doctor --model ./Qwen3-VL-4B-Base --format r1 --no-bench    # + the zero-RL format's tags
"""

from __future__ import annotations

from rich.console import Console

from vlforge.doctor.render import render
from vlforge.doctor.report import DEFAULT_BENCH_SECONDS, report
from vlforge.doctor.tokens import TokenOptions
from vlforge.tables import report_console


def token_options(
    tokens: bool = True, fmt: str | None = None, reward_regex: str | None = None, tags: list[str] | None = None,
) -> bool | TokenOptions:
    """The ``tokens`` argument of :func:`report` from CLI flags (``--tags`` items may be comma-separated)."""
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
    bench_seconds: float = DEFAULT_BENCH_SECONDS,
    json_output: bool = False,
    console: Console | None = None,
    tokens: bool | TokenOptions = True,
) -> int:
    """Diagnose, print, and return 0 (nothing above info), 1 (warnings) or 2 (errors)."""
    rep = report(model, dtype, assume, bench, windows=windows, bench_seconds=bench_seconds, tokens=tokens)
    console = console or report_console()
    if json_output:
        # Plain write: no rich markup or wrapping may touch the JSON.
        console.file.write(rep.to_json() + "\n")
        console.file.flush()
    else:
        render(rep, console)
    return rep.exit_code
