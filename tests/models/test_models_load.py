"""vlforge.models.load on presets, directories, hub ids and bad input; the `vlforge tiny` command."""

from __future__ import annotations

import json

import huggingface_hub.constants
import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from vlforge.cli import app
from vlforge.errors import ConfigError, ModelLoadError
from vlforge.models import LoadedModel, load, parse_dtype
from vlforge.models.tiny import MARKER


def test_preset_is_written_once_into_the_cache_then_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("VLFORGE_CACHE_DIR", str(tmp_path / "cache"))
    loaded = load("tiny:qwen3_vl@2")
    assert isinstance(loaded, LoadedModel)
    assert loaded.family == "qwen3_vl" and loaded.source == "tiny:qwen3_vl@2"
    assert loaded.path.parent == tmp_path / "cache" / "tiny"
    assert json.loads((loaded.path / MARKER).read_text())["seed"] == 2
    assert not loaded.model.training
    assert loaded.model.dtype == torch.float32
    assert type(loaded.processor).__name__ == "Qwen3VLProcessor"
    assert loaded.tokenizer is loaded.processor.tokenizer
    stamp = (loaded.path / "model.safetensors").stat().st_mtime_ns
    again = load("tiny:qwen3_vl@2", dtype="bf16", processor=False)
    assert again.path == loaded.path
    assert (again.path / "model.safetensors").stat().st_mtime_ns == stamp  # not rewritten
    assert again.model.dtype == torch.bfloat16 and not again.model.training
    assert again.processor is None and again.tokenizer("<think>")["input_ids"] == [151667]
    weights = loaded.model.get_input_embeddings().weight
    assert torch.equal(weights.to(torch.bfloat16), again.model.get_input_embeddings().weight)
    alone = load("tiny:qwen3_vl@2", processor=False, tokenizer=False)
    assert alone.processor is None and alone.tokenizer is None and torch.equal(alone.model.lm_head.weight,
                                                                               loaded.model.lm_head.weight)
    with pytest.raises(ConfigError, match=r"load\(tokenizer=False\) needs processor=False"):
        load("tiny:qwen3_vl@2", tokenizer=False)


def test_text_only_checkpoint_falls_back_to_causal_lm(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from vlforge.models.tokenizer import qwen3_tokenizer

    config = Qwen3Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    Qwen3ForCausalLM(config).save_pretrained(tmp_path)
    qwen3_tokenizer().save_pretrained(tmp_path)
    loaded = load(tmp_path)
    assert type(loaded.model).__name__ == "Qwen3ForCausalLM" and loaded.family == "qwen3"
    assert loaded.processor is None and loaded.tokenizer("<think>")["input_ids"] == [151667]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("fp32", torch.float32), ("float32", torch.float32), ("BF16", torch.bfloat16), ("torch.float16", torch.float16),
     ("auto", "auto"), (torch.bfloat16, torch.bfloat16)],
)
def test_dtype_spellings(text, expected):
    assert parse_dtype(text) == expected


def test_bad_inputs_are_one_line_errors(tmp_path, tiny_checkpoint, monkeypatch):
    with pytest.raises(ModelLoadError, match="does-not-exist"):
        load(tmp_path / "does-not-exist")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"empty has no config.json"):
        load(tmp_path / "empty")
    with pytest.raises(ConfigError, match="unknown dtype 'int7'"):
        load(tiny_checkpoint("qwen2_vl"), dtype="int7")
    with pytest.raises(ConfigError, match="bad preset 'tiny:qwen3_vl@x'"):
        load("tiny:qwen3_vl@x")
    with pytest.raises(ConfigError, match="unknown model family 'llama'"):
        load("tiny:llama")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="cannot fetch 'vlforge-test/no-such-model' from the Hugging Face Hub"):
        load("vlforge-test/no-such-model")


def test_cli_tiny_writes_a_loadable_untied_checkpoint(tmp_path):
    runner = CliRunner()
    listed = runner.invoke(app, ["tiny", "--list"])
    assert listed.exit_code == 0 and "qwen3_vl_moe" in listed.stdout.split()
    out = tmp_path / "cli-tiny"
    result = runner.invoke(app, ["tiny", "qwen2_5_vl", str(out), "--seed", "3", "--untied"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out)
    marker = json.loads((out / MARKER).read_text())
    assert marker["seed"] == 3 and marker["tie_word_embeddings"] is False
    with safe_open(out / "model.safetensors", "pt") as f:
        assert not torch.equal(f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight"))
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    bad = runner.invoke(app, ["tiny", "qwen9", str(tmp_path / "x")])
    assert isinstance(bad.exception, ConfigError)


def test_shared_processor_is_read_once_per_process_until_its_files_change(tiny_checkpoint, tmp_path):
    import os
    import shutil

    source = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("qwen2_vl"), source)
    first = load(str(source), shared_processor=True)
    again = load(str(source), shared_processor=True)
    assert again.processor is first.processor and again.tokenizer is first.tokenizer
    assert again.model is not first.model  # the weights are always read
    assert load(str(source)).tokenizer is not first.tokenizer  # an unshared load reads the files
    config = source / "tokenizer_config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 1_000_000))
    changed = load(str(source), shared_processor=True)
    assert changed.tokenizer is not first.tokenizer  # a changed file is read again
    assert changed.tokenizer("<|im_end|>")["input_ids"] == first.tokenizer("<|im_end|>")["input_ids"]
