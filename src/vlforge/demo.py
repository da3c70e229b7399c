"""``vlforge demo``: a tiny Qwen3-VL through every vlforge job, with measured numbers from this machine.

Doctor, patch, profile compare, verify, the real-shape speed table, a short training run and a
feature extraction of the bundled dataset. Run (CPU, two to three minutes):
    vlforge demo
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import vlforge
from vlforge.command import Cli, Job, always_ok
from vlforge.diagnosis import report as doctor_report
from vlforge.diagnosis.bench import measure_conv
from vlforge.diagnosis.rules import Measurement
from vlforge.doctor import render as render_doctor
from vlforge.errors import VlforgeError
from vlforge.profile import ProfileOptions, compare_table, run_profile
from vlforge.strict import StrictModel
from vlforge.tables import print_table
from vlforge.verify import VerifyOptions, run_verify

logger = logging.getLogger(__name__)

QWEN3_VL_WINDOWS = 6080
"""Patch windows of one 8-frame Qwen3-VL clip in the seed report (3x2x16x16 -> 1024)."""


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Silence a logger's INFO lines (the demo toggles patches many times)."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def speed_rows(seconds: float = 20.0) -> list[Measurement]:
    """Stock Conv3d vs the GEMM path at the Qwen3-VL shape, fp32 and bf16, forward and forward+backward."""
    conv = torch.nn.Conv3d(3, 1024, kernel_size=(2, 16, 16), stride=(2, 16, 16))
    return [
        measure_conv(conv, QWEN3_VL_WINDOWS, dtype=dtype, seconds=seconds / 2)
        for dtype in (torch.float32, torch.bfloat16)
    ]


def examples_dir() -> Path | None:
    """The repository's ``examples/`` (source checkout or editable install), or None when absent."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        candidate = root / "examples"
        if (candidate / "data" / "data.yaml").is_file():
            return candidate
    return None


def extract_step(console: Console, loaded, examples: Path, out: Path) -> None:
    """Extract features of the bundled dataset into ``out`` and read one sample back."""
    from vlforge.extract import open_cache, run_extract

    summary = run_extract(model=loaded.source, data=str(examples / "data" / "data.yaml"), out=out,
                          features=["vision_pooled", "hidden_mean"], loaded=loaded)
    cache = open_cache(out)
    first = cache[0]
    shapes = ", ".join(f"{name} {tuple(value.shape)}" for name, value in sorted(first.items())
                       if hasattr(value, "shape"))
    skipped = sum(summary.skipped.values())
    console.print(f"extracted {len(cache)} samples into {summary.shards_total} shard(s) at "
                  f"{summary.samples_per_second:.1f} samples/s, {skipped} skipped; read back sample 0: {shapes}",
                  highlight=False)


def train_step(console: Console, examples: Path, out: Path) -> None:
    """Train the tiny model with ``examples/qwen3_vl_tiny.yaml`` (packed, 30 steps) and show the loss."""
    from vlforge.train.trainer import run as train

    result = train(examples / "qwen3_vl_tiny.yaml", [f"checkpointing.output_dir={out}"],
                   base_dir=str(examples.parent), progress=console.is_terminal)
    losses = ", ".join(f"{loss:.2f}" for loss in result.losses)
    console.print(f"trained {result.steps} steps; logged losses: {losses}; exported to {result.export_dir}",
                  highlight=False)
    if len(result.losses) >= 2 and not result.losses[-1] < result.losses[0]:
        raise VlforgeError(f"demo: the training loss did not fall ({losses})")


