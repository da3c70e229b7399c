"""Weights audit on a tiny LM trained for real (tied and untied), on bf16 and at real vocabulary size."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from vlforge.vocab.detect import TRAINED, UNTRAINED, detect
from vlforge.vocab.reference import detect_for
from vlforge.vocab.tokenizer import byte_invalid_ids, load_tokenizer
from vlforge.vocab.weights import open_embeddings


def _stats(path, **kw):
    tok = load_tokenizer(path)
    return detect_for(tok, open_embeddings(path, **kw.pop("open_kw", {})), **kw)


def _precision_recall(stats, lm) -> tuple[float, float]:
    flagged = {i for i in range(lm.tokenizer_len) if stats.verdicts[i] == UNTRAINED}
    truth = set(lm.unused)
    hits = len(flagged & truth)
    return hits / max(len(flagged), 1), hits / len(truth)


@pytest.mark.parametrize("which", ["lm_untied", "lm_tied"])
def test_detector_separates_unused_from_used(which, request):
    lm = request.getfixturevalue(which)
    assert lm.final_loss < math.log(len(lm.used)) - 0.2  # it learned more than uniform guessing
    stats = _stats(lm.path)
    assert stats.tied == (which == "lm_tied")
    assert stats.reference_reasons["past_tokenizer"] == lm.vocab_rows - lm.tokenizer_len
    assert stats.reference_reasons["invalid_utf8_bytes"] == 13
    precision, recall = _precision_recall(stats, lm)
    assert precision >= 0.95 and recall >= 0.95, (precision, recall)
    think, close = lm.tokenizer_len - 2, lm.tokenizer_len - 1  # <think>, </think> (never used)
    assert stats.verdicts[think] == stats.verdicts[close] == UNTRAINED
    assert not stats.reference[think] and not stats.candidates[think]  # found by its score alone
    if which == "lm_untied":
        assert float(stats.input_norm_ratio[think]) < 0.5  # its input row only saw weight decay
    else:
        assert stats.input_norm_ratio is None


def test_bf16_streaming_matches(lm_untied, tmp_path):
    """A bf16 copy read in small chunks (never cached) gives the same verdicts as the fp32 original."""
    dst = tmp_path / "bf16"
    shutil.copytree(lm_untied.path, dst)
    weights = load_file(dst / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, dst / "model.safetensors",
              metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(cfg))
    emb = open_embeddings(dst, cache_bytes=0)
    assert emb.output.dtype == "BF16" and emb.output._cached() is None
    ref = _stats(lm_untied.path)
    got = _stats(dst, open_kw={"cache_bytes": 0}, chunk_rows=300)
    agree = sum(a == b for a, b in zip(ref.verdicts, got.verdicts, strict=True)) / len(ref.verdicts)
    assert agree > 0.99
    assert _precision_recall(got, lm_untied)[1] >= 0.95


def test_reference_rules_zero_identical_user(lm_tied, tmp_path):
    dst = tmp_path / "edited"
    shutil.copytree(lm_tied.path, dst)
    weights = load_file(dst / "model.safetensors")
    emb = weights["model.embed_tokens.weight"]
    emb[100] = 0.0
    emb[200] = emb[300]
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    stats = _stats(dst, user_reference_ids=[400])
    assert stats.reference[100] and stats.reference[200] and stats.reference[300] and stats.reference[400]
    assert stats.reference_reasons["zero_rows"] == 1
    assert stats.reference_reasons["identical_rows"] == 2
    assert stats.reference_reasons["user"] == 1
    assert all(stats.verdicts[i] == UNTRAINED for i in (100, 200, 300, 400))


def test_no_reference_on_tied_model_is_unknown(lm_tied, tmp_path):
    """Without known-unused rows a tied model cannot be judged: every verdict is 'unknown'."""
    dst = tmp_path / "noref"
    dst.mkdir()
    weights = load_file(lm_tied.path / "model.safetensors")
    n = lm_tied.tokenizer_len
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"][:n].clone()
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(lm_tied.path / "config.json", dst / "config.json")
    emb = open_embeddings(dst)
    stats = detect(emb, tokenizer_len=n, byte_invalid_ids=[])
    assert stats.score is None and set(stats.verdicts) == {"unknown"}


def test_real_vocabulary_size(qwen3_dir, qwen3_tok, tmp_path):
    """151,936 rows with the real 151,669-entry tokenizer, bf16 on disk.

    A full-softmax step at this size costs about a second here, so this checkpoint is not trained:
    it checks the real-size plumbing (reference set of the real tokenizer, chunking, bf16, row lookup).
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=151936, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        shutil.copy(qwen3_dir / name, tmp_path / name)
    emb = open_embeddings(tmp_path)
    assert emb.output.shape == (151936, 16) and emb.output.name == "lm_head.weight" and not emb.tied
    stats = detect(emb, tokenizer_len=len(qwen3_tok), byte_invalid_ids=byte_invalid_ids(qwen3_tok))
    assert stats.reference_reasons["past_tokenizer"] == 151936 - 151669
    assert stats.reference_reasons["invalid_utf8_bytes"] == 13
    assert stats.score is not None and stats.score.shape == (151936,)
    # random rows: nothing sits at the reference mean, so ordinary ids are not untrained
    share = sum(v == UNTRAINED for v in stats.verdicts[:151669]) / 151669
    assert share < 0.01
    assert stats.verdicts[13708] == TRAINED
    assert stats.row(151667)["id"] == 151667 and 0 <= stats.row(151667)["percentile"] <= 100
