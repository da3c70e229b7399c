"""Both training configs of the LMMS Engine guide validate exactly as published, with the right values."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch
from cfgkit import GUIDE_NAMES, HERE, SEEDS, guide_path

from vlforge.config import load_config, resolve_config


@pytest.mark.parametrize("name", GUIDE_NAMES)
def test_guide_copy_is_verbatim(name: str) -> None:
    copy = (HERE / "guide_configs" / name).read_bytes()
    if (SEEDS / name).is_file():
        assert copy == (SEEDS / name).read_bytes()
    assert copy.startswith(b"- type: trainer\n  config:\n")


@pytest.mark.parametrize("name", GUIDE_NAMES)
def test_guide_validates_in_list_layout(name: str) -> None:
    resolved = resolve_config(guide_path(name))
    assert resolved.layout == "lmms_list"
    cfg = resolved.config
    assert cfg.trainer_type == "fsdp2_trainer"
    assert cfg.data.datasets[0].path == "path/to/your/dataset.parquet"
    assert cfg.data.datasets[0].data_type == "parquet"
    assert cfg.data.dataset_format == "yaml"
    assert cfg.video.video_max_pixels == 50176 and cfg.video.video_max_frames == 512 and cfg.video.fps == 1
    assert cfg.model.attn_implementation == "flash_attention_2"
    assert cfg.model.gradient_checkpointing is True
    assert cfg.training.bf16 is True and cfg.training.lr_scheduler_type == "cosine"
    assert cfg.fsdp.fsdp2 is True and cfg.fsdp.reshard_after_forward is False
    assert cfg.checkpointing.save_total_limit == 1
    assert cfg.logging.report_to == ["wandb"] and cfg.logging.logging_steps == 1
    assert cfg.use_liger_kernel is True and cfg.use_rmpad is True and cfg.sp_ulysses_degree == 1
    assert cfg.dataloader_num_workers == 8


def test_qwen2_5_values() -> None:
    cfg = load_config(guide_path("lmms_guide_qwen2_5_vl.yaml"))
    assert cfg.data.streaming is False
    assert (cfg.packing.packing, cfg.packing.packing_strategy, cfg.packing.packing_length) == (True, "first_fit", 16384)
    assert cfg.packing.group_by_length is True
    assert cfg.processor.processor_type == "qwen2_5_vl"
    assert cfg.model.load_from_pretrained_path == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert cfg.model.freeze_modules == ["visual"]
    assert cfg.training.learning_rate == pytest.approx(1e-6) and cfg.training.num_train_epochs == 1
    assert cfg.training.max_steps is None and cfg.training.warmup_ratio == 0.0
    assert cfg.fsdp.transformer_layer_cls_to_wrap == ["Qwen2_5_VLDecoderLayer"]
    assert cfg.checkpointing.output_dir == "./output/qwen2_5_vl" and cfg.checkpointing.save_steps == 100


def test_qwen3_values() -> None:
    cfg = load_config(guide_path("lmms_guide_qwen3_vl.yaml"))
    assert cfg.data.streaming is True  # dataset_type: qwen3_vl_iterable
    assert cfg.training.max_steps == 1000 and cfg.training.warmup_ratio == pytest.approx(0.1)
    assert (cfg.packing.packing, cfg.packing.packing_length, cfg.packing.filter_overlong) == (False, 51200, True)
    assert cfg.processor.processor_name == "Qwen/Qwen3-VL-8B-Instruct"
    assert cfg.fsdp.transformer_layer_cls_to_wrap == ["Qwen3VLTextDecoderLayer"]
    assert cfg.model.freeze_modules == []


def _expected_inert() -> set[str]:
    """The guide keys that cannot act on this machine, decided from what is importable here."""
    expected = set()  # video_backend: qwen_vl_utils is LMMS Engine's default: no warning
    if importlib.util.find_spec("liger_kernel") is None or not torch.cuda.is_available():
        expected.add("use_liger_kernel")  # not installed, or no CUDA GPU for its Triton kernels
    if importlib.util.find_spec("wandb") is None:
        expected.add("logging.report_to")
    if importlib.util.find_spec("flash_attn") is None or not torch.cuda.is_available():
        expected.add("model.attn_implementation")
    return expected


@pytest.mark.parametrize("name", GUIDE_NAMES)
def test_guide_inert_keys_warn_once_each(name: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="vlforge.train"):
        resolved = resolve_config(guide_path(name))
    keys = [warning.split(":", 1)[0] for warning in resolved.warnings]
    expected = _expected_inert()
    cfg = resolved.config
    if "use_rmpad" in cfg.model_fields_set and cfg.use_rmpad != cfg.packing.packing:
        expected.add("use_rmpad")  # the guide's use_rmpad: true with packing off does nothing in vlforge
    if cfg.packing.group_by_length and cfg.packing.packing:
        expected.add("packing.group_by_length")  # the Qwen2.5-VL guide sets both
    assert sorted(keys) == sorted(expected)
    logged = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(logged) == len(resolved.warnings)
    for warning in resolved.warnings:
        assert sum(warning in message for message in logged) == 1
