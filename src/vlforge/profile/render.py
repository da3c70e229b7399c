"""Show a :class:`ProfileReport`: rich tables for the terminal, a bar chart with matplotlib.

Example:
    >>> from rich.console import Console
    >>> from vlforge.profile.render import render
    >>> render(report, Console())  # doctest: +SKIP
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vlforge.errors import VlforgeError
from vlforge.outputs import atomic_write_bytes
from vlforge.profile.options import PLOT_FORMATS, check_plot_format
from vlforge.profile.report import Comparison, ProfileReport, RunProfile
from vlforge.tables import print_table

logger = logging.getLogger(__name__)

_TOTALS = ("vision.blocks", "vision", "text.layers", "text")


def _ms(value: float) -> str:
    return f"{value:,.3f}" if value < 10 else f"{value:,.1f}"


def _spread(pct: float) -> str:
    return f"{pct:.0f}%" if pct < 1000 else ">999%"


def _gflop(flops: int) -> str:
    return f"{flops / 1e9:,.3f}" if flops else "-"


def _rate(value: float | None) -> str:
    return f"{value:,.1f}" if value is not None else "-"


def _collapsed(name: str) -> bool:
    return name.startswith(("vision.block.", "text.layer."))


def run_table(report: ProfileReport, run: RunProfile, *, per_block: bool = True) -> Table:
    """One run's components (exclusive time; shares sum to 100%) followed by the totals."""
    title = (f"{run.variant} · attn={run.attn} · batch={run.batch_size} · forward {_ms(run.forward.median_ms)} ms "
             f"(processor {_ms(run.processor.median_ms)} ms, host→device {_ms(run.host_to_device.median_ms)} ms)")
    table = Table(title=title, title_justify="left")
    table.add_column("component", no_wrap=True)
    for header in ("calls", "ms", "±", "time%", "GFLOP", "FLOP%", "GFLOP/s"):
        table.add_column(header, justify="right")
    table.add_column("flag", no_wrap=True)
    for component in run.components:
        if not per_block and _collapsed(component.name) and not component.anomaly:
            continue
        flag = ""
        if component.anomaly:
            rank = run.anomalies.index(component.name) + 1
            ratio = component.time_to_flop_ratio
            flag = f"[bold red]anomaly #{rank}[/] {'no FLOPs' if ratio is None else f'{ratio:.1f}x'}"
        table.add_row(component.name, str(component.calls), _ms(component.time.median_ms),
                      _spread(component.time.spread_pct), f"{component.share_pct:.1f}",
                      _gflop(component.flops), f"{component.flop_share_pct:.1f}", _rate(component.gflops_per_s), flag)
    table.add_section()
    for total in run.totals:
        table.add_row(f"[italic]Σ {total.name} ({total.members})[/]", "", _ms(total.time.median_ms),
                      _spread(total.time.spread_pct), f"{total.share_pct:.1f}", _gflop(total.flops),
                      f"{total.flop_share_pct:.1f}", _rate(total.gflops_per_s), "")
    return table


def _times(ratio: float) -> str:
    """``2.31x``; a ratio below 0.01 keeps one significant digit instead of reading ``0.00x``."""
    return f"{ratio:.2f}x" if ratio >= 0.01 else f"{ratio:.1g}x"


def compare_table(comparison: Comparison, *, per_block: bool = True) -> Table:
    """``baseline / candidate`` per component; above 1 means the candidate is faster."""
    ratio = comparison.forward_ratio
    title = (f"{comparison.baseline} vs {comparison.candidate} · attn={comparison.attn} · "
             f"batch={comparison.batch_size} · forward ratio {_times(ratio)}" if ratio else "")
    table = Table(title=title, title_justify="left")
    table.add_column("component", no_wrap=True)
    table.add_column(f"{comparison.baseline} ms", justify="right")
    table.add_column(f"{comparison.candidate} ms", justify="right")
    table.add_column("ratio", justify="right")
    for row in comparison.rows:
        if not per_block and _collapsed(row.name):
            continue
        text = "-" if row.ratio is None else _times(row.ratio)
        if row.ratio is not None and row.ratio >= 1.5:
            text = f"[bold green]{text}[/]"
        name = f"Σ {row.name}" if row.name in _TOTALS else row.name
        table.add_row(name, _ms(row.baseline_ms), _ms(row.candidate_ms), text)
    return table


def render(report: ProfileReport, console: Console, *, per_block: bool = True) -> None:
    """Print the header, one table per run and one per comparison (whole on a pipe: :mod:`vlforge.tables`)."""
    console.print(f"[bold]vlforge profile[/] {escape(report.model)} ({report.family}) · {report.input} · "
                  f"pixel_values {report.pixel_values_shape} · {report.sequence_length} tokens · {report.dtype} on "
                  f"{report.device} ({report.threads} threads) · warmup {report.warmup}, repeats {report.repeats}")
    console.print("[dim]time % is exclusive time (module without hooked children); component rows sum to 100% of "
                  f"the forward. anomaly: time % ≥ {report.anomaly_min_share:g} and > {report.anomaly_ratio:g}x "
                  "FLOP %.[/]")
    for attn, why in report.skipped_attn.items():
        console.print(f"[yellow]skipped attn={attn}: {escape(why)}[/]")
    for run in report.runs:
        print_table(console, run_table(report, run, per_block=per_block))
        if run.anomalies:
            console.print(f"top anomaly: [bold]{run.anomalies[0]}[/]")
        if run.trace:
            console.print(f"trace: {run.trace}", markup=False)
    for comparison in report.comparisons:
        print_table(console, compare_table(comparison, per_block=per_block))


def require_matplotlib() -> Any:
    """The matplotlib module, or one clear error naming the extra to install."""
    try:
        import matplotlib
    except ImportError as error:
        raise VlforgeError("--plot needs matplotlib: pip install 'vlforge[plot]'") from error
    return matplotlib


def plot(report: ProfileReport, path: Path) -> Path:
    """Horizontal bars of median exclusive time per component (blocks and layers as totals), per run."""
    check_plot_format(path)
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = sorted({(run.attn, run.batch_size) for run in report.runs}, key=str)
    figure, axes = plt.subplots(len(configs), 1, figsize=(9, 1 + 4 * len(configs)), squeeze=False)
    for axis, (attn, batch) in zip(axes[:, 0], configs, strict=True):
        runs = [run for run in report.runs if (run.attn, run.batch_size) == (attn, batch)]
        names = [c.name for c in runs[0].components if not _collapsed(c.name)]
        totals = [t.name for t in runs[0].totals if t.name in ("vision.blocks", "text.layers")]
        height = 0.8 / len(runs)
        for offset, run in enumerate(runs):
            values = {c.name: c.time.median_ms for c in run.components}
            values.update({t.name: t.time.median_ms for t in run.totals})
            axis.barh([i + offset * height for i in range(len(names) + len(totals))],
                      [values[n] for n in names + totals], height=height, label=run.variant)
        labels = names + [f"Σ {name}" for name in totals]
        axis.set_yticks([i + 0.4 - height / 2 for i in range(len(labels))], labels)
        axis.invert_yaxis()
        axis.set_xlabel("median exclusive time (ms)")
        axis.set_title(f"{report.family} · {report.input} · attn={attn} · batch={batch} · {report.dtype}")
        axis.legend()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format=PLOT_FORMATS[path.suffix.lower()], dpi=110)
    plt.close(figure)
    written = atomic_write_bytes(path, buffer.getvalue(), writer="profile")
    logger.info("wrote the plot %s", written)
    return written
