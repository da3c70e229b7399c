"""Ulysses SP for Qwen2.5-VL, Qwen2-VL, GLM-4V, Qwen3.5 and the MoE families: SP=2 == one process, 2x2 end to end, resume, eval.

One ``torchrun`` launch (2 gloo ranks) runs every family's cases through the worker of
test_trainer_sp.py; each test then computes the same batch's loss and gradients with SP=1 here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_trainer_sp import check_training_matches, one_process, result_file, run_sp
from trainkit import tiny_config

from vlforge.config.parallel import check_sequence_parallel
from vlforge.config.schema import TrainConfig
from vlforge.train.sp import text_model
from vlforge.train.trainer import Trainer

#: (family, case) pairs of the shared launch: images, a video (Qwen2.5-VL: second_per_grid_ts in the
#: mrope positions), a packed row (images, a video and text), padded rows, and recomputation.
ENTRIES = [
    *(("qwen2_5_vl", case) for case in ("image", "video", "packed", "padded", "packed_gc")),
    *(("qwen2_vl", case) for case in ("image", "video", "packed", "packed_gc")),
    # GLM-4V: its packed row holds images and a video under one placeholder id (vlforge.models.media_mask).
    *(("glm4v", case) for case in ("image", "video", "packed")),
    # Qwen3.5: its Gated DeltaNet layers split by heads too; one row (samples + the pad tail), padded rows, and a
    # packed row under recomputation (the linear layers' all-to-alls run again in the backward).
    *(("qwen3_5", case) for case in ("image", "padded", "packed_gc")),
    # The MoE families with the router loss on: its token statistics are summed over the group (a packed row with
    # Qwen3.5-MoE's linear attention, padded rows whose pads the router loss leaves out, Qwen3-VL-MoE's deepstack).
    *(("qwen3_5_moe", case) for case in ("router_packed", "router_padded")),
    ("qwen3_vl_moe", "router_packed"),
    ("glm4v_moe", "router_packed"),  # GLM-4.5V: a dense first layer, sigmoid-scored experts, a shared expert
]
FAMILIES = sorted({family for family, _ in ENTRIES})


@pytest.fixture(scope="module")
def models(tiny_checkpoint):
    return {family: tiny_checkpoint(family) for family in FAMILIES}


@pytest.fixture(scope="module")
def families_sp2(tmp_path_factory, models):
    workdir = tmp_path_factory.mktemp("sp2-families")
    run_sp(workdir, models, 2, 2, [f"{family}:{case}" for family, case in ENTRIES])
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize(("family", "case"), ENTRIES, ids=[f"{f}-{c}" for f, c in ENTRIES])
def test_sp2_equals_one_process(tmp_path, models, families_sp2, family, case):
    saved = torch.load(result_file(families_sp2, f"{family}:{case}"), weights_only=False)
    one_process(tmp_path, models[family], case, saved)


@pytest.mark.slow
def test_qwen2_5_vl_dp2_x_sp2_and_resume_without_sp(tmp_path, models):
    """4 processes (dp=2 x sp=2) == one process with 2 accumulation steps; checkpoint-1 resumes with SP=1."""
    check_training_matches(tmp_path, models["qwen2_5_vl"], 4, 2, packed=False)


def _eval_losses(output_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [record["eval_loss"] for record in records if "eval_loss" in record]


@pytest.mark.slow
def test_eval_loss_under_sp2_equals_one_process(tmp_path, models):
    """training.eval_strategy steps: the eval loss of SP=2 (padded rows of 2, mask path) equals SP=1."""
    from trainkit import DATASET, run_training, write_config

    def config(name: str) -> dict:
        return tiny_config(tmp_path / name, models["qwen2_5_vl"], data={"eval_dataset_path": str(DATASET)},
                           training={"max_steps": 1, "eval_strategy": "steps", "eval_steps": 1,
                                     "per_device_train_batch_size": 2})

    sp_cfg = {**config("sp"), "sp_ulysses_degree": 2}
    run_training(write_config(tmp_path / "sp.yaml", sp_cfg), 2)
    result = Trainer(TrainConfig.model_validate(config("ref")), progress=False, export=False).train()
    assert len(result.eval_losses) == 1 and result.eval_losses[0] > 0
    assert _eval_losses(tmp_path / "sp") == pytest.approx(result.eval_losses, rel=1e-5)


# -- fast -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_families_are_accepted_and_heads_checked(models, family):
    from vlforge.config.parallel import sequence_parallel_heads
    from vlforge.errors import ConfigError
    from vlforge.models import load

    model = load(str(models[family]), processor=False, tokenizer=False).model
    text = text_model(model)
    heads = sequence_parallel_heads(model.config)
    check_sequence_parallel(2, family=family, world=2, **heads)
    assert heads["heads"] == 4 and type(text).__name__.endswith("TextModel")
    with pytest.raises(ConfigError, match=r"sp_ulysses_degree: 3 does not divide the 4 attention heads"):
        check_sequence_parallel(3, family=family, world=3, **heads)
    if family.startswith("qwen3_5"):  # 4 attention heads take 4 ranks, the 2 Gated DeltaNet key heads do not
        assert heads["linear_key_heads"] == 2
        with pytest.raises(ConfigError, match=r"4 does not divide the 2 key heads of the text model's Gated DeltaNet"):
            check_sequence_parallel(4, family=family, world=4, **heads)
    else:
        assert heads["linear_key_heads"] is None


def test_an_unknown_family_is_refused_in_one_line():
    from vlforge.errors import ConfigError

    with pytest.raises(ConfigError, match=r"not supported for model family 'llava' \(supported: .*qwen3_5_moe"):
        check_sequence_parallel(2, family="llava", heads=4, world=2)
