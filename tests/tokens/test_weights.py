"""Finding the embedding tensors: Qwen-VL and text-only layouts, tied flags, sharded checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from vlforge.errors import ModelLoadError
from vlforge.vocab.weights import open_embeddings


def _write(path, tensors: dict, config: dict, shards: int = 1) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, path / "model.safetensors")
        return
    weight_map = {}
    for k in range(shards):
        part = {n: tensors[n] for n in names[k::shards]}
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, path / fname)
        weight_map.update(dict.fromkeys(part, fname))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_qwen_vl_untied_sharded(tmp_path):
    tensors = {
        "model.language_model.embed_tokens.weight": torch.randn(40, 8, dtype=torch.bfloat16),
        "lm_head.weight": torch.randn(40, 8, dtype=torch.bfloat16),
        "model.visual.patch_embed.proj.weight": torch.randn(8, 3, 2, 2, 2),
        "model.visual.merger.embed_tokens.weight": torch.randn(5, 8),  # vision-side name: never picked
    }
    _write(tmp_path, tensors, {"model_type": "qwen3_vl", "tie_word_embeddings": False}, shards=2)
    emb = open_embeddings(tmp_path)
    assert emb.input.name == "model.language_model.embed_tokens.weight"
    assert emb.output.name == "lm_head.weight" and not emb.tied
    assert emb.output.dtype == "BF16" and emb.output.shape == (40, 8)
    rows = emb.output.take([3, 0, 3])
    assert rows.dtype == torch.float32
    assert torch.equal(rows[0], tensors["lm_head.weight"][3].float()) and torch.equal(rows[0], rows[2])
    chunks = list(emb.input.chunks(16))
    assert [s for s, _ in chunks] == [0, 16, 32] and sum(len(r) for _, r in chunks) == 40


def test_text_only_tied_from_text_config(tmp_path):
    tensors = {"model.embed_tokens.weight": torch.randn(30, 4)}
    _write(tmp_path, tensors, {"model_type": "qwen2_5_vl", "text_config": {"tie_word_embeddings": True}})
    emb = open_embeddings(tmp_path)
    assert emb.tied and emb.output is emb.input and emb.input.name == "model.embed_tokens.weight"


def test_missing_tensors_are_errors(tmp_path):
    _write(tmp_path / "a", {"model.layers.0.mlp.up_proj.weight": torch.zeros(2, 2)}, {})
    with pytest.raises(ModelLoadError, match="no input embedding tensor"):
        open_embeddings(tmp_path / "a")
    _write(tmp_path / "b", {"model.embed_tokens.weight": torch.zeros(3, 2)}, {"tie_word_embeddings": False})
    with pytest.raises(ModelLoadError, match="untied embeddings but no lm_head"):
        open_embeddings(tmp_path / "b")
    (tmp_path / "c").mkdir()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        open_embeddings(tmp_path / "c")
