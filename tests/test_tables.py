"""Report tables read well anywhere: whole on a pipe or in a log file, folded (never ``…``) in a narrow terminal."""

from __future__ import annotations

import doctest
import json
import os
import re
import subprocess
from io import StringIO

import pytest
from rich.console import Console
from rich.table import Table

import vlforge.tables
import warmstart
from vlforge.tables import print_table, report_console

NAME = "model.language_model.layers.27.self_attn.q_proj.lora_A.default"
NUMBERS = ("123,456.789", "0.000244140625", "1.19209e-06", "98.6%")
# A cell of a numeric column: a whole number as the renderers write them (1,234.5 / 1.2e-06 / 12% / 3.4x / -).
NUMBER = re.compile(r"^(-|>999%|[-+]?[\d,]*\.?\d+(e[-+]\d+)?[%x]?)$")


def wide_table() -> Table:
    table = Table("component", "calls", "ms", "±", "GFLOP/s", title="a wide table")
    table.add_column("flag", no_wrap=True)  # no_wrap would crop silently in a narrow terminal: it must fold
    for i in range(3):
        table.add_row(f"{NAME}.{i}", "1", *NUMBERS, "anomaly #1 4.0x")
    return table


def cells(text: str) -> list[list[str]]:
    """The body rows of rich tables in ``text``, as lists of stripped cells."""
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def tables(text: str) -> list[str]:
    """Each rich table in ``text`` (from its top border to its bottom border)."""
    return re.findall(r"^┏.*?^└[^\n]*$", text, re.M | re.S)


def test_the_module_docstring_example_runs() -> None:
    assert doctest.testmod(vlforge.tables, raise_on_error=True).attempted >= 1


def test_print_table_off_a_terminal_keeps_every_cell_whole() -> None:
    console = Console(file=StringIO(), width=80)  # a log file: not a terminal
    assert not console.is_terminal
    print_table(console, wide_table())
    text = console.file.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) > 80
    for row in cells(text):
        assert row[0].startswith(NAME) and row[2:6] == list(NUMBERS) and row[6] == "anomaly #1 4.0x"


def test_print_table_off_a_terminal_leaves_a_narrow_table_alone() -> None:
    console = Console(file=StringIO(), width=80)
    table = Table("a", "b")
    table.add_row("1", "2")
    print_table(console, table)
    assert console.file.getvalue().splitlines()[0] == "┏━━━┳━━━┓"


def test_print_table_in_a_narrow_terminal_folds_instead_of_cutting() -> None:
    console = Console(file=StringIO(), width=60, force_terminal=True, color_system=None)
    print_table(console, wide_table())
    text = console.file.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 60
    rows = cells(text)
    # Each cell's pieces, read down its column, give the whole value back.
    first_cells = "".join(row[0] for row in rows)
    assert all(f"{NAME}.{i}" in first_cells for i in range(3))
    assert "".join(row[2] for row in rows).count("123,456.789") == 3


def test_report_console_does_not_wrap_text_lines_off_a_terminal() -> None:
    console = report_console(file=StringIO(), width=40)
    console.print("vision tower model.visual (bfloat16): pooled cosine per sample 1.000000; max |Δ| 0")
    assert console.file.getvalue().count("\n") == 1


# --- real commands through a pipe -----------------------------------------------------------------------------


def run_cli(*args: str) -> str:
    # stdout is a pipe (capture_output), as in `vlforge ... | tee log`
    proc = subprocess.run([warmstart.python(), "-m", "vlforge.cli", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "80", "OMP_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


PROFILE = ["profile", "--model", "tiny:qwen3_vl", "--repeats", "1", "--warmup", "1", "--compare", "stock,patched"]
VERIFY = ["verify", "--model", "tiny:qwen3_vl", "--generate", "0"]


@pytest.fixture(scope="module")
def profile_runs() -> tuple[str, dict]:
    return run_cli(*PROFILE), json.loads(run_cli(*PROFILE, "--json"))


@pytest.fixture(scope="module")
def verify_runs() -> tuple[str, dict]:
    return run_cli(*VERIFY), json.loads(run_cli(*VERIFY, "--json"))


def test_profile_tables_through_a_pipe(profile_runs) -> None:
    text, report = profile_runs
    assert "…" not in text
    found = tables(text)
    assert len(found) == len(report["runs"]) + len(report["comparisons"])
    for run, table in zip(report["runs"], found, strict=False):
        rows = {row[0]: row for row in cells(table) if row[0]}
        for component in run["components"]:
            row = rows[component["name"]]  # the full name, verbatim, as the first cell
            assert row[1] == str(component["calls"])
            gflop = f"{component['flops'] / 1e9:,.3f}" if component["flops"] else "-"
            assert row[5] == gflop  # FLOPs do not change between the two runs
    # Every numeric cell of every table (run tables and the stock/patched comparison) is a whole number.
    numeric = [cell for row in cells(text) for cell in row[1:] if cell and not cell.startswith("anomaly")]
    assert numeric and all(NUMBER.match(cell) for cell in numeric), [c for c in numeric if not NUMBER.match(c)]
    comparison = report["comparisons"][0]
    assert f"{comparison['baseline']} vs {comparison['candidate']}" in text
    compared = {row[0] for row in cells(found[-1])}
    assert all(row["name"] in compared or f"Σ {row['name']}" in compared for row in comparison["rows"])


def test_verify_tables_through_a_pipe(verify_runs) -> None:
    text, report = verify_runs
    assert "…" not in text
    body = cells(text)
    [layer] = report["layers"]
    layer_row = next(row for row in body if row[0] == layer["name"])
    assert layer_row[1:] == ["x".join(map(str, layer["input_shape"])), f"{layer['fp32_max_abs_diff']:.3g}",
                             f"{layer['fp32_mean_abs_diff']:.3g}", f"{layer['bf16_cosine']:.7f}",
                             f"{layer['bf16_max_abs_diff']:.3g}"]
    for row in report["honesty"]:
        where = row["level"] if not row["module"] else f"{row['level']} {row['module']}"
        assert [where, row["variant"], row["reference"], f"{row['max_abs']:.3g}",
                f"{row['relative_rms']:.3g}"] in body
    for check in report["checks"]:
        assert [check["name"], f"{check['value']:.6g}", f"{check['op']} {check['threshold']:g}", check["where"],
                "pass" if check["passed"] else "FAIL"] in body
    # The text lines are single lines too: the tower line keeps its last number with its label.
    assert re.search(r"^vision tower model\.visual .*max \|Δ\| [\d.e+-]+$", text, re.M)
