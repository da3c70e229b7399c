"""Regression tests of the trainer review: schedule length, collective stops, resume remap, metrics, inert keys."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from trainkit import REPO, tiny_config, train_command, train_env, write_config

from vlforge.config.data import data_config
from vlforge.config.schema import TrainConfig
from vlforge.train.data_setup import open_stream
from vlforge.train.trainer import Trainer, count_steps, micro_batches


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("qwen3_vl")


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, checkpoint):
    out = tmp_path_factory.mktemp("review") / "out"
    cfg = TrainConfig.model_validate(tiny_config(out, checkpoint, packing={"packing": True, "packing_length": 400}))
    built = Trainer(cfg, progress=False, export=False)
    built.setup()
    return built


# -- 1. the schedule counts the real multi-epoch stream -----------------------------------------------
@pytest.mark.parametrize("packing_length", [300, 400, 520, 700])
def test_schedule_length_equals_batches_of_the_real_multi_epoch_stream(trainer, checkpoint, packing_length):
    raw = tiny_config(trainer.output_dir, checkpoint, packing={"packing": True, "packing_length": packing_length},
                      training={"max_steps": None, "num_train_epochs": 3, "gradient_accumulation_steps": 1})
    cfg = TrainConfig.model_validate(raw)
    data_cfg = data_config(cfg)
    stream = open_stream(data_cfg, trainer.processor, rank=0, world_size=1, base_dir=".")
    real = sum(1 for _ in stream) // micro_batches(cfg)
    stream.close()
    assert data_cfg.epochs == 3
    assert count_steps(cfg, data_cfg, trainer.processor, trainer.ctx, ".") == real


@pytest.mark.parametrize("workers", [2, 3])
def test_schedule_length_with_dataloader_workers_equals_the_batches_the_workers_yield(trainer, checkpoint, workers):
    """Each DataLoader worker packs its own share of the records, so it flushes its own last, partly full bin."""
    from vlforge.train.data_setup import RankData

    raw = tiny_config(trainer.output_dir, checkpoint, packing={"packing": True, "packing_length": 700},
                      training={"max_steps": None, "num_train_epochs": 1, "gradient_accumulation_steps": 1})
    raw["dataloader_num_workers"] = workers
    cfg = TrainConfig.model_validate(raw)
    data_cfg = data_config(cfg)
    loader = RankData(data_cfg, trainer.processor, rank=0, world_size=1, workers=workers)
    real = sum(1 for _ in loader) // micro_batches(cfg)
    loader.close()
    single = open_stream(data_cfg, trainer.processor, rank=0, world_size=1, base_dir=".")
    assert real > sum(1 for _ in single)  # the case that was miscounted: more batches than one stream packs
    assert count_steps(cfg, data_cfg, trainer.processor, trainer.ctx, ".") == real


def test_schedule_of_a_large_dataset_is_estimated_without_a_pass(trainer, checkpoint, tmp_path, monkeypatch):
    """Above a few hundred records no counting pass runs: a fixed sample is processed, and the estimate is close."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    records = [{"messages": [{"role": "user", "content": f"Question {i}: " + "word " * ((i * 37) % 60)},
                             {"role": "assistant", "content": "Answer" + " ok" * ((i * 11) % 20)}]} for i in range(900)]
    (tmp_path / "big.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    raw = tiny_config(trainer.output_dir, checkpoint, packing={"packing": True, "packing_length": 500},
                      training={"max_steps": None, "num_train_epochs": 2, "gradient_accumulation_steps": 2})
    raw["data"] = {"dataset_path": str(tmp_path / "big.jsonl")}
    cfg = TrainConfig.model_validate(raw)
    data_cfg = data_config(cfg)
    processed = []
    original = trainer.processor.process
    monkeypatch.setattr(trainer.processor, "process", lambda *a, **k: processed.append(1) or original(*a, **k))
    estimate = count_steps(cfg, data_cfg, trainer.processor, trainer.ctx, ".")
    assert len(processed) <= 256
    monkeypatch.setattr(trainer.processor, "process", original)
    stream = open_stream(data_cfg, trainer.processor, rank=0, world_size=1, base_dir=".")
    real = sum(1 for _ in stream) // micro_batches(cfg)
    stream.close()
    assert abs(estimate - real) <= max(2, 0.05 * real), (estimate, real)


