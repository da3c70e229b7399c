"""Reports read well in a pipe or log file: no cell cut to ``…``, every component name whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rich.table import Table

from vlforge.tables import report_console


def vlforge(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "vlforge.cli", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return proc


def test_report_console_never_truncates_off_a_terminal() -> None:
    table = Table("component", "ms")
    table.add_row("model.language_model.layers.0.self_attn.q_proj", "123456.789")
    console = report_console(force_terminal=False)
    with console.capture() as captured:
        console.print(table)
    assert "…" not in captured.get() and "model.language_model.layers.0.self_attn.q_proj" in captured.get()
    assert "123456.789" in captured.get()


def test_profile_and_verify_tables_through_a_pipe() -> None:
    args = ["profile", "--model", "tiny:qwen3_vl", "--repeats", "1", "--compare", "stock,patched"]
    text = vlforge(*args).stdout
    report = json.loads(vlforge(*args, "--json").stdout)
    assert "…" not in text
    names = {c["name"] for run in report["runs"] for c in run["components"]}
    assert names and all(name in text for name in names)
    verify = vlforge("verify", "--model", "tiny:qwen3_vl", "--generate", "0").stdout
    assert "…" not in verify and "model.visual.patch_embed.proj" in verify
