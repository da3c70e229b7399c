"""End-to-end single-process training on the tiny Qwen3-VL: metrics, eval, freezing, checkpoints, export, CLI."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from trainkit import DATASET, exported_weights, tiny_config, write_config
from typer.testing import CliRunner

from vlforge.cli import app
from vlforge.config.schema import TrainConfig
from vlforge.errors import ConfigError
from vlforge.train.loss import model_inputs
from vlforge.train.trainer import Trainer, run

runner = CliRunner()


@pytest.fixture(scope="module")
def model_path(tiny_checkpoint):
    return tiny_checkpoint("qwen3_vl")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, model_path):
    """Two steps with warm-up, eval, a frozen vision tower, a checkpoint per step (keep 1), no patching."""
    root = tmp_path_factory.mktemp("run")
    cfg = tiny_config(
        root / "out", model_path,
        data={"eval_dataset_path": str(DATASET)},
        model={"freeze_modules": ["model.visual"], "patch": False},
        training={"max_steps": 3, "warmup_steps": 2, "lr_scheduler_type": "linear", "eval_strategy": "steps",
                  "eval_steps": 3, "gradient_accumulation_steps": 2},
        checkpointing={"save_steps": 1, "save_total_limit": 1},
    )
    config = TrainConfig.model_validate(cfg)
    return run(config, progress=False), root / "out"


def test_metrics_schedule_and_eval(finished):
    result, out = finished
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert [r["lr"] for r in train] == pytest.approx([0.0, 5e-4, 1e-3])  # linear warm-up over 2 steps
    assert all(r["grad_norm"] > 0 and r["tokens_per_s"] > 0 and r["label_tokens"] > 0 for r in train)
    assert train[0]["loss"] == pytest.approx(result.losses[0]) and train[2]["loss"] < train[0]["loss"]
    evals = [r for r in records if "eval_loss" in r]
    assert len(evals) == 1 and evals[0]["step"] == 3 and 0 < evals[0]["eval_loss"] < train[0]["loss"]
    assert result.eval_losses == [evals[0]["eval_loss"]]


def test_checkpoints_pruned_and_atomic(finished):
    _, out = finished
    names = sorted(p.name for p in out.iterdir())
    assert "checkpoint-3" in names and "checkpoint-1" not in names and "checkpoint-2" not in names
    assert not [n for n in names if n.startswith(".tmp")]
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["step"] == 3 and state["world_size"] == 1 and state["family"] == "qwen3_vl"


def test_frozen_tower_unchanged_and_export_loads_in_stock_transformers(finished, model_path):
    from transformers import AutoModelForImageTextToText

    result, out = finished
    final = out / "final"
    trained, start = exported_weights(final), exported_weights(model_path)
    visual = [k for k in trained if k.startswith("model.visual.")]
    assert visual and all(torch.equal(trained[k], start[k]) for k in visual)
    assert any(not torch.equal(trained[k], start[k]) for k in trained if k not in visual)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "processor_config.json"):
        assert (final / name).is_file(), name

    stock = AutoModelForImageTextToText.from_pretrained(final, dtype=torch.float32).eval()
    trainer_model = result.model.eval()
    cfg = TrainConfig.model_validate(tiny_config(out.parent / "probe", model_path))
    probe = Trainer(cfg, progress=False, export=False)
    probe.setup()
    batch = next(probe.stream)
    assert "pixel_values" in batch
    with torch.no_grad():
        ours = trainer_model(**model_inputs(batch, "cpu"), use_cache=False).logits
        theirs = stock(**model_inputs(batch, "cpu"), use_cache=False).logits
    assert torch.equal(ours, theirs)


def test_cli_train_json_and_export(tmp_path, model_path):
    config = write_config(tmp_path / "run.yaml", tiny_config(tmp_path / "out", model_path))
    # 10 records, 1 per step: num_train_epochs 0.1 is one step (counted by a pass over the data)
    done = runner.invoke(app, ["train", str(config), "training.max_steps=null", "training.num_train_epochs=0.1",
                               "--json"])
    assert done.exit_code == 0, done.output
    summary = json.loads(done.stdout)
    assert summary["steps"] == 1 and len(summary["losses"]) == 1 and summary["export_dir"].endswith("final")

    exported = runner.invoke(app, ["export", summary["checkpoint"], str(tmp_path / "hf")])
    assert exported.exit_code == 0, exported.output
    a, b = exported_weights(tmp_path / "hf"), exported_weights(tmp_path / "out" / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    again = runner.invoke(app, ["export", summary["checkpoint"], str(tmp_path / "hf")])
    assert again.exit_code != 0 and "exists and is not empty" in str(again.exception)

    args = ["train", str(config), "training.max_steps=null", "training.num_train_epochs=0.1", "checkpointing.resume=auto"]
    rerun = runner.invoke(app, args)  # the same command after the run ended: it says so, it does not claim a step
    assert rerun.exit_code == 0, rerun.output
    assert f"nothing left to train: {summary['checkpoint']} is at the run's last step (1)" in " ".join(rerun.output.split())


def test_export_copies_the_source_tokenizer_without_reading_it(finished, model_path, tmp_path):
    """Export needs the source's weights layout, not its tokenizer: a tokenizer.json this transformers cannot
    read (a newer format, a custom class) is copied as it is, byte for byte."""
    import shutil

    from vlforge.train.export import export_checkpoint

    source = tmp_path / "source"
    shutil.copytree(model_path, source)
    (source / "tokenizer.json").write_text("{ a tokenizer this transformers cannot parse")
    checkpoint = max(finished[1].glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    out = export_checkpoint(checkpoint, tmp_path / "hf", source=str(source))
    assert (out / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    assert exported_weights(out).keys() == exported_weights(finished[1] / "final").keys()


def test_export_of_a_damaged_checkpoint_or_another_model_is_one_line(finished, tmp_path):
    """What `vlforge export` says of a checkpoint it cannot use: one line naming the file or the model, exit 2, no
    traceback, nothing written (each before the model loads, but the source's shapes)."""
    import shutil

    checkpoint = max(finished[1].glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))

    def export(path, *extra):
        done = runner.invoke(app, ["export", str(path), str(tmp_path / "hf"), *extra])
        assert not (tmp_path / "hf").exists()
        return done

    def damaged(change):
        copy = tmp_path / "damaged"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(checkpoint, copy)
        change(copy)
        return export(copy)

    for change, said in (
        (lambda c: (c / "trainer_state.json").write_text("{bad"), "trainer_state.json is not JSON"),
        (lambda c: (c / "weights" / ".metadata").unlink(), "weights/.metadata is missing"),
        (lambda c: next((c / "weights").glob("*.distcp")).write_bytes(b"half"), ".distcp has 4 bytes"),
    ):
        done = damaged(change)
        assert done.exit_code == 1 and isinstance(done.exception, ConfigError), done.output  # the CLI: exit 2
        assert str(done.exception).startswith(f"{tmp_path / 'damaged'}: not a complete vlforge checkpoint: ")
        assert said in str(done.exception)
    gone = export(tmp_path / "nothere")
    assert str(gone.exception) == f"{tmp_path / 'nothere'}: not found"
    other = export(checkpoint, "--source", "tiny:qwen2_vl")
    assert isinstance(other.exception, ConfigError), other.output
    assert str(other.exception).startswith(f"--source tiny:qwen2_vl: {checkpoint} holds another model's weights (")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.freeze_modules=[model.vision]", "model.freeze_modules: 'model.vision' matches no module"),
        ("model.lora={r: 4}", "model.lora needs peft"),
        ("training.fp16=true", "training.fp16: float16 training"),
    ],
)
def test_cli_train_bad_settings_one_line(tmp_path, model_path, override, message):
    if "lora" in override and importlib.util.find_spec("peft") is not None:
        pytest.skip("peft is installed")
    config = write_config(tmp_path / "run.yaml", tiny_config(tmp_path / "out", model_path))
    done = runner.invoke(app, ["train", str(config), override])
    assert done.exit_code != 0
    if isinstance(done.exception, SystemExit):  # refused by the checks before work: printed as one line, exit 2
        lines = [line for line in done.output.splitlines() if line.strip()]
        assert done.exit_code == 2 and len(lines) == 1 and message in lines[0], done.output
    else:  # refused once the model is there (module names): one-line exception
        assert isinstance(done.exception, Exception) and message in str(done.exception)
        assert "\n" not in str(done.exception)