def _stop_worker(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from vlforge.dist import DistContext
    from vlforge.train.trainer import global_label_count

    ctx = DistContext(rank, 2, 0, torch.device("cpu"), True)
    batch = {"labels": torch.tensor([[-100, 5, 6, 7]])}
    # step 1: both ranks have data; step 2: rank 1 ran out
    first = global_label_count(ctx, [batch])
    second = global_label_count(ctx, [batch] if rank == 0 else None)
    results[rank] = (None if first is None else float(first), second is None)
    ctx.close()


def test_running_out_of_data_is_a_collective_decision():
    from trainkit import free_port

    results = mp.Manager().dict()
    mp.spawn(_stop_worker, args=(free_port(), results), nprocs=2, join=True)
    # first step: 3 label tokens per rank (shifted labels) summed over ranks; second: every rank stops
    assert dict(results) == {0: (6.0, True), 1: (6.0, True)}


# -- 2. an empty eval shard stops every rank with the same error ---------------------------------------
@pytest.mark.slow
def test_empty_eval_shard_fails_on_every_rank_without_hanging(tmp_path, checkpoint):
    lines = (REPO / "examples" / "data" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(lines[7] + "\n", encoding="utf-8")  # one text-only record: rank 1 gets nothing
    cfg = tiny_config(tmp_path / "out", checkpoint, data={"eval_dataset_path": str(eval_file)},
                      training={"max_steps": 1, "eval_strategy": "steps", "eval_steps": 1})
    config = write_config(tmp_path / "run.yaml", cfg)
    proc = subprocess.run(train_command(config, 2), env=train_env(), capture_output=True, text=True,
                          timeout=400, cwd=REPO)
    assert proc.returncode != 0
    assert proc.stderr.count("the eval set gives no batch") >= 2, proc.stderr[-3000:]



# -- 3. inert data keys warn ---------------------------------------------------------------------------
def _minimal(**sections) -> TrainConfig:
    raw = {"data": {"dataset_path": "d.yaml"}, "model": {"load_from_pretrained_path": "tiny:qwen3_vl"},
           "training": {"max_steps": 2}}
    for name, values in sections.items():
        if isinstance(values, dict):
            raw.setdefault(name, {}).update(values)
        else:
            raw[name] = values
    return TrainConfig.model_validate(raw)


def test_group_by_length_is_honoured_without_packing_and_warned_with_it():
    padded = _minimal(packing={"group_by_length": True})
    assert not [w for w in padded.inert_warnings() if "group_by_length" in w]
    from vlforge.config.data import data_config

    assert data_config(padded).group_by_length is True
    packed = _minimal(packing={"group_by_length": True, "packing": True, "packing_length": 512})
    assert [w for w in packed.inert_warnings() if w.startswith("packing.group_by_length: true has no effect")]


def test_shuffle_is_off_by_default_and_its_sizes_warn_only_without_it():
    assert _minimal().data.shuffle is False
    assert not [w for w in _minimal(data={"shuffle": True}).inert_warnings() if "shuffle" in w]
    notes = [w for w in _minimal(data={"shuffle_buffer": 50}).inert_warnings() if w.startswith("data.shuffle")]
    assert notes == ["data.shuffle_buffer has no effect: data.shuffle is false"]
    from vlforge.config.data import data_config

    cfg = _minimal(data={"shuffle": True, "shuffle_buffer": 50, "shuffle_block": 8})
    piped = data_config(cfg)
    assert (piped.shuffle, piped.shuffle_buffer, piped.shuffle_block) == (True, 50, 8)


@pytest.mark.parametrize(("rmpad", "packing", "warns"), [(True, False, True), (False, True, True),
                                                         (True, True, False), (None, True, False)])
def test_use_rmpad_warns_when_it_disagrees_with_packing(rmpad, packing, warns):
    extra = {} if rmpad is None else {"use_rmpad": rmpad}
    cfg = _minimal(packing={"packing": packing, "packing_length": 512}, **extra)
    assert any(w.startswith("use_rmpad") for w in cfg.inert_warnings()) is warns


# -- 4. resuming on another number of shards neither skips nor repeats records ---------------------------
def _ids(batch: dict) -> list:
    return [tuple(sample) for sample in batch["sample_ids"]]


@pytest.mark.parametrize(("old_world", "new_world", "taken"), [(2, 1, (3, 1)), (3, 2, (2, 0, 1)), (1, 2, (3,))])
def test_remap_to_another_world_size_has_no_gaps_or_duplicates(trainer, checkpoint, old_world, new_world, taken):
    from vlforge.train.checkpoint import remap_data_state

    raw = tiny_config(trainer.output_dir, checkpoint, training={"max_steps": None, "num_train_epochs": 1})
    data_cfg = data_config(TrainConfig.model_validate(raw))
    every = [sid for batch in open_stream(data_cfg, trainer.processor, rank=0, world_size=1) for sid in _ids(batch)]
    seen: list = []
    states = []
    for shard, count in enumerate(taken):  # old shards stopped at different positions
        stream = open_stream(data_cfg, trainer.processor, rank=shard, world_size=old_world)
        for _ in range(count):
            seen.extend(_ids(next(stream)))
        states.append(stream.state_dict())
    for rank in range(new_world):
        stream = open_stream(data_cfg, trainer.processor, rank=rank, world_size=new_world)
        stream.load_state_dict(remap_data_state(states, rank, new_world))
        seen.extend(sid for batch in stream for sid in _ids(batch))
    assert sorted(seen) == sorted(every) and len(every) == 10


def test_remap_twice_before_the_gap_is_passed_keeps_the_record_set(trainer, checkpoint):
    from vlforge.train.checkpoint import remap_data_state

    raw = tiny_config(trainer.output_dir, checkpoint, training={"max_steps": None, "num_train_epochs": 1})
    data_cfg = data_config(TrainConfig.model_validate(raw))
    seen: list = []
    states = []
    for shard, count in enumerate((4, 0)):  # shard 0 is far ahead of shard 1
        stream = open_stream(data_cfg, trainer.processor, rank=shard, world_size=2)
        for _ in range(count):
            seen.extend(_ids(next(stream)))
        states.append(stream.state_dict())
    middle = open_stream(data_cfg, trainer.processor, rank=0, world_size=1)
    middle.load_state_dict(remap_data_state(states, 0, 1))
    seen.extend(_ids(next(middle)))  # one batch, still inside the gap
    final = [open_stream(data_cfg, trainer.processor, rank=r, world_size=3) for r in range(3)]
    for rank, stream in enumerate(final):
        stream.load_state_dict(remap_data_state([middle.state_dict()], rank, 3))
        seen.extend(sid for batch in stream for sid in _ids(batch))
    assert len(seen) == len(set(seen)) == 10


# -- 5. metrics.jsonl on resume keeps only the steps up to the resumed checkpoint -------------------------
def test_resumed_metrics_drop_the_steps_the_killed_run_logged_after_the_checkpoint(tmp_path):
    from vlforge.config.preflight import METRICS_FILE
    from vlforge.train.metrics import MetricsLogger

    old = [{"step": s, "loss": 10.0 - s} for s in range(1, 6)] + [{"step": 4, "eval_loss": 1.0}]
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in old), encoding="utf-8")
    with MetricsLogger(tmp_path, main=False, report_to=[], run_name="r", total_steps=6, progress=False,
                       start_step=3):
        pass  # other ranks never touch the file
    assert len((tmp_path / METRICS_FILE).read_text().splitlines()) == 6
    with MetricsLogger(tmp_path, main=True, report_to=[], run_name="r", total_steps=6, progress=False,
                       start_step=3) as log:
        log.log({"step": 4, "loss": 0.5})
    steps = [json.loads(line)["step"] for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_a_resume_drops_the_stop_record_of_steps_its_checkpoint_carries(tmp_path):
    """A checkpoint at step 3 that holds step 3 for the next record (logging_steps 2): the record a stop wrote at
    step 3 goes (the resumed run logs that step again); the eval record of step 3 stays."""
    from vlforge.config.preflight import METRICS_FILE
    from vlforge.train.metrics import CLOSING_KEY, MetricsLogger

    old = [{"step": 2, "loss": 2.0}, {"step": 3, "eval_loss": 1.0}, {"step": 3, "loss": 9.0},
           {"step": 3, CLOSING_KEY: "data_report.json"}]
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in old), encoding="utf-8")
    with MetricsLogger(tmp_path, main=True, report_to=[], run_name="r", total_steps=6, progress=False,
                       start_step=3, carried_steps=1):
        pass
    assert [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()] == old[:2]


