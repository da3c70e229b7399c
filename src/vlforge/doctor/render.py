"""Rich rendering of a :class:`~vlforge.diagnosis.report.DoctorReport` (the CLI's and the demo's view).

Example:
    >>> from rich.console import Console
    >>> from vlforge.doctor import render
    >>> from vlforge.diagnosis import report
    >>> render(report(assume="device=cpu,threads=1"), Console(file=None, width=120))  # doctest: +SKIP
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vlforge.diagnosis.report import DoctorReport
from vlforge.tables import print_table

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_SHOWN_FACTS = (
    "torch", "torch_cuda", "cudnn", "device", "gpu_name", "capability", "bf16_supported", "tf32_matmul",
    "dtype", "attn_implementation", "memory_format", "cpu_threads", "transformers", "flash_attn",
    "liger_kernel", "peft", "av", "python", "os",
)


def facts_table(rep: DoctorReport) -> Table:
    table = Table(title="facts", show_header=True, header_style="bold")
    table.add_column("fact")
    table.add_column("value")
    for name in _SHOWN_FACTS:
        value = rep.facts.display(name)
        if name == "memory_format" and value == "absent" and name not in rep.facts.assumed:
            continue
        mark = " [magenta](assumed)[/]" if name in rep.facts.assumed else ""
        style = "dim" if value == "absent" else ""
        table.add_row(name, f"[{style}]{value}[/]{mark}" if style else f"{value}{mark}")
    return table


def findings_table(rep: DoctorReport) -> Table:
    table = Table(title="findings", show_header=True, header_style="bold", show_lines=True)
    for column in ("fact", "finding", "severity", "cost", "fix"):
        table.add_column(column, overflow="fold")
    for f in rep.findings:
        facts = ", ".join(f"{k}={v}" for k, v in f.facts.items())
        source = f.source.split(" ")[0].rstrip(",;")
        # Messages and fixes quote user text (paths, tags such as '[INST]'): printed literally.
        table.add_row(escape(facts), f"{escape(f.message)}\n[dim]{f.rule} | {escape(source)}[/]",
                      f"[{_STYLE[f.severity]}]{f.severity}[/]", escape(f.cost or "-"), escape(f.fix))
    return table


def _ms(times: dict[str, float] | None, name: str, single: bool) -> str:
    if times is None:
        return "-"
    if name not in times:
        return "[yellow]not measured[/]"
    return f"{times[name]:.3g}" + (" [yellow](1 call)[/]" if single else "")


def measurements_table(rep: DoctorReport) -> Table:
    table = Table(title="measurement (median ms per call)", show_header=True, header_style="bold")
    for column in ("convs", "shape", "fwd conv", "fwd GEMM", "fwd+bwd conv", "fwd+bwd GEMM", "ratio"):
        table.add_column(column, overflow="fold")
    for m in rep.measurements:
        shape = f"{m.windows}x{m.in_channels}x{'x'.join(map(str, m.kernel))} -> {m.out_channels} {m.dtype} {m.device}"
        fwd_single, train_single = m.repeats == 0, m.train_repeats == 0
        ratios = " / ".join(f"{r:.2f}x" for r in (m.ratio_forward, m.ratio_train) if r is not None) or "-"
        table.add_row(", ".join(m.convs), shape, _ms(m.forward_ms, "conv", fwd_single),
                      _ms(m.forward_ms, "gemm", fwd_single), _ms(m.train_ms, "conv", train_single),
                      _ms(m.train_ms, "gemm", train_single), ratios)
    return table


def render(rep: DoctorReport, console: Console) -> None:
    """Print facts, measurements and findings tables, then the verdict line."""
    print_table(console, facts_table(rep))
    if rep.model is not None:
        convs = [c for c in rep.model.convs if c.weight_ndim == 5 or c.patchable]
        console.print(f"model: {escape(rep.model_source or rep.model.model_type or 'in memory')} "
                      f"({rep.model.model_type or 'unknown type'}), {len(convs)} patch-like conv(s)")
    if rep.measurements:
        print_table(console, measurements_table(rep))
        for m in rep.measurements:
            if m.note:
                console.print(f"[yellow]partial measurement of {', '.join(m.convs)}: {escape(m.note)}[/] (figures "
                              "marked '1 call' are one call's time; a ratio needs both figures of its pass)")
    elif rep.bench.status == "skipped":
        console.print(f"[dim]measurement skipped: {escape(rep.bench.reason or '')}[/]")
    if rep.findings:
        print_table(console, findings_table(rep))
    style = {"ok": "bold green", "warning": "bold yellow", "error": "bold red"}[rep.verdict]
    counts = {s: sum(f.severity == s for f in rep.findings) for s in ("error", "warning", "info")}
    console.print(f"[{style}]doctor: {rep.verdict}[/] ({counts['error']} error(s), {counts['warning']} "
                  f"warning(s), {counts['info']} info) exit code {rep.exit_code}")
