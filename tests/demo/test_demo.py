"""`vlforge demo` end to end, as `make demo` runs it (slow: about two minutes on 2 cores)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

import warmstart

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_runs_every_step_and_reports_measured_numbers() -> None:
    result = subprocess.run(
        [warmstart.python(), "-m", "vlforge.cli", "demo", "--seconds", "4"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "160"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    for step in ("1. vlforge doctor", "2. vlforge.patch", "3. vlforge profile", "4. vlforge verify",
                 "5. The real Qwen3-VL patch shape", "6. vlforge train", "7. vlforge extract"):
        assert step in output, f"demo step missing: {step}"
    assert "model.visual.patch_embed.proj" in output
    assert re.search(r"PASS: patch layer fp32 max \|diff\| [0-9.e-]+", output)
    speedups = [float(x) for x in re.findall(r"│\s+([0-9.]+)x\s+│", output)]
    assert len(speedups) >= 4 and all(s > 0 for s in speedups)
    losses = [float(x) for x in re.search(r"logged losses: ([0-9., ]+);", output).group(1).split(", ")]
    assert losses[-1] < losses[0]
    assert re.search(r"extracted 10 samples into \d+ shard\(s\)", output)
    assert "demo finished" in output
