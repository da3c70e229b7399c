"""The resolved config round-trips: ``to_yaml`` -> ``load_config`` gives an equal config, for every layout."""

from __future__ import annotations

import json

import pytest
from cfgkit import GUIDE_NAMES, MINIMAL, REPO, guide_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vlforge.config import TrainConfig, load_config, resolve_config

FULL = """
trainer_type: fsdp2_trainer
data:
  datasets:
    - {path: a.jsonl, data_folder: media, weight: 2.5, max_samples: 100}
    - {path: b.parquet}
  dataset_format: yaml
  streaming: true
  shuffle: false
  on_error: skip
  eval_dataset_path: eval.jsonl
  allow_path_escape: true
processor: {processor_name: proc, processor_type: qwen2_5_vl, min_pixels: 3136, max_pixels: 1003520}
packing: {packing: true, packing_length: 4096, max_length: 2048, packing_strategy: best_fit,
          filter_overlong: true, group_by_length: true}
video: {video_sampling_strategy: frame_num, frame_num: 16, fps: 0.5, video_min_frames: 4, video_max_frames: 32,
        video_min_pixels: 1024, video_max_pixels: 50176}
model:
  load_from_pretrained_path: /ckpt
  attn_implementation: eager
  freeze_modules: [visual]
  gradient_checkpointing: true
  lora: {r: 4, alpha: 8, target_modules: [q_proj], dropout: 0.1}
  patch: false
  patch_precision: fp32
training: {per_device_train_batch_size: 2, gradient_accumulation_steps: 4, learning_rate: 3.0e-5,
           weight_decay: 0.01, max_steps: 7, warmup_steps: 2, lr_scheduler_type: wsd, lr_decay_ratio: 0.2,
           max_grad_norm: null, seed: 9, bf16: true, eval_strategy: steps, eval_steps: 3}
fsdp: {fsdp2: true, transformer_layer_cls_to_wrap: [A, B], reshard_after_forward: false, mixed_precision: pure_bf16}
logging: {logging_steps: 2, report_to: [tensorboard], run_name: r}
checkpointing: {output_dir: out, save_steps: 5, save_total_limit: 3, resume: none}
use_rmpad: true
dataloader_num_workers: 2
"""


def _round_trip(cfg: TrainConfig, write_yaml) -> TrainConfig:
    return load_config(write_yaml(cfg.to_yaml(), name="resolved.yaml"))


@pytest.mark.parametrize("name", GUIDE_NAMES)
def test_guide_round_trips_through_native_yaml(name: str, write_yaml) -> None:
    cfg = load_config(guide_path(name))
    again = resolve_config(write_yaml(cfg.to_yaml(), name="resolved.yaml"))
    assert again.layout == "native"
    assert again.config == cfg


def test_every_section_round_trips(write_yaml) -> None:
    cfg = load_config(write_yaml(FULL))
    defaults = load_config(write_yaml(MINIMAL, name="minimal.yaml"))
    for section in ("data", "processor", "packing", "video", "model", "training", "fsdp", "logging", "checkpointing"):
        assert getattr(cfg, section) != getattr(defaults, section), section  # FULL really sets every section
    assert _round_trip(cfg, write_yaml) == cfg
    assert json.loads(json.dumps(cfg.model_dump(mode="json"))) == cfg.model_dump(mode="json")


def test_example_round_trips(write_yaml) -> None:
    cfg = load_config(REPO / "examples" / "qwen3_vl_tiny.yaml")
    assert _round_trip(cfg, write_yaml) == cfg


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    learning_rate=st.floats(min_value=1e-12, max_value=1e3, allow_nan=False, allow_infinity=False),
    warmup_ratio=st.floats(min_value=0, max_value=1, exclude_max=True),
    seed=st.integers(min_value=0, max_value=2**63),
    fps=st.floats(min_value=1e-6, max_value=1e4),
    run_name=st.text(min_size=1, max_size=20),
    freeze=st.lists(st.text(min_size=1, max_size=12), max_size=3),
)
def test_round_trip_property(write_yaml, learning_rate, warmup_ratio, seed, fps, run_name, freeze) -> None:
    cfg = TrainConfig(
        data={"datasets": [{"path": "a.jsonl"}]},
        model={"load_from_pretrained_path": "m", "freeze_modules": freeze},
        training={"learning_rate": learning_rate, "warmup_ratio": warmup_ratio, "seed": seed},
        video={"fps": fps},
        logging={"run_name": run_name},
    )
    assert _round_trip(cfg, write_yaml) == cfg
