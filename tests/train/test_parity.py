"""Parity of vlforge's labels and first-step loss with a transformers-only reference and with LMMS Engine.

The data are real files (``benchmarks/peers/parity_data.py``: PNGs, an H.264 MP4, a system prompt,
several assistant turns, a chat without a system prompt); the models the tiny Qwen2.5-VL and Qwen3-VL
presets in fp32. The reference (``benchmarks/peers/hf_reference.py``) uses the checkpoint's chat
template, its processor and a token rule for the labels, none of vlforge's text, label or loss code.
The LMMS Engine comparisons run its own data processor in its own venv and skip when
``python scripts/peer_env.py build`` has not been run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainkit import REPO

from vlforge.config.schema import TrainConfig
from vlforge.train.loss import label_count
from vlforge.train.trainer import Trainer

sys.path.insert(0, str(REPO / "benchmarks" / "peers"))
import hf_reference
from parity_data import MAX_PIXELS, MIN_PIXELS, RECORDS, SAMPLE_FPS, write_dataset

sys.path.insert(0, str(REPO / "scripts"))
import itertools

from peer_env import peer_python

FAMILIES = ("qwen2_5_vl", "qwen3_vl")
PEER = peer_python()
NEEDS_PEER = pytest.mark.skipif(PEER is None, reason="LMMS Engine's venv is not built: python scripts/peer_env.py build")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("parity-data"))


@pytest.fixture(scope="module")
def reference(data, tiny_checkpoint):
    cache: dict[str, list[dict]] = {}

    def get(family: str) -> list[dict]:
        if family not in cache:
            cache[family] = hf_reference.reference(tiny_checkpoint(family), data, family)
        return cache[family]

    return get


def first_batch(tmp_path: Path, checkpoint: Path, data: Path, *, packing: bool, label_mode: str = "assistant"):
    """vlforge's first training batch of the parity data (all four records) and its loss from the trainer."""
    cfg = TrainConfig.model_validate({
        "data": {"dataset_path": str(data), "label_mode": label_mode},
        "processor": {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS},
        "video": {"fps": SAMPLE_FPS, "video_min_pixels": MIN_PIXELS, "video_max_pixels": MAX_PIXELS},
        "packing": {"packing": packing, "packing_length": 1024},
        "model": {"load_from_pretrained_path": str(checkpoint)},
        "training": {"num_train_epochs": 1, "learning_rate": 1e-3, "per_device_train_batch_size": 1 if packing else 4,
                     "seed": 0},
        "checkpointing": {"output_dir": str(tmp_path / "out"), "resume": "none"},
    })
    trainer = Trainer(cfg, progress=False, export=False)
    trainer.setup()
    batch = next(trainer.stream)
    count, loss_sum = trainer.accumulate([batch])
    trainer.stream.close()
    return batch, float(loss_sum / count), int(count)


def per_sample(batch: dict) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of each sample of a padded batch or a packed row, in record order."""
    if "cu_seqlens" in batch:
        cu = batch["cu_seqlens"].tolist()
        rows = [(batch["input_ids"][0, a:b], batch["labels"][0, a:b]) for a, b in itertools.pairwise(cu)]
    else:
        rows = [(ids[mask.bool()], labels[mask.bool()])
                for ids, labels, mask in zip(batch["input_ids"], batch["labels"], batch["attention_mask"], strict=True)]
    order = sorted(range(len(rows)), key=lambda i: batch["sample_ids"][i])
    return [(rows[i][0].tolist(), rows[i][1].tolist()) for i in order]


def supervised(labels: list[int]) -> list[int]:
    return [i for i, label in enumerate(labels) if label != -100]


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("family", (*FAMILIES, "qwen3_5", "qwen3_5_moe"))
def test_first_step_equals_transformers_reference(tmp_path, tiny_checkpoint, data, reference, family, packing):
    ref = reference(family)
    batch, loss, count = first_batch(tmp_path, tiny_checkpoint(family), data, packing=packing)
    samples = per_sample(batch)
    assert len(samples) == len(RECORDS) == len(ref)
    assert ("cu_seqlens" in batch) == packing and "video_grid_thw" in batch and "image_grid_thw" in batch
    for (ids, labels), expected in zip(samples, ref, strict=True):
        assert ids == expected["input_ids"]  # same template, same placeholder expansion
        assert supervised(labels) == supervised(expected["labels"])  # the exact supervised positions
        assert labels == expected["labels"]
    assert count == sum(r["predicted"] for r in ref)
    assert count == 45 or family.startswith("qwen3_5")  # 12 + 13 + 8 + 12 assistant tokens (Qwen3's vocabulary)
    # Qwen3.5's packed row: its Gated DeltaNet layers restart at each sample (vlforge.models.linear_attention), so
    # the row's loss is the per-record reference's
    # one step over all records: the token-weighted mean of the samples' losses (also for a packed row)
    assert loss == pytest.approx(sum(r["loss_sum"] for r in ref) / count, abs=1e-5)


def test_reference_rule_is_assistant_content_and_end_of_turn(reference, tiny_checkpoint):
    """The convention itself, spelled out on the issue's case (system prompt, image, two replies)."""
    from transformers import AutoTokenizer

    ref = reference("qwen2_5_vl")[0]
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint("qwen2_5_vl"))
    assert tok.decode([t for t in ref["labels"] if t != -100]) == "A red circle on a blue background.<|im_end|>Red.<|im_end|>"
    assert ref["predicted"] == 12


