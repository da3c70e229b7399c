"""Multi-process and kill/resume parity of the trainer (torchrun over gloo on CPU; slow)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from trainkit import (
    REPO,
    exported_weights,
    kill_launch,
    logged,
    max_abs_diff,
    run_training,
    tiny_config,
    train_command,
    train_env,
    write_config,
)

import warmstart
from vlforge.config.schema import TrainConfig
from vlforge.train.export import export_checkpoint
from vlforge.train.trainer import Trainer

pytestmark = pytest.mark.slow


def _losses(output_dir: Path) -> list[float]:
    return logged(output_dir, "loss")


@pytest.fixture(scope="module")
def model_path(tiny_checkpoint):
    return tiny_checkpoint("qwen3_vl")


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory, model_path):
    """2 gloo ranks x 2 micro-batches x 2 steps, clipped to norm 1 (the raw norm is about 3.5), a checkpoint per step;
    shuffled records (the shuffled order is global: the same samples in 1 or 2 processes)."""
    root = tmp_path_factory.mktemp("two-ranks")
    cfg = tiny_config(root / "out", model_path, training={"gradient_accumulation_steps": 2, "max_grad_norm": 1.0},
                      checkpointing={"save_steps": 1}, data={"shuffle": True, "seed": 5})
    run_training(write_config(root / "run.yaml", cfg), 2)
    return root / "out", cfg


def test_two_ranks_equal_one_rank(tmp_path, model_path, two_rank_run):
    out2, _ = two_rank_run
    cfg = tiny_config(tmp_path / "out", model_path, training={"gradient_accumulation_steps": 4, "max_grad_norm": 1.0},
                      data={"shuffle": True, "seed": 5})
    run_training(write_config(tmp_path / "run.yaml", cfg), 1)
    one, two = _losses(tmp_path / "out"), _losses(out2)
    assert len(one) == len(two) == 2
    assert one == pytest.approx(two, rel=1e-5)
    norms = [logged(tmp_path / "out", "grad_norm"), logged(out2, "grad_norm")]
    assert norms[0] == pytest.approx(norms[1], rel=1e-5) and min(norms[0]) > 1.0  # global norm over shards
    assert one[1] < one[0]
    weights_one, weights_two = exported_weights(tmp_path / "out" / "final"), exported_weights(out2 / "final")
    start = exported_weights(model_path)
    assert max_abs_diff(weights_one, start) > 1e-4  # training moved the weights ...
    assert max_abs_diff(weights_one, weights_two) < 1e-6  # ... identically in 1 and 2 processes


def test_resume_from_two_ranks_onto_one(tmp_path, model_path, two_rank_run):
    out2, base = two_rank_run
    ckpt1 = out2 / "checkpoint-1"
    assert json.loads((ckpt1 / "trainer_state.json").read_text())["world_size"] == 2
    reference = exported_weights(export_checkpoint(ckpt1, tmp_path / "ref"))
    cfg = TrainConfig.model_validate({**base, "training": {**base["training"], "gradient_accumulation_steps": 4},
                                      "checkpointing": {"output_dir": str(tmp_path / "out"), "resume": str(ckpt1)}})
    trainer = Trainer(cfg, progress=False, export=False)
    trainer.setup()
    assert trainer.step == 1
    state = {k: v.detach() for k, v in trainer.model.state_dict().items()}
    assert max_abs_diff({k: state[k] for k in reference}, reference) == 0.0
    adam = trainer.optimizer.state_dict()["state"]
    assert adam and all(float(s["step"]) == 1.0 for s in adam.values())
    assert any(float(s["exp_avg"].abs().max()) > 0 for s in adam.values())
    # The 2 ranks read the first 4 shuffled records in step 1; the one rank continues with the 5th, nothing skipped.
    from vlforge.train.data_setup import open_stream

    order = open_stream(trainer.data_cfg, trainer.processor, rank=0, world_size=1, base_dir=".")
    expected = [next(order)["sample_ids"] for _ in range(5)]
    assert [ids[0][1] for ids in expected] != ["line 1", "line 2", "line 3", "line 4", "line 5"]  # shuffled
    batch = next(trainer.stream)
    assert batch["sample_ids"] == expected[4]
    result = trainer.train()
    assert result.steps == 2 and result.resumed_from == ckpt1
    assert (tmp_path / "out" / "checkpoint-2" / "trainer_state.json").is_file()


def test_sigkill_mid_epoch_then_resume_matches_uninterrupted(tmp_path, model_path):
    cfg = tiny_config(tmp_path / "ref", model_path, packing={"packing": True, "packing_length": 160},
                      training={"max_steps": 6, "gradient_accumulation_steps": 2},
                      checkpointing={"save_steps": 2, "resume": "auto"},
                      data={"shuffle": True, "shuffle_buffer": 3, "shuffle_block": 2})  # buffer state crosses the kill
    config = write_config(tmp_path / "run.yaml", cfg)
    run_training(config, 1)

    out = tmp_path / "killed"
    override = f"checkpointing.output_dir={out}"
    proc = subprocess.Popen(train_command(config, 1, override), env=train_env(), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while not (out / "checkpoint-2").exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    warmstart.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "final").exists() and not (out / "checkpoint-6").exists()  # really interrupted

    resumed = run_training(config, 1, override)
    assert "resumed from" in resumed.stderr
    final_ref, final_resumed = exported_weights(tmp_path / "ref" / "final"), exported_weights(out / "final")
    assert final_ref.keys() == final_resumed.keys()
    assert all(torch.equal(final_ref[k], final_resumed[k]) for k in final_ref)
    assert _losses(out)[-1] == _losses(tmp_path / "ref")[-1]


def test_sigkill_of_two_shuffled_ranks_then_resume_matches_uninterrupted(tmp_path, model_path):
    """Two processes, shuffled packed data: killed after checkpoint-2 of 4, resumed, the same weights as one go."""
    cfg = tiny_config(tmp_path / "ref", model_path, packing={"packing": True, "packing_length": 160},
                      training={"max_steps": 4}, checkpointing={"save_steps": 2, "resume": "auto"},
                      data={"shuffle": True, "shuffle_buffer": 4, "shuffle_block": 2, "seed": 7})
    config = write_config(tmp_path / "run.yaml", cfg)
    run_training(config, 2)

    out = tmp_path / "killed"
    override = f"checkpointing.output_dir={out}"
    proc = subprocess.Popen(train_command(config, 2, override), env=train_env(), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while not (out / "checkpoint-2").exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    kill_launch(proc)  # torchrun and both ranks (each rank runs in a session of its own)
    assert not (out / "final").exists() and not (out / "checkpoint-4").exists()

    resumed = run_training(config, 2, override)
    assert "resumed from" in resumed.stderr
    final_ref, final_resumed = exported_weights(tmp_path / "ref" / "final"), exported_weights(out / "final")
    assert all(torch.equal(final_ref[k], final_resumed[k]) for k in final_ref)
    assert _losses(out)[-1] == _losses(tmp_path / "ref")[-1]
