"""Repair: flagged rows leave 'untrained', only they change, the output is a loadable checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from vlforge.errors import ConfigError
from vlforge.tokens.fix import FixOptions, fix_checkpoint
from vlforge.vocab.detect import TRAINED, UNTRAINED, detect
from vlforge.vocab.tokenizer import byte_invalid_ids, load_tokenizer
from vlforge.vocab.weights import open_embeddings


def _verdicts(path):
    tok = load_tokenizer(path)
    return detect(open_embeddings(path), tokenizer_len=len(tok), byte_invalid_ids=byte_invalid_ids(tok)).verdicts


def _changed_rows(a, b) -> dict[str, list[int]]:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    out = {}
    for key in wa:
        assert wa[key].dtype == wb[key].dtype and wa[key].shape == wb[key].shape
        diff = (wa[key] != wb[key]).reshape(wa[key].shape[0], -1).any(dim=1) if wa[key].dim() else None
        if diff is not None and diff.any():
            out[key] = torch.nonzero(diff).flatten().tolist()
    return out


@pytest.mark.parametrize("which", ["lm_untied", "lm_tied"])
def test_mean_of_pieces_repairs_think(which, request, tmp_path):
    lm = request.getfixturevalue(which)
    think, close = lm.tokenizer_len - 2, lm.tokenizer_len - 1
    out = tmp_path / "fixed"
    rows_file = tmp_path / "rows.json"
    report = fix_checkpoint(FixOptions(model=lm.path, out=out, tags=["<think>", "</think>"], seed=1,
                                       trainable_rows=rows_file))
    assert [r.id for r in report.rows] == [think, close]
    assert all(r.strategy == "mean-of-pieces" and r.pieces and r.verdict_before == UNTRAINED for r in report.rows)
    changed = _changed_rows(lm.path, out)
    expected = {"model.embed_tokens.weight"} | ({"lm_head.weight"} if which == "lm_untied" else set())
    assert set(changed) == expected
    assert all(rows == [think, close] for rows in changed.values())
    after = _verdicts(out)
    assert after[think] == TRAINED and after[close] == TRAINED
    assert json.loads(rows_file.read_text())["ids"] == [think, close]
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (out / name).read_bytes() == (lm.path / name).read_bytes()
    model = AutoModelForCausalLM.from_pretrained(out)  # still a loadable checkpoint
    assert model.config.vocab_size == lm.vocab_rows


def test_trained_mean_on_ids_and_seed(lm_untied, tmp_path):
    ids = lm_untied.unused[:3]
    a = fix_checkpoint(FixOptions(model=lm_untied.path, out=tmp_path / "a", ids=ids, strategy="trained-mean", seed=3))
    b = fix_checkpoint(FixOptions(model=lm_untied.path, out=tmp_path / "b", ids=ids, strategy="trained-mean", seed=3))
    assert [r.id for r in a.rows] == sorted(ids) and {r.strategy for r in a.rows} == {"trained-mean"}
    assert a.rows == b.rows  # seeded: same norms
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert torch.equal(wa["lm_head.weight"], wb["lm_head.weight"])
    rows = wa["lm_head.weight"][ids]
    assert not torch.equal(rows[0], rows[1])  # the noise makes the re-initialised rows distinct
    after = _verdicts(tmp_path / "a")
    assert all(after[i] != UNTRAINED for i in ids)


def test_fix_refuses_bad_requests(lm_tied, tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        fix_checkpoint(FixOptions(model=lm_tied.path, out=busy, ids=[5]))
    assert (busy / "keep.txt").read_text() == "x"
    with pytest.raises(ConfigError, match="outside the embedding rows"):
        fix_checkpoint(FixOptions(model=lm_tied.path, out=tmp_path / "x", ids=[10**7]))
    with pytest.raises(ConfigError, match="--ids"):
        fix_checkpoint(FixOptions(model=lm_tied.path, out=tmp_path / "y"))
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_fix_keeps_bf16(lm_untied, tmp_path):
    import shutil

    from safetensors.torch import save_file

    src = tmp_path / "bf16"
    shutil.copytree(lm_untied.path, src)
    weights = load_file(src / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, src / "model.safetensors",
              metadata={"format": "pt"})
    think = lm_untied.tokenizer_len - 2
    fix_checkpoint(FixOptions(model=src, out=tmp_path / "out", ids=[think]))
    changed = _changed_rows(src, tmp_path / "out")  # also checks dtypes and shapes are unchanged
    assert changed == {"model.embed_tokens.weight": [think], "lm_head.weight": [think]}
    assert load_file(tmp_path / "out" / "model.safetensors")["lm_head.weight"].dtype == torch.bfloat16