def run(console: Console, seconds: float = 20.0) -> None:
    """Run the demo, printing rich tables; raises VlforgeError when an equivalence check fails."""
    from transformers.utils import logging as hf_logging

    from vlforge.models import load

    hf_logging.disable_progress_bar()  # weight-loading bars of tiny models are noise here
    console.rule("[bold]vlforge demo")
    console.print(
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
        f"device {'cuda' if torch.cuda.is_available() else 'cpu'}"
    )
    loaded = load("tiny:qwen3_vl")
    console.print(f"model: tiny Qwen3-VL from {loaded.path}")

    console.rule("[bold]1. vlforge doctor: this machine and the stock model")
    render_doctor(doctor_report(loaded, bench=True, bench_seconds=min(seconds, 6.0)), console)

    console.rule("[bold]2. vlforge.patch(model)")
    report = vlforge.patch(loaded.model)
    table = Table(title="Patched convolutions (now one GEMM each)")
    for column in ("module", "conv", "kernel", "K -> out", "precision"):
        table.add_column(column)
    for entry in report.patched:
        table.add_row(entry.name, entry.conv, "x".join(map(str, entry.kernel)),
                      f"{entry.in_features} -> {entry.out_features}", entry.precision)
    print_table(console, table)

    console.rule("[bold]3. vlforge profile --compare stock,patched")
    with _quiet("vlforge.patches"):
        profile = run_profile(
            ProfileOptions(model=loaded.source, synthetic="2x224x224", compare=["stock", "patched"], warmup=2,
                           repeats=5),
            loaded=loaded,
        )
    for comparison in profile.comparisons:
        print_table(console, compare_table(comparison, per_block=False))

    console.rule("[bold]4. vlforge verify: stock vs patched on the same weights and inputs")
    with _quiet("vlforge.patches"):
        verdict = run_verify(VerifyOptions(model=loaded.source, synthetic="2x224x224", generate_tokens=4),
                             loaded=loaded)
    console.print(verdict.verdict(), style="green" if verdict.passed else "red")

    console.rule("[bold]5. The real Qwen3-VL patch shape on this machine")
    with _quiet("vlforge.patches"):
        rows = speed_rows(seconds=seconds)
    table = Table(title=f"Speed here: {QWEN3_VL_WINDOWS} windows of 3x2x16x16 -> 1024 (one 8-frame Qwen3-VL clip)")
    for column in ("dtype", "pass", "stock Conv3d ms", "vlforge GEMM ms", "speed-up"):
        table.add_column(column, justify="right")
    for row in rows:
        for label, times, ratio, repeats in (("forward", row.forward_ms, row.ratio_forward, row.repeats),
                                             ("fwd+bwd", row.train_ms or {}, row.ratio_train, row.train_repeats)):
            if times:  # within the budget a figure may be one call's time, or not measured (row.note says)
                figures = [("not measured" if k not in times else f"{times[k]:.1f}" + (" (1 call)" if not repeats else ""))
                           for k in ("conv", "gemm")]
                table.add_row(row.dtype, label, *figures, "-" if ratio is None else f"{ratio:.1f}x")
    print_table(console, table)
    for row in rows:
        if row.note:
            console.print(f"[yellow]{row.dtype}: {escape(row.note)}[/]")

    examples = examples_dir()
    if examples is None:
        logger.warning("examples/ not found (run the demo from a vlforge checkout): training and "
                       "extraction steps skipped")
    else:
        with tempfile.TemporaryDirectory(prefix="vlforge-demo-") as tmp:
            console.rule("[bold]6. vlforge train examples/qwen3_vl_tiny.yaml (FSDP2 engine, packed rows)")
            train_step(console, examples, Path(tmp) / "train")
            console.rule("[bold]7. vlforge extract: feature cache of the bundled dataset, one sample read back")
            extract_step(console, loaded, examples, Path(tmp) / "features")

    if not verdict.passed:
        raise VlforgeError(f"demo: {verdict.verdict()}")
    console.print("[bold green]demo finished: the patched model is equivalent and its speed was measured above")


class DemoRequest(StrictModel):
    """``vlforge demo [--seconds S]``."""

    unknown_label: ClassVar[str] = "option"
    seconds: float = 20.0
    """Time budget for the speed measurement."""


def _run_request(request: DemoRequest) -> None:
    from vlforge.tables import report_console

    run(report_console(), seconds=request.seconds)  # the demo shows each step as it runs


JOB: Job[DemoRequest, None] = Job(check=lambda request: None, run=_run_request, render=lambda request, report, c: None,
                                  to_json=lambda report: "{}", exit_code=always_ok)
CLI = Cli(flags=DemoRequest, job=JOB, json=False)
