"""Mixture-of-experts training: the router's load-balancing loss exactly as transformers adds it.

Tiny Qwen3-VL-MoE, Qwen3.5-MoE and GLM-4.5V checkpoints with the router loss turned on (``output_router_logits``) and a
coefficient of 0.02 through ``model.overwrite_config``. The plain transformers reference is the checkpoint loaded
with ``AutoModelForImageTextToText`` and given the same padded batch with ``labels``: its ``loss`` (token mean +
coefficient x ``aux_loss``) and its gradients must be vlforge's objective and gradients.
"""

from __future__ import annotations

import json

import pytest
import torch
from trainkit import exported_weights, max_abs_diff, run_training, tiny_config, write_config

from vlforge.config.schema import TrainConfig
from vlforge.train.loss import model_inputs
from vlforge.train.trainer import Trainer

COEF = 0.02
FAMILIES = ("qwen3_vl_moe", "qwen3_5_moe", "glm4v_moe")


def _trainer(tmp_path, checkpoint, **model) -> Trainer:
    cfg = tiny_config(tmp_path / "out", checkpoint, training={"per_device_train_batch_size": 3, "max_steps": 1},
                      model={"patch": False, "token_audit": False, "memory_plan": False, **model})
    trainer = Trainer(TrainConfig.model_validate(cfg), progress=False, export=False)
    trainer.setup()
    return trainer


@pytest.mark.parametrize("family", FAMILIES)
def test_first_step_equals_transformers_with_the_router_loss(tmp_path, tiny_checkpoint, family):
    from transformers import AutoModelForImageTextToText

    checkpoint = tiny_checkpoint(family)
    trainer = _trainer(tmp_path, checkpoint, overwrite_config={"output_router_logits": True,
                                                               "router_aux_loss_coef": COEF})
    assert trainer.router_coef == COEF
    batch = next(trainer.stream)
    count, loss_sum = trainer.accumulate([batch])
    trainer.stream.close()
    objective = float(loss_sum / count) + COEF * float(trainer.step_router_aux)
    ours = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}

    reference = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).train()
    reference.config.text_config.router_aux_loss_coef = COEF
    out = reference(**model_inputs(batch, "cpu"), labels=batch["labels"], use_cache=False, output_router_logits=True)
    out.loss.backward()
    assert float(trainer.step_router_aux) == pytest.approx(float(out.aux_loss), abs=1e-6)
    assert objective == pytest.approx(float(out.loss), abs=1e-5)
    theirs = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    assert ours.keys() == theirs.keys() and any(".gate." in n or n.endswith("gate.weight") for n in ours)
    for name, grad in theirs.items():
        torch.testing.assert_close(ours[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_router_loss_is_off_as_the_checkpoint_says_and_logged_when_on(tmp_path, tiny_checkpoint):
    checkpoint = tiny_checkpoint("qwen3_5_moe")
    assert _trainer(tmp_path / "off", checkpoint).router_coef == 0.0  # output_router_logits: false (released)
    trainer = _trainer(tmp_path / "on", checkpoint, overwrite_config={"output_router_logits": True})
    assert trainer.router_coef == pytest.approx(0.001)  # the checkpoint's own coefficient
    result = trainer.train()
    records = [json.loads(line) for line in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    [step] = [r for r in records if "loss" in r]
    assert step["aux_loss"] > 0.5 and step["loss"] > 0  # logged next to the language-model loss


def _metrics(out) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.mark.slow  # two torchrun launches
def test_two_fsdp2_ranks_with_experts_in_their_units_train_like_one(tmp_path, tiny_checkpoint):
    """Qwen3.5-MoE with the router loss on: FSDP2 over two gloo ranks (the fused experts sharded inside each decoder
    layer's unit) gives the losses, router losses and weights of one process with the same global batch. One sample
    per micro-batch: the router loss is a per-forward statistic, so the same forwards must happen in both runs."""
    checkpoint = tiny_checkpoint("qwen3_5_moe")
    runs = {}
    for ranks, accumulation in ((1, 4), (2, 2)):
        cfg = tiny_config(tmp_path / f"out{ranks}", checkpoint, training={"gradient_accumulation_steps": accumulation},
                          model={"token_audit": False, "memory_plan": False,
                                 "overwrite_config": {"output_router_logits": True, "router_aux_loss_coef": COEF}})
        run_training(write_config(tmp_path / f"run{ranks}.yaml", cfg), ranks)
        runs[ranks] = tmp_path / f"out{ranks}"
    one, two = _metrics(runs[1]), _metrics(runs[2])
    assert [r["loss"] for r in one] == pytest.approx([r["loss"] for r in two], rel=1e-5)
    assert [r["aux_loss"] for r in one] == pytest.approx([r["aux_loss"] for r in two], rel=1e-5)
    assert max_abs_diff(exported_weights(runs[1] / "final"), exported_weights(runs[2] / "final")) < 1e-6
    assert max_abs_diff(exported_weights(runs[1] / "final"), exported_weights(checkpoint)) > 1e-4


@pytest.mark.slow  # two launches
def test_glm45v_pure_bf16_shards_its_fp32_routers_as_their_own_units(tmp_path, tiny_checkpoint):
    """GLM-4.5V keeps its routers in fp32 in a bf16 model (transformers' ``_keep_in_fp32_modules_strict``); FSDP2
    shards one dtype per unit, so a pure-bf16 run on two ranks needs them as units of their own. Its losses follow
    one process's (bf16: loosely) and the routers train."""
    checkpoint = tiny_checkpoint("glm4v_moe")
    runs = {}
    for ranks, accumulation in ((1, 2), (2, 1)):
        cfg = tiny_config(tmp_path / f"out{ranks}", checkpoint,
                          training={"gradient_accumulation_steps": accumulation, "max_steps": 2, "bf16": True},
                          fsdp={"mixed_precision": "pure_bf16"},
                          model={"token_audit": False, "memory_plan": False,
                                 "overwrite_config": {"output_router_logits": True, "router_aux_loss_coef": COEF}})
        proc = run_training(write_config(tmp_path / f"run{ranks}.yaml", cfg), ranks)
        runs[ranks] = (tmp_path / f"out{ranks}", proc.stderr)
    assert "FSDP2: 1 module(s) kept in float32 by the model (Glm4vMoeTextTopkRouter)" in runs[2][1]
    one, two = _metrics(runs[1][0]), _metrics(runs[2][0])
    assert len(one) == len(two) == 2 and all(r["aux_loss"] > 0 for r in two)
    assert [r["loss"] for r in one] == pytest.approx([r["loss"] for r in two], rel=2e-2)
    start, trained = exported_weights(checkpoint), exported_weights(runs[2][0] / "final")
    router = [k for k in trained if k.endswith("mlp.gate.weight")]
    assert router and all(float((trained[k].float() - start[k].float()).abs().max()) > 0 for k in router)
