"""The native schema: checks at construction, documentation of every field, inert-key warnings, examples."""

from __future__ import annotations

import importlib.util

import pytest
from cfgkit import MINIMAL, REPO
from pydantic import ValidationError

from vlforge.config import TrainConfig, load_config, resolve_config
from vlforge.config.schema import section_models

BASE = {"data": {"dataset_path": "d.yaml"}, "model": {"load_from_pretrained_path": "m"}}


def _with(**sections) -> dict:
    merged = {key: dict(value) for key, value in BASE.items()}
    for name, value in sections.items():
        if isinstance(value, dict):
            merged.setdefault(name, {}).update(value)
        else:
            merged[name] = value
    return merged


@pytest.mark.parametrize(("sections", "message"), [
    ({"training": {"warmup_ratio": 1.0}}, "less than 1"),
    ({"training": {"learning_rate": -1}}, "greater than or equal to 0"),
    ({"training": {"learning_rate": float("inf")}}, "finite number"),
    ({"training": {"bf16": True, "fp16": True}}, "bf16 and fp16 are both true"),
    ({"training": {"warmup_ratio": 0.1, "warmup_steps": 5}}, "not both"),
    ({"training": {"eval_strategy": "steps"}}, "needs eval_steps"),
    ({"training": {"eval_strategy": "steps", "eval_steps": 5}}, "needs data.eval_dataset_path"),
    ({"training": {"lr_scheduler_type": "polynomial"}}, "'linear', 'cosine', 'constant' or 'wsd'"),
    ({"packing": {"packing": True}}, "needs packing_length"),
    ({"packing": {"packing": True, "packing_length": 0}}, "greater than or equal to 1"),
    ({"packing": {"filter_overlong": True}}, "needs max_length or packing_length"),
    ({"packing": {"packing": True, "packing_length": 8, "max_length": 9}}, "exceeds packing_length"),
    ({"checkpointing": {"save_total_limit": 0}}, "greater than or equal to 1"),
    ({"data": {"streaming": True}}, "set training.max_steps"),
    ({"data": {"datasets": [{"path": "a.jsonl"}]}}, "not both"),
    ({"data": {"dataset_path": None, "datasets": []}}, "the dataset list is empty"),
    ({"data": {"dataset_path": "data.txt"}}, "cannot tell the format from its suffix; set dataset_format"),
    ({"data": {"dataset_path": "rows.jsonl.gz", "dataset_format": "jsonl"}}, ".gz files are not read: decompress"),
    ({"data": {"dataset_path": None, "datasets": [{"path": "a.jsonl.gz", "data_type": "jsonl"}]}},
     ".gz files are not read"),
    ({"data": {"dataset_path": "rows.json", "dataset_format": "yaml"}}, "set data.dataset_format=json"),
    ({"data": {"dataset_path": "list.yaml", "dataset_format": "jsonl"}}, "set data.dataset_format=yaml"),
    ({"data": {"dataset_path": None, "datasets": [{"path": "a.csv"}]}}, "set data_type"),
    ({"processor": {"min_pixels": 10, "max_pixels": 5}}, "above max_pixels"),
    ({"video": {"video_min_frames": 10, "video_max_frames": 5}}, "above video_max_frames"),
    ({"fsdp": {"mixed_precision": "pure_bf16"}}, "needs training.bf16"),
    ({"fsdp": {"transformer_layer_cls_to_wrap": []}}, "wraps nothing"),
    ({"model": {"lora": {"target_modules": []}}}, "at least 1 item"),
    ({"sp_ulysses_degree": 0}, "greater than or equal to 1"),
    ({"trainer_type": "hf_trainer"}, "'fsdp2_trainer'"),
    ({"training": {"learnig_rate": 1}}, "Extra inputs are not permitted"),
])
def test_checks_at_construction(sections: dict, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        TrainConfig.model_validate(_with(**sections))
    assert message in str(info.value)


def test_defaults_are_valid_and_sensible() -> None:
    cfg = TrainConfig.model_validate(BASE)
    assert cfg.sp_ulysses_degree == 1 and cfg.fsdp.mixed_precision == "fp32_master"
    assert cfg.checkpointing.resume == "auto" and cfg.data.on_error == "raise"
    assert cfg.video.video_backend == "pyav" and cfg.inert_warnings() == []


def test_yaml_normalisations() -> None:
    cfg = TrainConfig.model_validate(_with(
        training={"eval_strategy": False},  # an unquoted YAML `no`
        logging={"report_to": "none"},
        fsdp={"transformer_layer_cls_to_wrap": "Qwen3VLTextDecoderLayer"},
        model={"freeze_modules": None},
    ))
    assert cfg.training.eval_strategy == "no" and cfg.logging.report_to == []
    assert cfg.fsdp.transformer_layer_cls_to_wrap == ["Qwen3VLTextDecoderLayer"] and cfg.model.freeze_modules == []
    assert TrainConfig.model_validate(_with(logging={"report_to": "all"})).logging.report_to == ["tensorboard", "wandb"]


def test_every_field_is_documented_and_every_section_forbids_extras() -> None:
    sections = section_models()
    assert set(sections) >= {"", "data", "data.datasets", "processor", "packing", "video", "model", "model.lora",
                             "training", "fsdp", "logging", "checkpointing"}
    for path, cls in sections.items():
        assert cls.model_config.get("extra") == "forbid", path
        for name, info in cls.model_fields.items():
            assert info.description and len(info.description) > 10, f"{path}.{name} has no description"


def test_inert_settings_warn(write_yaml) -> None:
    text = MINIMAL + (
        "packing: {packing: false, packing_length: 100}\n"
        "fsdp: {fsdp2: false, reshard_after_forward: false}\n"
        "training: {eval_steps: 5}\n"
        "video: {video_backend: decord}\n"
        "logging: {report_to: [tensorboard]}\n"
    )
    warnings = resolve_config(write_yaml(text)).warnings
    keys = {warning.split(":")[0].split(" ")[0] for warning in warnings}
    expected = {"packing.packing_length", "fsdp.transformer_layer_cls_to_wrap", "training.eval_steps",
                "video.video_backend"}
    if importlib.util.find_spec("tensorboard") is None:
        expected.add("logging.report_to")
    assert keys == expected


def test_attention_resolution_follows_the_machine(write_yaml) -> None:
    import torch

    text = MINIMAL.replace("tiny:qwen3_vl}", "tiny:qwen3_vl, attn_implementation: flash_attention_2}")
    cfg = load_config(write_yaml(text))
    assert cfg.model.attn_implementation == "flash_attention_2"
    usable = importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available()
    assert cfg.resolved_attn_implementation() == ("flash_attention_2" if usable else "sdpa")
    assert load_config(write_yaml(MINIMAL, "b.yaml")).resolved_attn_implementation() == "sdpa"


@pytest.mark.parametrize("path", [REPO / "examples" / "qwen3_vl_tiny.yaml",
                                  *sorted((REPO / "examples" / "configs").glob("*.yaml"))],
                         ids=lambda path: path.name)
def test_shipped_examples_validate_without_warnings(path) -> None:
    resolved = resolve_config(path)
    assert resolved.warnings == []
    cfg = resolved.config
    assert cfg.model.load_from_pretrained_path == "tiny:qwen3_vl"
    assert cfg.data.dataset_path == "examples/data/dataset.yaml"
    assert cfg.training.max_steps and cfg.packing.packing


def test_native_and_lmms_examples_agree() -> None:
    """The same run, except what LMMS Engine's meaning adds: float16 compute for bf16: false, its defaults."""
    native = load_config(REPO / "examples" / "qwen3_vl_tiny.yaml")
    lmms = load_config(REPO / "examples" / "configs" / "lmms_qwen3_vl_tiny.yaml")
    assert native.packing == lmms.packing
    precision = {"param_dtype", "reduce_dtype", "output_dtype"}
    assert native.fsdp.model_dump(exclude=precision) == lmms.fsdp.model_dump(exclude=precision)
    assert (native.param_dtype(), lmms.param_dtype()) == ("float32", "float16")
    assert (lmms.fsdp.reduce_dtype, lmms.fsdp.output_dtype) == ("bfloat16", "bfloat16")  # LMMS Engine's defaults
    unset = {"num_train_epochs"}  # max_steps is set: the epochs do not count (LMMS default 3, native 1)
    assert native.training.model_dump(exclude=unset) == lmms.training.model_dump(exclude=unset)


def test_reshard_after_forward_takes_auto_for_null():
    from vlforge.config.schema import FsdpConfig

    assert FsdpConfig(reshard_after_forward="auto").reshard_after_forward is None
    assert FsdpConfig(reshard_after_forward=False).reshard_after_forward is False
