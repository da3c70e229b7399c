"""Both LMMS Engine guide YAMLs train through `vlforge train` exactly as published (issue 17).

The YAML files are the verbatim copies in ``guide_configs/`` (checked against the seeds by
test_train_config_guides.py); nothing in them is edited. Only the model (a ``tiny:`` preset of the same
family), the dataset path (a parquet file this test writes, with real PNG images), the output directory and,
for the Qwen3-VL guide's 1000 steps, ``training.max_steps`` are given as CLI overrides. Everything else the
guide sets (bf16, which is LMMS Engine's pure bf16, flash_attention_2, liger, wandb, gradient checkpointing,
fsdp2 with its layer class, sp_ulysses_degree 1, 8 DataLoader workers, packing to 16384 tokens) runs as
written, with a warning where it cannot act on this CPU. The run must end with exit 0 and freeze exactly the parameters under the module the
guide names: ``freeze_modules: ["visual"]``, which lives at ``model.visual`` in transformers 5.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest
import torch
from cfgkit import HERE
from guidekit import write_parquet_dataset
from typer.testing import CliRunner

from vlforge.cli import app
from vlforge.models.load import load
from vlforge.train import trainer as trainer_module

GUIDES = {
    "lmms_guide_qwen2_5_vl.yaml": ("tiny:qwen2_5_vl", ()),
    "lmms_guide_qwen3_vl.yaml": ("tiny:qwen3_vl", ("training.max_steps=2",)),
}


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Parameters by their name in the loaded model (the files keep the checkpoint's own key layout)."""
    return {name: param.detach() for name, param in load(path, device="cpu").model.named_parameters()}


@pytest.mark.parametrize("name", sorted(GUIDES))
def test_guide_yaml_trains_unchanged(name, tmp_path, monkeypatch, caplog):
    preset, extra = GUIDES[name]
    config = HERE / "guide_configs" / name
    published = config.read_bytes()
    data = write_parquet_dataset(tmp_path / "data")
    out = tmp_path / "out"
    monkeypatch.setenv("WANDB_MODE", "offline")  # report_to: wandb, where wandb is installed
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    prepared, real_prepare_model = [], trainer_module.prepare_model

    def recording_prepare_model(*args, **kwargs):  # the real function; the test keeps its model to inspect
        result = real_prepare_model(*args, **kwargs)
        prepared.append(result.model)
        return result

    monkeypatch.setattr(trainer_module, "prepare_model", recording_prepare_model)
    overrides = [f"model.load_from_pretrained_path={preset}", f"processor.processor_name={preset}",
                 f"data.datasets.0.path={data}", f"checkpointing.output_dir={out}", *extra]
    with caplog.at_level(logging.INFO, logger="vlforge"):
        done = CliRunner().invoke(app, ["train", str(config), *overrides])
    assert done.exit_code == 0, done.output + repr(done.exception)
    assert config.read_bytes() == published
    assert "trained " in done.output and (out / "final" / "config.json").is_file()
    messages = [record.getMessage() for record in caplog.records]
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("flash_attention_2' has no effect" in message for message in warned)
    assert any("use_liger_kernel: true has no effect" in message for message in warned) or (
        _has("liger_kernel") and torch.cuda.is_available())

    model = prepared[0]
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    tower = {n for n, _ in model.named_parameters() if n.startswith("model.visual.")}
    trained_steps = int(json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"])
    assert trained_steps >= 1
    before, after = _weights(preset), _weights(out / "final")
    assert before.keys() == after.keys()
    # bf16: true means LMMS Engine's pure bf16: the weights are loaded (and updated) in bf16
    before = {k: v.to(torch.bfloat16).float() for k, v in before.items()}
    matrices = [k for k in before if k.startswith("model.language_model.layers.") and before[k].dim() == 2]
    assert matrices and all(not torch.equal(before[k], after[k]) for k in matrices)  # these trained
    if name == "lmms_guide_qwen2_5_vl.yaml":  # freeze_modules: ["visual"]
        assert tower and frozen == tower
        assert all(torch.equal(before[k], after[k]) for k in tower)
        assert "model.freeze_modules: 'visual' -> model.visual (suffix)" in messages
        count = sum(p.numel() for n, p in model.named_parameters() if n in tower)
        assert f"froze {count} of {sum(p.numel() for p in model.parameters())} parameters under visual" in messages
    else:  # the Qwen3-VL guide freezes nothing
        assert frozen == set()
        assert not any(message.startswith("froze ") for message in messages)
    assert any("fsdp.transformer_layer_cls_to_wrap checked" in message for message in messages)


def test_guide_epochs_over_a_small_set_are_one_pass_each(tmp_path):
    """The Qwen2.5-VL guide with ``num_train_epochs=3`` over 8 records: three passes, as LMMS Engine and HF
    Trainer count them (each epoch's records fit one 16384-token row, so one step per epoch), never one row
    holding every record three times."""
    config = HERE / "guide_configs" / "lmms_guide_qwen2_5_vl.yaml"
    data = write_parquet_dataset(tmp_path / "data", rows=8)
    out = tmp_path / "out"
    overrides = ["model.load_from_pretrained_path=tiny:qwen2_5_vl", "processor.processor_name=tiny:qwen2_5_vl",
                 f"data.datasets.0.path={data}", f"checkpointing.output_dir={out}", "training.num_train_epochs=3",
                 "dataloader_num_workers=0", "logging.logging_steps=1", "logging.report_to=[]"]
    done = CliRunner().invoke(app, ["train", str(config), *overrides])
    assert done.exit_code == 0, done.output + repr(done.exception)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert [r["epoch_progress"] for r in steps] == [pytest.approx(1 / 3, abs=1e-3), pytest.approx(2 / 3, abs=1e-3), 1.0]
    assert [r["epoch"] for r in steps] == [1.0, 2.0, 3.0]