# -- 6. validate and train agree on model.lora (and every other refusal of the trainer) -----------------
LORA_YAML = """
data: {dataset_path: d.yaml}
model: {load_from_pretrained_path: tiny:qwen3_vl, lora: {r: 4, target_modules: [q_proj]}}
training: {max_steps: 2}
"""


def _hide_peft(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))


def test_validate_refuses_lora_without_peft_with_the_error_train_gives(tmp_path, monkeypatch):
    from vlforge.config.preflight import check_supported
    from vlforge.config.validate import check
    from vlforge.errors import ConfigError
    from vlforge.models.adapters import PEFT_MISSING

    path = tmp_path / "lora.yaml"
    path.write_text(LORA_YAML, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.yaml").write_text("- {path: d.jsonl}\n", encoding="utf-8")
    (tmp_path / "d.jsonl").write_text(  # validate checks that data files exist and hold records
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n',
        encoding="utf-8")
    ok = check(path)
    assert ok.ok and not [w for w in ok.resolved.warnings if "lora" in w]  # peft is installed here
    _hide_peft(monkeypatch)
    report = check(path)
    assert not report.ok and report.error_lines() == [f"{path}: {PEFT_MISSING}"]
    with pytest.raises(ConfigError, match=r"model\.lora needs peft"):
        check_supported(ok.resolved.config)


def test_validate_refuses_fp16_like_train(tmp_path):
    from vlforge.config.validate import check

    path = tmp_path / "fp16.yaml"
    path.write_text(LORA_YAML.replace("max_steps: 2", "max_steps: 2, fp16: true"), encoding="utf-8")
    report = check(path)
    assert not report.ok and "training.fp16" in report.error_lines()[0]


# -- 1 (end to end). two ranks, packed, three epochs: runs the counted schedule to its end -----------------
@pytest.mark.slow
def test_two_rank_multi_epoch_packed_run_finishes_its_schedule(tmp_path, checkpoint):
    # here one epoch counts 1 batch per rank but three unflushed epochs give 2, not 3
    cfg = tiny_config(tmp_path / "out", checkpoint, packing={"packing": True, "packing_length": 400},
                      training={"max_steps": None, "num_train_epochs": 3})
    config = write_config(tmp_path / "run.yaml", cfg)
    proc = subprocess.run(train_command(config, 2), env=train_env(), capture_output=True, text=True,
                          timeout=500, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "data ran out" not in proc.stderr
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == list(range(1, len(steps) + 1)) and steps and records[-1]["epoch_progress"] == 1.0
