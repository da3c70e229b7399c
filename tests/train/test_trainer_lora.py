"""LoRA training through peft on the tiny Qwen3-VL: adapters only, falling loss, resume, merged export."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from trainkit import exported_weights, max_abs_diff, run_training, tiny_config, write_config

from vlforge.config.data import data_config
from vlforge.config.preflight import check_supported
from vlforge.config.schema import TrainConfig
from vlforge.dist import init_distributed
from vlforge.errors import ConfigError
from vlforge.models.adapters import apply_lora
from vlforge.train.data_setup import open_stream
from vlforge.train.loss import model_inputs
from vlforge.train.model_setup import prepare_model
from vlforge.train.trainer import Trainer

pytest.importorskip("peft")

LORA = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
TARGETS = tuple(f".self_attn.{name}.weight" for name in LORA["target_modules"])


def _config(output_dir: Path, model_path: Path, **sections) -> dict:
    sections.setdefault("model", {})["lora"] = LORA
    training = {"max_steps": 4, "learning_rate": 5e-3, **sections.pop("training", {})}
    return tiny_config(output_dir, model_path, training=training, **sections)


def _base_name(name: str) -> str:
    """The source checkpoint's name of a peft-wrapped base parameter."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


@pytest.fixture(scope="module")
def model_path(tiny_checkpoint):
    return tiny_checkpoint("qwen3_vl")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, model_path):
    """4 LoRA steps (r=8 on the text attention projections), a checkpoint every 2 steps, merged export."""
    root = tmp_path_factory.mktemp("lora")
    cfg = TrainConfig.model_validate(_config(root / "out", model_path, checkpointing={"save_steps": 2}))
    trainer = Trainer(cfg, progress=False)
    result = trainer.train()
    return trainer, result, root


def _batch(trainer: Trainer) -> dict:
    stream = open_stream(data_config(trainer.cfg), trainer.processor, rank=0, world_size=1, base_dir=".")
    batch = next(iter(stream))
    stream.close()
    assert "pixel_values" in batch
    return batch


def test_loss_falls(lora_run):
    _, result, _ = lora_run
    assert result.steps == 4 and len(result.losses) == 4
    assert result.losses[-1] < result.losses[0]


def test_only_adapters_trainable_and_optimised(lora_run):
    trainer, _, _ = lora_run
    named = dict(trainer.model.named_parameters())
    trainable = {name for name, p in named.items() if p.requires_grad}
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    assert len(trainable) == 2 * 4 * 2  # A and B x 4 projections x 2 text layers
    in_optimizer = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(named[name]) for name in trainable}


def test_base_weights_unchanged_adapters_trained(lora_run, model_path):
    trainer, _, _ = lora_run
    source = exported_weights(model_path)
    compared = 0
    for name, param in trainer.model.named_parameters():
        if ".lora_" in name:
            continue
        key = _base_name(name)
        if key in source:
            assert torch.equal(param.detach(), source[key]), key
            compared += 1
    assert compared >= len(source) - 2  # everything but what vlforge.patch renames
    lora_b = [p for name, p in trainer.model.named_parameters() if ".lora_B." in name]
    assert all(p.abs().max() > 0 for p in lora_b)  # B starts at zero: training moved it


def test_merged_export_loads_in_stock_transformers(lora_run, model_path):
    from transformers import AutoModelForImageTextToText

    trainer, result, _ = lora_run
    final = result.export_dir
    merged, source = exported_weights(final), exported_weights(model_path)
    assert merged.keys() == source.keys() and not any("lora" in k for k in merged)
    changed = {k for k in merged if not torch.equal(merged[k], source[k])}
    assert changed and all(k.endswith(TARGETS) for k in changed)

    stock = AutoModelForImageTextToText.from_pretrained(final, dtype=torch.float32).eval()
    base = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
    inputs = model_inputs(_batch(trainer), "cpu")
    trained = trainer.model.eval()
    with torch.no_grad():
        ours = trained(**inputs, use_cache=False).logits
        theirs = stock(**inputs, use_cache=False).logits
        before = base(**inputs, use_cache=False).logits
    trained.train()
    # merged W + s*B@A vs the adapter path x@W + s*(x@A)@B: equal up to fp32 summation order
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)
    assert (theirs - before).abs().max() > 1e-3  # the adapters changed the model


