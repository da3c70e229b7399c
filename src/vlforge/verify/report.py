"""The verify report (pydantic, ``--json`` prints it) and its rich rendering.

Example:
    >>> from vlforge.verify.report import Check
    >>> Check(name="patch_layer.bf16_cosine", value=0.9999, op=">", threshold=0.999, where="conv",
    ...       passed=True).describe()
    'patch_layer.bf16_cosine = 0.9999 (> 0.999) at conv'
"""

from __future__ import annotations

from pydantic import ConfigDict
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vlforge.strict import StrictModel
from vlforge.tables import print_table


class _Strict(StrictModel):
    """Report fields: unknown keys are errors when a report is read back; measured values may be inf."""

    model_config = ConfigDict(allow_inf_nan=True)


class LayerResult(_Strict):
    """One patchable convolution, stock vs patched on copies, for its real input."""

    name: str
    input_shape: list[int]
    kernel: list[int]
    fp32_max_abs_diff: float
    fp32_mean_abs_diff: float
    bf16_cosine: float
    bf16_max_abs_diff: float


class TowerResult(_Strict):
    module: str
    output_shape: list[int]
    pooled_cosines: list[float]
    """Per sample: cosine of the mean over that sample's output rows, stock vs patched."""
    min_pooled_cosine: float
    max_abs_diff: float


class EndToEnd(_Strict):
    kl_mean: float
    """Mean over positions of KL(stock || patched) of the next-token distributions."""
    kl_max: float
    top1: float
    """Fraction of positions whose argmax token agrees."""
    top5: float
    """Fraction of positions whose five highest tokens are the same set."""
    positions: int
    generated_tokens: int
    generation_identical: bool
    first_divergence: int | None


class HonestyRow(_Strict):
    """Error of one low-precision computation against a high-precision one of the same weights and input."""

    level: str
    module: str
    variant: str
    reference: str
    max_abs: float
    relative_rms: float


class Check(_Strict):
    name: str
    value: float
    op: str
    threshold: float
    where: str
    passed: bool

    def describe(self) -> str:
        return f"{self.name} = {self.value:.6g} ({self.op} {self.threshold:g}) at {self.where or '<root>'}"


class VerifyReport(_Strict):
    model: str
    family: str
    device: str
    dtype: str
    precision: str
    attn: str
    input: str
    batch_size: int
    layers: list[LayerResult]
    tower: TowerResult
    end_to_end: EndToEnd
    honesty: list[HonestyRow]
    checks: list[Check]
    failed: list[str]
    passed: bool

    def verdict(self) -> str:
        """One line: PASS with the three published numbers, or FAIL naming each failed check."""
        if not self.passed:
            return "FAIL: " + "; ".join(c.describe() for c in self.checks if not c.passed)
        layer32 = max(layer.fp32_max_abs_diff for layer in self.layers)
        layer16 = min(layer.bf16_cosine for layer in self.layers)
        return (f"PASS: patch layer fp32 max |diff| {layer32:.2g}, bf16 cosine {layer16:.6f}, "
                f"tower pooled cosine {self.tower.min_pooled_cosine:.6f}")


def render(report: VerifyReport, console: Console) -> None:
    """Tables for the layer, tower, end-to-end and precision sections, then the verdict."""
    console.print(f"[bold]vlforge verify[/] {escape(report.model)} ({report.family}) · {report.input} · batch "
                  f"{report.batch_size} · {report.dtype} on {report.device} · patched precision {report.precision}")
    layers = Table(title="patch layer (copies of each convolution, its real input)", title_justify="left")
    for header in ("module", "input", "fp32 max |Δ|", "fp32 mean |Δ|", "bf16 cosine", "bf16 max |Δ|"):
        layers.add_column(header, justify="left" if header in ("module", "input") else "right")
    for layer in report.layers:
        layers.add_row(layer.name, "x".join(map(str, layer.input_shape)), f"{layer.fp32_max_abs_diff:.3g}",
                       f"{layer.fp32_mean_abs_diff:.3g}", f"{layer.bf16_cosine:.7f}", f"{layer.bf16_max_abs_diff:.3g}")
    print_table(console, layers)
    tower, e2e = report.tower, report.end_to_end
    console.print(f"vision tower [cyan]{tower.module}[/] ({report.dtype}): pooled cosine per sample "
                  + ", ".join(f"{c:.6f}" for c in tower.pooled_cosines) + f"; max |Δ| {tower.max_abs_diff:.3g}")
    generation = ("no generation" if not e2e.generated_tokens else
                  f"greedy {e2e.generated_tokens} tokens "
                  + ("identical" if e2e.generation_identical else f"DIFFER from token {e2e.first_divergence}"))
    console.print(f"end to end ({e2e.positions} positions): KL mean {e2e.kl_mean:.3g} max {e2e.kl_max:.3g} · "
                  f"top-1 {100 * e2e.top1:.1f}% · top-5 {100 * e2e.top5:.1f}% · {generation}")
    if report.honesty:
        honesty = Table(title="precision honesty: error against a high-precision computation of the same "
                              "weights and input (lower is better)", title_justify="left")
        for header in ("level", "variant", "reference", "max |err|", "relative RMS"):
            honesty.add_column(header, justify="right" if "err" in header or "RMS" in header else "left")
        for row in report.honesty:
            where = row.level if not row.module else f"{row.level} {row.module}"
            honesty.add_row(where, row.variant, row.reference, f"{row.max_abs:.3g}", f"{row.relative_rms:.3g}")
        print_table(console, honesty)
    checks = Table(title="checks", title_justify="left")
    for header in ("check", "value", "threshold", "at", "result"):
        checks.add_column(header)
    for check in report.checks:
        result = "[bold green]pass[/]" if check.passed else "[bold red]FAIL[/]"
        checks.add_row(check.name, f"{check.value:.6g}", f"{check.op} {check.threshold:g}", check.where, result)
    print_table(console, checks)
    colour = "green" if report.passed else "red"
    console.print(f"[bold {colour}]verdict: {report.verdict()}[/]")
