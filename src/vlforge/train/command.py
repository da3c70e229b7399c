"""``vlforge train`` (and ``torchrun -m vlforge.train``) as a :class:`~vlforge.command.Job`.

The config is read and validated once, when the CLI builds the options (:func:`vlforge.config.validate.check`);
the checks before work look at the output directory and the model reference; the run trains; the report is the
summary (steps, losses, the checkpoint and export, skipped samples).

Example (CPU, about a minute):
    vlforge train examples/qwen3_vl_tiny.yaml training.max_steps=10
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from vlforge.command import Cli, Job, always_ok
from vlforge.config.validate import ConfigFlags, validated
from vlforge.flags import Flag

if TYPE_CHECKING:
    from vlforge.config.load import ResolvedConfig
    from vlforge.train.trainer import RunResult


class TrainFlags(ConfigFlags):
    """``vlforge train CONFIG [key=value ...]``."""

    token_audit: Annotated[bool, Flag(negatable=True)] = True
    """Audit the chat template's special tokens at start-up (model.token_audit)."""


def from_flags(flags: TrainFlags, as_json: bool) -> TrainRun:
    """The config read and validated once, before torch and the model load; a progress bar on rank 0 in a
    terminal without ``--json``."""
    settings = [*flags.overrides, *([] if flags.token_audit else ["model.token_audit=false"])]
    progress = not as_json and sys.stderr.isatty() and int(os.environ.get("RANK", "0")) == 0
    return TrainRun(validated(flags.config, settings), progress=progress)


@dataclass(frozen=True)
class TrainRun:
    """A validated config and whether this process draws a progress bar."""

    resolved: ResolvedConfig
    progress: bool = False


def check(run: TrainRun) -> None:
    """Output directory and model reference, before torch and the model load."""
    from vlforge.config import preflight

    preflight.check_outputs(run.resolved.config)
    preflight.check_model(run.resolved.config)


def train(run: TrainRun) -> RunResult:
    from vlforge.train.trainer import run as run_training

    return run_training(run.resolved.config, progress=run.progress)


def summary(result: RunResult) -> dict[str, Any]:
    """The run's outcome as plain data (``--json``)."""
    return {"output_dir": str(result.output_dir), "steps": result.steps, "losses": result.losses,
            "eval_losses": result.eval_losses, "checkpoint": str(result.checkpoint) if result.checkpoint else None,
            "export_dir": str(result.export_dir) if result.export_dir else None,
            "resumed_from": str(result.resumed_from) if result.resumed_from else None, "start_step": result.start_step,
            "data": {k: result.data_report.get(k) for k in ("samples_seen", "skipped_total", "skipped_share",
                                                              "skipped", "nonfinite_steps")}}


def render(run: TrainRun, result: RunResult, console: Any) -> None:
    data = result.data_report
    skipped = (f"skipped {data['skipped_total']} of {data['samples_seen']} samples ({data['skipped_share']:.1%}: "
               + ", ".join(f"{k}={v}" for k, v in data["skipped"].items())
               + f"; {result.output_dir}/data_report.json)" if data.get("skipped_total") else "no sample skipped")
    unapplied = data.get("nonfinite_steps")
    skipped += f"; {unapplied} step(s) not applied: not finite ({result.output_dir}/data_report.json)" if unapplied else ""
    trained = result.steps - result.start_step
    if result.resumed_from is None:
        done = f"trained {result.steps} steps"
    elif trained:
        done = f"trained {trained} steps ({result.start_step + 1}-{result.steps}, resumed from {result.resumed_from})"
    else:  # the same command again after the run ended: say so, not "trained N steps"
        done = (f"nothing left to train: {result.resumed_from} is at the run's last step ({result.steps}); raise "
                "training.max_steps or choose another output_dir to train more")
    console.print(f"{done}; final model: {result.export_dir}; {skipped}", highlight=False, soft_wrap=True)


JOB: Job[TrainRun, RunResult] = Job(
    check=check, run=train, render=render, to_json=lambda result: json.dumps(summary(result), indent=2),
    exit_code=always_ok,
)
CLI = Cli(flags=TrainFlags, job=JOB, to_options=from_flags)
