"""Under ``--json`` stdout holds one JSON document and nothing else; stderr holds vlforge's own log lines, each
long step announced before it starts, and none of Hugging Face's raw progress bars."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DATASET = REPO / "examples" / "data" / "dataset.yaml"
HF_BARS = ("Loading weights", "Writing model shards", "it/s]")


def vlforge(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)  # the CLI must silence them by itself
    return subprocess.run([sys.executable, "-m", "vlforge.cli", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=cwd)


def assert_json_only(proc: subprocess.CompletedProcess, codes: tuple[int, ...] = (0,)) -> dict:
    assert proc.returncode in codes, proc.stderr[-3000:]
    document = json.loads(proc.stdout)  # raises when anything else is on stdout
    for bar in HF_BARS:
        assert bar not in proc.stderr, proc.stderr[-3000:]
    return document


def announced_before(stderr: str, start: str, end: str) -> bool:
    return start in stderr and end in stderr and stderr.index(start) < stderr.index(end)


def test_doctor_writes_a_preset_and_audits_tokens_visibly(tmp_path: Path) -> None:
    proc = vlforge("doctor", "--model", "tiny:qwen2_5_vl", "--no-bench", "--json",
                   env={"VLFORGE_CACHE_DIR": str(tmp_path / "cache")})
    report = assert_json_only(proc, codes=(0, 1, 2))
    assert "facts" in report or "findings" in report
    assert announced_before(proc.stderr, "writing the tiny qwen2_5_vl checkpoint", "wrote tiny qwen2_5_vl")
    assert announced_before(proc.stderr, "loading tiny:qwen2_5_vl ...", "loaded tiny:qwen2_5_vl")
    assert announced_before(proc.stderr, "checking the chat template's special tokens", ": audited (")


@pytest.fixture(scope="module")
def train_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("json-train")
    config = tmp / "run.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"dataset_path": str(DATASET)}, "processor": {"max_pixels": 12544},
        "model": {"load_from_pretrained_path": "tiny:qwen3_vl"},
        "training": {"max_steps": 1}, "checkpointing": {"output_dir": str(tmp / "out")}}))
    return tmp, vlforge("train", str(config), "--json", "--no-token-audit")


def test_train_json_summary_and_opt_out_of_the_token_audit(train_run) -> None:
    _tmp, proc = train_run
    summary = assert_json_only(proc)
    assert summary["steps"] == 1 and Path(summary["export_dir"]).is_dir()
    assert "tokens audit" not in proc.stderr  # --no-token-audit
    assert announced_before(proc.stderr, "exporting checkpoint-1", "exported ")
    for line in proc.stderr.splitlines():  # plain log lines in a pipe: never wrapped mid-message
        assert not line.startswith(" "), line


def test_extract_and_validate_json(train_run, tmp_path: Path) -> None:
    tmp, _ = train_run
    summary = assert_json_only(vlforge("extract", "--model", str(tmp / "out" / "final"), "--data", str(DATASET),
                                       "--out", str(tmp_path / "cache"), "--features", "vision_pooled",
                                       "--no-token-audit", "--json"))
    assert summary["complete"] is True
    resolved = assert_json_only(vlforge("validate", str(tmp / "run.yaml"), "--json"))
    assert resolved["ok"] is True
