"""`vlforge tokens scan` end to end on LMs trained for real: JSON, --top, --verify (batched), bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from vlforge.cli import app
from vlforge.tokens.scan import ScanOptions, run_scan
from vlforge.vocab.detect import UNTRAINED
from vlforge.vocab.verify import repeat_probabilities_with

runner = CliRunner()


def _scan_json(*args: str) -> dict:
    result = runner.invoke(app, ["tokens", "scan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("which", ["lm_untied", "lm_tied"])
def test_scan_finds_the_never_used_ids(which, request):
    lm = request.getfixturevalue(which)
    report = _scan_json("--model", str(lm.path))
    assert report["schema_version"] == "vlforge.tokens.scan/1"
    assert sum(report["counts"].values()) == lm.tokenizer_len
    assert report["weights"]["tied"] == (which == "lm_tied")
    flagged = {r["id"] for r in report["flagged"] if r["verdict"] == UNTRAINED}
    assert report["counts"]["untrained"] == len(flagged) == report["flagged_total"] - report["counts"]["weak"]
    truth = set(lm.unused)
    precision, recall = len(flagged & truth) / len(flagged), len(flagged & truth) / len(truth)
    assert precision >= 0.95 and recall >= 0.95, (precision, recall)
    think = next(r for r in report["flagged"] if r["id"] == lm.tokenizer_len - 2)
    assert think["token"] == "<think>" and think["verdict"] == UNTRAINED and think["reference"] is None
    # the reference set used, by rule: the 13 invalid UTF-8 byte tokens, the padded rows past the tokenizer
    assert len(report["reference"]["invalid_utf8_bytes"]) == 13
    assert report["reference"]["past_tokenizer"] == list(range(lm.tokenizer_len, lm.vocab_rows))
    cut = report["weights"]["cuts"]["untrained"]
    assert all(r["score"] >= cut for r in report["flagged"] if r["verdict"] == UNTRAINED and r["reference"] is None)


def test_top_keeps_the_highest_scores_and_chunking_changes_nothing(lm_untied):
    full = run_scan(ScanOptions(model=lm_untied.path))
    top = _scan_json("--model", str(lm_untied.path), "--top", "5")
    assert len(top["flagged"]) == 5 and top["flagged_total"] == full.flagged_total
    assert [r["id"] for r in top["flagged"]] == [r.id for r in full.flagged[:5]]
    scores = [r.score for r in full.flagged if r.verdict == UNTRAINED]
    assert scores == sorted(scores, reverse=True)
    small = run_scan(ScanOptions(model=lm_untied.path, chunk_rows=300))  # 8 row blocks instead of 1
    assert small.counts == full.counts
    assert [r.id for r in small.flagged] == [r.id for r in full.flagged]


def test_verify_is_batched_and_matches_one_prompt_at_a_time(lm_tied):
    from transformers import AutoModelForCausalLM

    from vlforge.vocab.tokenizer import load_tokenizer

    report = _scan_json("--model", str(lm_tied.path), "--top", "6", "--verify", "--verify-batch", "4")
    assert report["verified"] == 6 and report["verify_seconds"] is not None
    for r in report["flagged"]:
        assert 0.0 <= r["verify_prob"] <= 1.0
        assert r["verify_verdict"] == (UNTRAINED if r["verify_prob"] < report["verify_min_prob"] else "trained")
    model = AutoModelForCausalLM.from_pretrained(lm_tied.path, dtype=torch.float32).eval()
    tok = load_tokenizer(lm_tied.path)
    ids = [r["id"] for r in report["flagged"]] + [27, 9217]  # plus two ordinary ids
    batched = repeat_probabilities_with(model, tok, ids, batch_size=5)
    single = repeat_probabilities_with(model, tok, ids, batch_size=1)  # no padding at all
    for i in ids:
        assert batched[i] == pytest.approx(single[i], rel=1e-4, abs=1e-7)
        if i in {r["id"] for r in report["flagged"]}:
            assert batched[i] == pytest.approx(next(r["verify_prob"] for r in report["flagged"] if r["id"] == i),
                                               rel=1e-4, abs=1e-7)


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vlforge.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_bad_input_is_one_line_naming_the_file(lm_tied, tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    only_gguf = tmp_path / "gguf-dir"
    only_gguf.mkdir()
    (only_gguf / "weights.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    # tokenizer / weights mismatch: the embedding cut below the tokenizer's length
    short = tmp_path / "short"
    shutil.copytree(lm_tied.path, short)
    weights = load_file(short / "model.safetensors")
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"][:1000].clone()
    save_file(weights, short / "model.safetensors", metadata={"format": "pt"})
    # no embedding tensor at all
    noemb = tmp_path / "noemb"
    noemb.mkdir()
    shutil.copy(lm_tied.path / "config.json", noemb / "config.json")
    save_file({"model.norm.weight": torch.ones(4)}, noemb / "model.safetensors")
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    (encoder / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert"}))
    cases = [
        (["--model", str(gguf)], "model.gguf: a GGUF file"),
        (["--model", str(only_gguf)], "gguf-dir: holds GGUF weights only"),
        (["--model", str(short)], "model.safetensors: model.embed_tokens.weight has 1000 rows"),
        (["--model", str(noemb)], "noemb: no input embedding tensor"),
        (["--model", str(lm_tied.path), "--top", "0"], "--top 0"),
        (["--model", str(lm_tied.path), "--threshold", "nope=1"], "--threshold nope"),
        (["--model", str(encoder), "--verify"], "BertModel, not a causal LM"),
    ]
    for args, expected in cases:
        proc = _cli("tokens", "scan", *args, cwd=tmp_path)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        assert len(lines) == 1 and expected in lines[0], (args, proc.stderr[-2000:])