def test_dataloader_workers_resume_exactly_and_onto_other_shards(tmp_path, model_path):
    from vlforge.train.data_setup import RankData

    cfg = tiny_config(tmp_path / "out", model_path, packing={"packing": True, "packing_length": 160})
    cfg["dataloader_num_workers"] = 2
    trainer = Trainer(TrainConfig.model_validate(cfg), progress=False, export=False)
    trainer.setup()
    assert trainer.stream.loader is not None and trainer.stream.loader.num_workers == 2
    [next(trainer.stream) for _ in range(3)]
    saved = trainer.stream.state_dict()
    following = [next(trainer.stream)["sample_ids"] for _ in range(3)]
    trainer.stream.close()

    same = RankData(trainer.data_cfg, trainer.processor, rank=0, world_size=1, workers=2)
    same.load_state_dict([saved])
    assert [next(same)["sample_ids"] for _ in range(3)] == following
    same.close()

    unpacked = trainer.data_cfg.model_copy(update={"packing": False, "batch_size": 1})
    two_workers = RankData(unpacked, trainer.processor, rank=0, world_size=1, workers=2)
    seen = [tuple(next(two_workers)["sample_ids"][0]) for _ in range(3)]  # DataLoader makes tuples lists
    state = two_workers.state_dict()
    two_workers.close()
    one_stream = RankData(unpacked, trainer.processor, rank=0, world_size=1, workers=0)
    one_stream.load_state_dict([state])  # 2 worker shards -> 1 shard: continue, nothing repeated or lost
    seen += [tuple(next(one_stream)["sample_ids"][0]) for _ in range(7)]
    assert sorted(seen) == sorted({(0, f"line {i}") for i in range(1, 11)})


def test_shipped_example_config_trains_with_falling_loss(tmp_path, monkeypatch):
    from trainkit import REPO

    monkeypatch.chdir(REPO)  # the example's paths are relative to the repository root
    result = run(REPO / "examples" / "qwen3_vl_tiny.yaml",
                 ["training.max_steps=6", "logging.logging_steps=3", "training.warmup_steps=1",
                  f"checkpointing.output_dir={tmp_path / 'out'}", "checkpointing.resume=none"],
                 progress=False, export=False)
    assert result.steps == 6 and len(result.losses) == 2
    assert result.losses[1] < result.losses[0] - 0.3
    # each pass over the 10 example records ends with its own partly filled row (rows never span two epochs)
    assert result.data_report["skipped_total"] == 0 and result.data_report["packing"]["fill"] > 0.5