# --- LMMS Engine's masking (data.label_mode: lmms) ---------------------------------------------------

LMMS_SAMPLE0 = ("<|im_start|><|im_end|>"  # system turn: its special tokens
                "<|im_start|><|vision_start|><|vision_end|><|im_end|>"  # user turn: its special tokens
                "<|im_start|>A red circle on a blue background.<|im_end|>\n"  # reply, end of turn and newline
                "<|im_start|><|im_end|>"
                "<|im_start|>Red.<|im_end|>\n")


@pytest.mark.parametrize("family", FAMILIES)
def test_lmms_label_mode_follows_the_hand_written_rule(tmp_path, tiny_checkpoint, data, family):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint(family))
    batch, loss, count = first_batch(tmp_path, tiny_checkpoint(family), data, packing=False, label_mode="lmms")
    samples = per_sample(batch)
    ids, labels = samples[0]
    assert tok.decode([t for t in labels if t != -100]) == LMMS_SAMPLE0
    assert len(supervised(labels)) == 24  # the count: 24 where the default supervises 12
    # newline after each <|vision_end|> (LMMS's template), and a system prompt without a full stop
    text = tok.decode(samples[1][0])
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n")
    assert "<|vision_end|>\n<|vision_start|>" in text
    for ids, labels in samples:
        for token, label in zip(ids, labels, strict=True):
            name = tok.convert_ids_to_tokens(token)
            if name in ("<|image_pad|>", "<|video_pad|>"):
                assert label == -100
            elif name in ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"):
                assert label == token
    assert count == sum(len(supervised(labels)) - (labels[0] != -100) for _, labels in samples)
    assert loss > 0


def test_lmms_label_mode_is_refused_for_families_lmms_does_not_process():
    from vlforge.data.processor import QwenVLProcessor
    from vlforge.data.vision_settings import VisionSettings
    from vlforge.errors import ConfigError

    with pytest.raises(ConfigError, match=r"label_mode 'lmms'.*'glm4v'"):
        QwenVLProcessor(object(), VisionSettings.for_family("glm4v"), "glm4v", label_mode="lmms")
    with pytest.raises(ConfigError, match="label_mode must be one of"):
        QwenVLProcessor(object(), VisionSettings.for_family("qwen3_vl"), "qwen3_vl", label_mode="all")


def run_lmms(checkpoint: Path, family: str, data: Path) -> dict:
    """LMMS Engine's own trainer for two steps (hf_trainer on the CPU, benchmarks/peers/lmms_train.py) and, from the
    same process before training, its processor's samples with their first-step loss sums (``--samples``: what
    benchmarks/peers/lmms_runner.py --loss prints)."""
    cmd = [str(PEER), str(REPO / "benchmarks" / "peers" / "lmms_train.py"), "--checkpoint", str(checkpoint),
           "--family", family, "--data", str(data), "--steps", "2", "--fps", str(SAMPLE_FPS),
           "--min-pixels", str(MIN_PIXELS), "--max-pixels", str(MAX_PIXELS), "--samples"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def lmms_run(tiny_checkpoint, data):
    """``lmms_run(family)``: one LMMS Engine peer run per family (:func:`run_lmms`), shared by this module's tests."""
    runs: dict[str, dict] = {}

    def get(family: str) -> dict:
        if family not in runs:
            runs[family] = run_lmms(tiny_checkpoint(family), family, data)
        return runs[family]

    return get


@NEEDS_PEER
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_lmms_label_mode_equals_lmms_engine_processor(tmp_path, tiny_checkpoint, data, lmms_run, family):
    peer = lmms_run(family)["runner"]
    batch, _, _ = first_batch(tmp_path, tiny_checkpoint(family), data, packing=False, label_mode="lmms")
    ours = per_sample(batch)
    assert len(peer["samples"]) == len(ours)
    for (ids, labels), theirs in zip(ours, peer["samples"], strict=True):
        assert ids == theirs["input_ids"]
        assert supervised(labels) == supervised(theirs["labels"])
        assert labels == theirs["labels"]


@NEEDS_PEER
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_lmms_engine_trainer_step1_loss_equals_runner_loss(lmms_run, family):
    """LMMS Engine's own trainer (hf_trainer on the CPU) against its processor's loss at the same weights."""
    trained = lmms_run(family)
    peer = trained["runner"]
    count = sum(s["predicted"] for s in peer["samples"])
    assert trained["device"] == "cpu:0" and trained["dtype"] == "float32" and trained["steps"] == 2
    # step 1 is before any update: the padded batch's token-weighted mean equals the per-sample sums
    assert trained["loss"] == pytest.approx(sum(s["loss_sum"] for s in peer["samples"]) / count, abs=1e-5)
    assert trained["losses"][1] < trained["losses"][0]  # the optimiser stepped
    # tokens of a step: the non-padding tokens of all four samples, vlforge's count for a padded batch
    assert trained["step_tokens"] == [sum(len(s["input_ids"]) for s in peer["samples"])] * 2
    assert trained["tokens_per_s"] > 0


def test_label_count_counts_predicted_labels_only():
    """The position-0 label (LMMS labels the first <|im_start|>) is never predicted, so never counted."""
    batch = {"labels": torch.tensor([[151644, -100, 5, 6]])}
    assert int(label_count(batch)) == 2
