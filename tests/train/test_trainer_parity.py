"""Parity of the trainer's maths on a tiny Qwen3-VL (CPU, fp32): packing and gradient accumulation."""

from __future__ import annotations

import pytest
import torch
from trainkit import tiny_config, token_mean_grads

from vlforge.config.schema import TrainConfig
from vlforge.train.loss import (
    IGNORE_INDEX,
    label_count,
    model_inputs,
    packed_kwargs,
    target_mask,
    token_loss_sum,
)
from vlforge.train.trainer import Trainer


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("qwen3_vl")


def _trainer(tmp_path, checkpoint, **sections) -> Trainer:
    cfg = TrainConfig.model_validate(tiny_config(tmp_path / "out", checkpoint, **sections))
    trainer = Trainer(cfg, progress=False, export=False)
    trainer.setup()
    return trainer


def test_packed_rows_equal_separate_samples_in_loss_and_grads(tmp_path, checkpoint):
    packed_equals_separate(tmp_path, checkpoint)


@pytest.mark.parametrize("family", ["glm4v", "glm4v_moe"])
def test_glm_rows_of_images_and_a_video_equal_separate_samples(tmp_path, tiny_checkpoint, family):
    """GLM-4V writes videos with the image placeholder: a row holding both (stock transformers 5.24 refuses it)
    trains as its samples do one by one, each of which the stock placeholder mask places right."""
    packed_equals_separate(tmp_path, tiny_checkpoint(family))


def packed_equals_separate(tmp_path, checkpoint) -> None:
    packed = _trainer(tmp_path, checkpoint, packing={"packing": True, "packing_length": 400})
    row = next(packed.stream)
    n = len(row["sample_ids"])
    assert n >= 4 and "video_grid_thw" in row and "image_grid_thw" in row  # images, video and text in one row
    loss_packed, grads_packed = token_mean_grads(packed, [row])

    separate = _trainer(tmp_path, checkpoint)  # same model, padded batches of one sample, same record order
    by_id: dict = {}
    while len(by_id) < 10:  # the example set's 10 records, in reading order
        batch = next(separate.stream)
        by_id.setdefault(batch["sample_ids"][0], batch)
    samples = [by_id[sample_id] for sample_id in row["sample_ids"]]
    assert int(sum(label_count(s) for s in samples)) == int(label_count(row))
    loss_separate, grads_separate = token_mean_grads(separate, samples)

    assert loss_packed == pytest.approx(loss_separate, rel=1e-5)
    assert grads_packed.keys() == grads_separate.keys()
    worst = max(float((grads_packed[k] - grads_separate[k]).abs().max()) for k in grads_packed)
    scale = max(float(g.abs().max()) for g in grads_separate.values())
    assert worst <= 1e-4 * scale, (worst, scale)

    # Negative control: without the row's sample boundaries the samples of a row attend to each other.
    model = packed.model
    inputs = model_inputs(row, "cpu")
    with torch.no_grad():
        isolated = model(**inputs, **packed_kwargs(row, "cpu"), use_cache=False).logits
        crossed = model(**inputs).logits
    assert not torch.allclose(isolated, crossed, atol=1e-4)


def test_label_mask_never_predicts_across_packed_samples():
    labels = torch.tensor([[IGNORE_INDEX, 1, 2, 3, 4, 5]])
    batch = {"labels": labels, "cu_seqlens": torch.tensor([0, 3, 6], dtype=torch.int32)}
    mask = target_mask(batch)
    assert mask.tolist() == [[True, True, False, True, True]]  # position 2 would predict sample 2's first token
    assert int(label_count(batch)) == 4


def test_gradient_accumulation_4x1_equals_1x4(tmp_path, checkpoint):
    one_by_four = _trainer(tmp_path, checkpoint, training={"per_device_train_batch_size": 4})
    next(one_by_four.stream)
    big = next(one_by_four.stream)  # records 5-8: different lengths, so the batch of 4 carries padding
    assert big["input_ids"].shape[0] == 4 and int(big["attention_mask"].sum()) < big["attention_mask"].numel()
    loss_big, grads_big = token_mean_grads(one_by_four, [big])

    four_by_one = _trainer(tmp_path, checkpoint, training={"gradient_accumulation_steps": 4})
    four_by_one._draw()
    small = four_by_one._draw()
    assert [b["sample_ids"][0] for b in small] == big["sample_ids"]
    loss_small, grads_small = token_mean_grads(four_by_one, small)

    assert loss_small == pytest.approx(loss_big, rel=1e-5)
    scale = max(float(g.abs().max()) for g in grads_big.values())
    worst = max(float((grads_big[k] - grads_small[k]).abs().max()) for k in grads_big)
    assert worst <= 1e-4 * scale, (worst, scale)
    # A per-micro-batch mean (the peer engine's loss) would weight samples differently: make sure it differs.
    with torch.no_grad():
        per_batch = sum(float(token_loss_sum(four_by_one.model, b, "cpu") / label_count(b)) for b in small) / 4
    assert per_batch != pytest.approx(loss_big, rel=1e-4)


def test_gradient_checkpointing_keeps_loss_and_grads(tmp_path, checkpoint):
    plain = _trainer(tmp_path, checkpoint)
    batches = plain._draw()
    loss_plain, grads_plain = token_mean_grads(plain, batches)
    recompute = _trainer(tmp_path, checkpoint, model={"gradient_checkpointing": True,
                                                      "load_from_pretrained_path": str(checkpoint)})
    assert recompute.model.is_activation_checkpointing
    loss_gc, grads_gc = token_mean_grads(recompute, batches)
    assert loss_gc == pytest.approx(loss_plain, rel=1e-6)
    assert all(torch.allclose(grads_gc[k], grads_plain[k], rtol=1e-4, atol=1e-7) for k in grads_plain)


def test_bf16_compute_keeps_fp32_master_weights(tmp_path, checkpoint):
    fp32 = _trainer(tmp_path, checkpoint)
    batches = fp32._draw()
    loss_fp32, _ = token_mean_grads(fp32, batches)
    bf16 = _trainer(tmp_path, checkpoint, training={"bf16": True})
    assert bf16.tm.autocast and bf16.tm.compute_dtype == torch.bfloat16
    loss_bf16, grads = token_mean_grads(bf16, batches)
    assert loss_bf16 == pytest.approx(loss_fp32, rel=2e-2) and loss_bf16 != loss_fp32
    assert {p.dtype for p in bf16.model.parameters()} == {torch.float32}
    assert {g.dtype for g in grads.values()} == {torch.float32}
