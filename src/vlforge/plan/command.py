"""``vlforge plan`` as a :class:`~vlforge.command.Job`: peak memory per rank from the configs alone, exit 1 when
it does not fit.

Example (CPU, seconds):
    vlforge plan examples/qwen3_vl_tiny.yaml --gpus 8 --gpu-memory 80GB
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from vlforge.command import Cli, Job
from vlforge.config.validate import ConfigFlags, validated
from vlforge.errors import ExitCode
from vlforge.plan.options import check_layout, parse_memory

if TYPE_CHECKING:
    from vlforge.config.load import ResolvedConfig
    from vlforge.plan.report import PlanReport


class PlanFlags(ConfigFlags):
    """``vlforge plan CONFIG [key=value ...] [--gpus N] [--gpu-memory 80GB] ...``."""

    gpus: int = 1
    """GPUs (processes) per node."""
    nodes: int = 1
    """Nodes."""
    gpu_memory: str | None = None
    """Memory of one GPU, e.g. 80GB or 141GiB (default: this machine's CUDA device, else 80GB)."""
    seq_len: int | None = Field(None, ge=1)
    """Typical sample length in tokens (packing: samples per row; padded: the batch's length)."""
    label_share: float = Field(0.5, ge=0.0, le=1.0)
    """Share of tokens that are labels."""
    visual_share: float | None = Field(None, ge=0.0, le=1.0)
    """Share of tokens that are visual (default: one image or video at the limits per sample)."""


def from_flags(flags: PlanFlags, as_json: bool) -> PlanRun:
    """Sizes and process counts checked first (a typo costs no config read), then the config validated."""
    if flags.gpu_memory is not None:
        parse_memory(flags.gpu_memory)
    check_layout(flags.gpus, flags.nodes)
    return PlanRun(validated(flags.config, flags.overrides), gpus=flags.gpus, nodes=flags.nodes,
                   gpu_memory=flags.gpu_memory, seq_len=flags.seq_len, label_share=flags.label_share,
                   visual_share=flags.visual_share)


@dataclass(frozen=True)
class PlanRun:
    """A validated config and the layout to plan it for."""

    resolved: ResolvedConfig
    gpus: int = 1
    nodes: int = 1
    gpu_memory: str | None = None
    """Memory of one GPU (``80GB``, ``141GiB``); None: this machine's CUDA device, else 80 GB."""
    seq_len: int | None = None
    label_share: float = 0.5
    visual_share: float | None = None


def check(run: PlanRun) -> None:
    """Sizes, process counts and the model reference, before torch is imported."""
    from vlforge.config.preflight import check_model

    if run.gpu_memory is not None:
        parse_memory(run.gpu_memory)
    check_layout(run.gpus, run.nodes)
    check_model(run.resolved.config)


def plan(run: PlanRun) -> PlanReport:
    from vlforge.plan.report import make_plan

    memory = parse_memory(run.gpu_memory) if run.gpu_memory is not None else None
    return make_plan(run.resolved.config, gpus=run.gpus, nodes=run.nodes, gpu_memory=memory,
                     sample_length=run.seq_len, label_share=run.label_share, visual_share=run.visual_share)


def render(run: PlanRun, report: PlanReport, console: Any) -> None:
    from vlforge.plan.report import render as lines

    for line in lines(report):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


JOB: Job[PlanRun, PlanReport] = Job(
    check=check, run=plan, render=render, to_json=lambda report: json.dumps(report.to_dict(), indent=2),
    exit_code=lambda report: ExitCode.OK if report.fits else ExitCode.WARNING,
)
CLI = Cli(flags=PlanFlags, job=JOB, to_options=from_flags)
