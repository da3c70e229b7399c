"""``vlforge verify`` as a :class:`~vlforge.command.Job`: the patched model against the stock one, exit 3 naming
each failed check.

Example (CPU, seconds):
    vlforge verify --model tiny:qwen3_vl --synthetic 1x64x64 --generate 4
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vlforge.command import Cli, Job
from vlforge.errors import ExitCode
from vlforge.verify.options import VerifyOptions

if TYPE_CHECKING:
    from vlforge.verify.report import VerifyReport


def check(options: VerifyOptions) -> None:
    """The model reference, before torch and the model load."""
    from vlforge.models.refs import check_model_ref

    check_model_ref(options.model)


def run(options: VerifyOptions) -> VerifyReport:
    from vlforge.verify.runner import run_verify

    return run_verify(options)


def render(options: VerifyOptions, report: VerifyReport, console: Any) -> None:
    from vlforge.verify.report import render as tables

    tables(report, console)


def failed_checks(report: VerifyReport) -> list[str]:
    return [f"verify failed: {check.describe()}" for check in report.checks if not check.passed]


JOB: Job[VerifyOptions, VerifyReport] = Job(
    check=check, run=run, render=render, to_json=lambda report: report.model_dump_json(indent=2),
    exit_code=lambda report: ExitCode.OK if report.passed else ExitCode.FAILED, verdict_lines=failed_checks,
)
CLI = Cli(flags=VerifyOptions, job=JOB)
