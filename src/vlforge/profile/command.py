"""``vlforge profile`` as a :class:`~vlforge.command.Job`: checks before torch, the run, the tables or JSON.

Example (CPU, seconds):
    vlforge profile --model tiny:qwen3_vl --synthetic 2x64x64 --compare stock,patched --repeats 1
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vlforge.command import Cli, Job, always_ok
from vlforge.profile.options import ProfileOptions, check_plot_format, check_trace_dir

if TYPE_CHECKING:
    from vlforge.profile.report import ProfileReport


def check(options: ProfileOptions) -> None:
    """Every output path and the model reference, before torch and the model load (a typo costs < 1 s)."""
    from vlforge.models.refs import check_model_ref

    check_trace_dir(options)
    if options.plot is not None:
        from vlforge.outputs import check_output_file
        from vlforge.profile.render import require_matplotlib

        require_matplotlib()
        check_output_file(options.plot, flag="--plot")
        check_plot_format(options.plot)
    check_model_ref(options.model)


def run(options: ProfileOptions) -> ProfileReport:
    from vlforge.profile.render import plot
    from vlforge.profile.runner import run_profile

    report = run_profile(options)
    if options.plot is not None:
        plot(report, options.plot)
    return report


def render(options: ProfileOptions, report: ProfileReport, console: Any) -> None:
    from vlforge.profile.render import render as tables

    tables(report, console, per_block=options.per_block)


JOB: Job[ProfileOptions, ProfileReport] = Job(
    check=check, run=run, render=render, to_json=lambda report: report.model_dump_json(indent=2),
    exit_code=always_ok,
)
CLI = Cli(flags=ProfileOptions, job=JOB)
