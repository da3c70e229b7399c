"""Units of the trainer: schedules, optimizer, config -> data pipeline mapping, freezing, FSDP unit choice, resume."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from trainkit import DATASET

from vlforge.config.data import data_config
from vlforge.config.schema import TrainConfig, TrainingConfig
from vlforge.errors import ConfigError
from vlforge.outputs import LEDGER
from vlforge.train import checkpoint as ckpt
from vlforge.train.model_setup import (
    _in_vision_tower,
    check_supported,
    fill_missing_grads,
    freeze,
    layer_classes,
)
from vlforge.train.optim import build_optimizer, build_scheduler, lr_multiplier, warmup_steps

BASE = {"data": {"dataset_path": str(DATASET)}, "model": {"load_from_pretrained_path": "tiny:qwen3_vl"}}


def _cfg(**sections) -> TrainConfig:
    return TrainConfig.model_validate({**BASE, **sections})


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("linear", [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0]),
        ("cosine", [0.0, 0.5, 1.0, (1 + math.cos(math.pi / 4)) / 2, 0.5, (1 + math.cos(3 * math.pi / 4)) / 2, 0.0]),
        ("constant", [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]),
        ("wsd", [0.0, 0.5, 1.0, 1.0, 2 / 3, 1 / 3, 0.0]),
    ],
)
def test_schedules_with_warmup(kind, expected):
    values = [lr_multiplier(step, kind, total=6, warmup=2, decay_ratio=0.5) for step in range(7)]
    assert values == pytest.approx(expected)


def test_warmup_ratio_rounds_up_and_scheduler_drives_the_optimizer():
    training = TrainingConfig(learning_rate=0.1, warmup_ratio=0.25, lr_scheduler_type="linear")
    assert warmup_steps(training, 10) == 3
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = build_optimizer([param, torch.nn.Parameter(torch.zeros(1), requires_grad=False)], training,
                                torch.device("cpu"))
    assert len(optimizer.param_groups[0]["params"]) == 1  # frozen parameters are not optimised
    assert optimizer.defaults.get("fused") is True  # the CPU has the fused AdamW kernel in torch 2.13
    scheduler = build_scheduler(optimizer, training, total=10)
    lrs = []
    for _ in range(10):
        lrs.append(scheduler.get_last_lr()[0])
        param.grad = torch.ones(3)
        optimizer.step()
        scheduler.step()
    assert lrs[:4] == pytest.approx([0.0, 0.1 / 3, 0.2 / 3, 0.1])
    assert lrs[-1] == pytest.approx(0.1 / 7)


def test_data_config_maps_the_training_sections():
    cfg = _cfg(packing={"packing": False, "packing_length": 512, "filter_overlong": True},
               processor={"max_pixels": 4096}, video={"fps": 2.0, "video_max_frames": 4},
               training={"seed": 7, "num_train_epochs": 2.5, "per_device_train_batch_size": 3},
               data={"dataset_path": str(DATASET), "on_error": "skip"})
    dc = data_config(cfg)
    assert dc.max_length == 512 and dc.length_limit == 512  # the guide's filter limit without packing
    assert (dc.epochs, dc.seed, dc.batch_size, dc.on_error) == (3, 7, 3, "skip")
    assert (dc.max_pixels, dc.fps, dc.video_max_frames) == (4096, 2.0, 4)
    single = data_config(_cfg(data={"dataset_path": "train.jsonl"}, training={"max_steps": 5}))
    assert single.epochs is None and single.datasets[0].path == "train.jsonl"
    with_eval = _cfg(data={"dataset_path": str(DATASET), "eval_dataset_path": "eval.jsonl"}, training={"max_steps": 5})
    evaluation = data_config(with_eval, eval_set=True)
    assert evaluation.epochs == 1 and evaluation.datasets[0].path == "eval.jsonl"


def test_freeze_errors_name_the_path():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match=r"model.freeze_modules: 'visual' matches no module"):
        freeze(net, ["visual"])


def test_unsupported_settings_are_one_line_errors(monkeypatch):
    import importlib.util

    with pytest.raises(ConfigError, match=r"training\.fp16"):
        check_supported(_cfg(training={"fp16": True}))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(ConfigError, match=r"model\.lora needs peft") as info:
        check_supported(_cfg(model={"load_from_pretrained_path": "x", "lora": {"r": 4}}))
    assert "\n" not in str(info.value)


def test_layer_classes_and_vision_tower_rule():
    class Block(torch.nn.Linear):
        pass

    net = torch.nn.Sequential(Block(2, 2))
    net._no_split_modules = ["Block"]
    assert layer_classes(net, None) == {Block}
    with pytest.raises(ConfigError, match="no module of class 'Nope'"):
        layer_classes(net, ["Nope"])
    assert _in_vision_tower("model.visual.blocks.0") and not _in_vision_tower("model.language_model.layers.0")


def test_missing_grads_filled_with_zeros_only_for_trainable():
    used, unused, frozen = (torch.nn.Parameter(torch.ones(2)) for _ in range(3))
    frozen.requires_grad_(False)
    used.grad = torch.ones(2)
    module = torch.nn.Module()
    module.a, module.b, module.c = used, unused, frozen
    fill_missing_grads(module)
    assert torch.equal(unused.grad, torch.zeros(2)) and frozen.grad is None and torch.equal(used.grad, torch.ones(2))


def _sealed_checkpoint(output_dir, step):
    """A checkpoint directory laid out and sealed as save_checkpoint leaves one (tiny stand-in files)."""
    from vlforge import outputs

    path = output_dir / f"checkpoint-{step}"
    (path / ckpt.WEIGHTS_DIR).mkdir(parents=True)
    (path / ckpt.WEIGHTS_DIR / ".metadata").write_bytes(b"m" * 10)
    (path / ckpt.WEIGHTS_DIR / "__0_0.distcp").write_bytes(b"w" * 100)
    (path / "rank-0.pt").write_bytes(b"r" * 10)
    (path / ckpt.STATE_FILE).write_text(json.dumps({"step": step, "world_size": 1, "scheduler": {}}))
    outputs.seal(path, writer="train")
    return path


def test_resume_target(tmp_path):
    assert ckpt.resume_target("none", tmp_path) is None
    assert ckpt.resume_target("auto", tmp_path) is None
    (tmp_path / ".tmp-checkpoint-9").mkdir()  # an interrupted save is never resumed from
    done = _sealed_checkpoint(tmp_path, 4)
    assert ckpt.problem(done) is None
    assert ckpt.resume_target("auto", tmp_path) == done
    assert ckpt.resume_target(str(done), tmp_path) == done
    with pytest.raises(ConfigError, match="is not a vlforge checkpoint"):
        ckpt.resume_target(str(tmp_path / "checkpoint-9"), tmp_path)


@pytest.mark.parametrize(("damage", "says"), [
    (lambda p: (p / ckpt.STATE_FILE).write_text("{not json"), "trainer_state.json is not JSON"),
    (lambda p: (p / ckpt.STATE_FILE).write_text(""), "trainer_state.json is not JSON (empty file)"),
    (lambda p: (p / ckpt.STATE_FILE).write_text('{"step": 9}'), "has no int 'world_size'"),
    (lambda p: (p / ckpt.WEIGHTS_DIR / "__0_0.distcp").unlink(), r"incomplete: weights/__0_0.distcp is missing"),
    (lambda p: (p / ckpt.WEIGHTS_DIR / "__0_0.distcp").write_bytes(b"w" * 7), "has 7 bytes, 100 when written"),
    (lambda p: (p / LEDGER).unlink(), "not written by vlforge"),
])
def test_a_damaged_or_foreign_checkpoint_is_skipped_by_auto_and_refused_by_name(tmp_path, caplog, damage, says):
    good = _sealed_checkpoint(tmp_path, 4)
    bad = _sealed_checkpoint(tmp_path, 999)
    damage(bad)
    assert says in (ckpt.problem(bad) or ""), ckpt.problem(bad)
    with caplog.at_level("WARNING", logger="vlforge.train.checkpoint"):
        assert ckpt.resume_target("auto", tmp_path) == good
    assert [r.getMessage() for r in caplog.records] == [
        f"resume auto: skipping {bad}: {ckpt.problem(bad)} (left in place)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="vlforge.train.checkpoint"):  # the other ranks of a run stay quiet
        assert ckpt.resume_target("auto", tmp_path, warn=False) == good
    assert not caplog.records
    with pytest.raises(ConfigError, match=re.escape(f"checkpointing.resume: {bad}: ") + ".*" + re.escape(says)):
        ckpt.resume_target(str(bad), tmp_path)
    assert (bad / ckpt.STATE_FILE).exists() and good.is_dir()  # nothing deleted


def test_remap_data_state_requeues_buffers_and_restarts_at_the_nearest_draw():
    def state(shard, draws, ready, bins):
        return {"version": 1, "shard_id": shard, "num_shards": 2, "mixture": {"m": shard}, "draws": draws,
                "finished": False, "buffer": {"bins": bins, "loads": [1] * len(bins)}, "ready": ready,
                "ledger": {}, "stats": {}}

    ref = lambda i: {"entry": 0, "index": i, "location": f"line {i + 1}", "record": {}}  # noqa: E731
    old = [state(0, 9, [[ref(0)]], [[ref(2), ref(4)]]), state(1, 10, [], [[ref(1)], [ref(3)]])]
    new = ckpt.remap_data_state(old, 0, 1)
    assert new["shard_id"] == 0 and new["num_shards"] == 1 and new["draws"] == 9
    assert new["mixture"] == {"m": 0}  # the position of the reader that was least far
    assert new["done"] == [9]  # drawn by old shard 1 (9 % 2 == 1) already: skipped, not repeated
    assert sorted(r["index"] for group in new["ready"] for r in group) == [0, 1, 2, 3, 4]
    assert new["buffer"] == {"bins": [], "loads": []}


def test_a_resumed_run_takes_its_next_step_at_its_own_schedules_rate():
    """Resumed with another max_steps: the restored optimizer held the old schedule's next rate."""
    from vlforge.train.optim import follow_schedule

    training = TrainingConfig(learning_rate=0.1, warmup_steps=2, lr_scheduler_type="linear")

    def run(total: int):
        param = torch.nn.Parameter(torch.zeros(3))
        optimizer = build_optimizer([param], training, torch.device("cpu"))
        return param, optimizer, build_scheduler(optimizer, training, total=total)

    param, optimizer, scheduler = run(10)
    for _ in range(4):
        param.grad = torch.ones(3)
        optimizer.step()
        scheduler.step()
    saved = (optimizer.state_dict(), scheduler.state_dict(), optimizer.param_groups[0]["lr"])
    for total in (10, 40):
        _, again, schedule = run(total)
        again.load_state_dict(saved[0])
        schedule.load_state_dict(saved[1])
        follow_schedule(again, schedule)
        expected = 0.1 * lr_multiplier(4, "linear", total=total, warmup=2, decay_ratio=training.lr_decay_ratio, kwargs={})
        assert again.param_groups[0]["lr"] == schedule.get_last_lr()[0] == expected
        assert (again.param_groups[0]["lr"] == saved[2]) == (total == 10)  # unchanged schedule: the very same rate