def test_resume_from_checkpoint_matches_uninterrupted(lora_run, model_path, tmp_path):
    trainer, _, root = lora_run
    middle = root / "out" / "checkpoint-2"
    assert middle.is_dir()
    cfg = TrainConfig.model_validate(_config(tmp_path / "out", model_path, checkpointing={"resume": str(middle)}))
    resumed = Trainer(cfg, progress=False, export=False)
    result = resumed.train()
    assert result.resumed_from == middle and result.steps == 4
    full = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    again = {n: p for n, p in resumed.model.named_parameters() if p.requires_grad}
    assert full.keys() == again.keys()
    for name in full:
        assert torch.equal(full[name].detach(), again[name].detach()), name


def test_adapters_inside_frozen_modules_stay_frozen(model_path, tmp_path):
    cfg = TrainConfig.model_validate(_config(tmp_path, model_path, model={
        "freeze_modules": ["model.language_model.layers.0"], "patch": False}))
    model = prepare_model(cfg, init_distributed()).model
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".layers.1." in name and ".lora_" in name for name in trainable)
    assert any(".layers.0." in name and ".lora_" in name for name, _ in model.named_parameters())


def test_missing_peft_is_one_line_error(monkeypatch, model_path, tmp_path):
    monkeypatch.setitem(sys.modules, "peft", None)  # find_spec("peft") -> None, import fails
    cfg = TrainConfig.model_validate(_config(tmp_path, model_path))
    for call in (lambda: check_supported(cfg), lambda: apply_lora(torch.nn.Linear(2, 2), cfg.model.lora)):
        with pytest.raises(ConfigError) as info:
            call()
        message = str(info.value)
        assert "\n" not in message and "model.lora" in message and "pip install peft" in message


def test_cli_train_without_peft_stops_with_one_line(monkeypatch, model_path, tmp_path):
    from typer.testing import CliRunner

    from vlforge.cli import app

    monkeypatch.setitem(sys.modules, "peft", None)
    config = write_config(tmp_path / "run.yaml", tiny_config(tmp_path / "out", model_path))
    done = CliRunner().invoke(app, ["train", str(config), "model.lora={r: 4}"])
    # refused while the config is validated, before the model loads: vlforge.cli.main prints it as one line, exit 2
    assert isinstance(done.exception, ConfigError) and done.exception.exit_code == 2, done.output
    assert "\n" not in str(done.exception) and "model.lora needs peft" in str(done.exception)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("checkpoint-*"))


def test_unmatched_target_modules_is_one_line_error(model_path, tmp_path):
    lora = TrainConfig.model_validate(_config(tmp_path, model_path)).model.lora.model_copy(
        update={"target_modules": ["no_such_proj"]})
    net = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError) as info:
        apply_lora(net, lora)
    assert "\n" not in str(info.value) and "model.lora.target_modules" in str(info.value)
    assert "no_such_proj" in str(info.value)


@pytest.mark.slow
def test_fsdp2_two_ranks_equal_one_rank(tmp_path, model_path):
    """FSDP2 over 2 gloo ranks (frozen base + trainable adapters in each unit) matches one process."""
    outs = {}
    for nproc, accumulation in ((2, 1), (1, 2)):
        out = tmp_path / f"out{nproc}"
        cfg = _config(out, model_path, training={"max_steps": 2, "gradient_accumulation_steps": accumulation})
        run_training(write_config(tmp_path / f"run{nproc}.yaml", cfg), nproc)
        outs[nproc] = exported_weights(out / "final")
    assert max_abs_diff(outs[1], outs[2]) < 1e-5
    source = exported_weights(model_path)
    assert max_abs_diff(outs[2], source) > 1e-4
