"""``key=value`` overrides: native dotted paths and LMMS keys, YAML-typed values, loud errors."""

from __future__ import annotations

import pytest
from cfgkit import MINIMAL, guide_path

from vlforge.config import ConfigValidationError, load_config


def test_native_overrides_parse_yaml_values(write_yaml) -> None:
    cfg = load_config(write_yaml(MINIMAL), [
        "training.learning_rate=3e-4",
        "training.bf16=true",
        "model.freeze_modules=[visual, model.visual.merger]",
        "logging.run_name=smoke test",
        "fsdp.transformer_layer_cls_to_wrap=Qwen3VLTextDecoderLayer",
        "model.lora={r: 4, target_modules: [q_proj]}",
    ])
    assert cfg.training.learning_rate == pytest.approx(3e-4)
    assert cfg.training.bf16 is True
    assert cfg.model.freeze_modules == ["visual", "model.visual.merger"]
    assert cfg.logging.run_name == "smoke test"
    assert cfg.fsdp.transformer_layer_cls_to_wrap == ["Qwen3VLTextDecoderLayer"]
    assert (cfg.model.lora.r, cfg.model.lora.target_modules) == (4, ["q_proj"])


def test_override_replaces_file_value_and_creates_sections(write_yaml) -> None:
    path = write_yaml(MINIMAL + "training: {learning_rate: 1.0e-5, seed: 3}\n")
    cfg = load_config(path, ["training.learning_rate=2e-5", "checkpointing.output_dir=/tmp/run"])
    assert cfg.training.learning_rate == pytest.approx(2e-5)
    assert cfg.training.seed == 3  # untouched siblings stay
    assert cfg.checkpointing.output_dir == "/tmp/run"
    assert load_config(path).training.learning_rate == pytest.approx(1e-5)  # the file itself is not changed


def test_later_override_wins_and_null_unsets(write_yaml) -> None:
    path = write_yaml(MINIMAL + "training: {max_steps: 10}\n")
    cfg = load_config(path, ["training.seed=1", "training.seed=2", "training.max_steps=null"])
    assert cfg.training.seed == 2 and cfg.training.max_steps is None


def test_list_index_override(write_yaml) -> None:
    text = "data:\n  datasets:\n    - {path: a.jsonl}\n    - {path: b.jsonl}\nmodel: {load_from_pretrained_path: m}\n"
    cfg = load_config(write_yaml(text), ["data.datasets.1.weight=3", "data.datasets.0.max_samples=5"])
    assert [d.weight for d in cfg.data.datasets] == [1.0, 3.0]
    assert cfg.data.datasets[0].max_samples == 5
    with pytest.raises(ConfigValidationError, match=r"data.datasets\[2\].weight: there is no entry \[2\] to override"):
        load_config(write_yaml(text), ["data.datasets.2.weight=3"])


def test_lmms_key_overrides_on_any_layout(write_yaml) -> None:
    qwen3 = load_config(guide_path("lmms_guide_qwen3_vl.yaml"), [
        "model_config.load_from_pretrained_path=tiny:qwen3_vl",
        "trainer_args.learning_rate=1e-4",
        "trainer_args.fsdp_config.reshard_after_forward=true",
        "dataset_config.dataset_type=vision",
        "trainer_args.max_steps=-1",
    ])
    assert qwen3.model.load_from_pretrained_path == "tiny:qwen3_vl"
    assert qwen3.training.learning_rate == pytest.approx(1e-4)
    assert qwen3.fsdp.reshard_after_forward is True
    assert qwen3.data.streaming is False and qwen3.training.max_steps is None
    native = load_config(write_yaml(MINIMAL), ["trainer_args.gradient_checkpointing=true"])
    assert native.model.gradient_checkpointing is True


def test_override_values_are_validated_and_name_the_override(write_yaml) -> None:
    with pytest.raises(ConfigValidationError) as info:
        load_config(write_yaml(MINIMAL), ["training.learning_rate=-1"])
    assert str(info.value) == (
        "override 'training.learning_rate=-1': training.learning_rate: Input should be greater than or equal to 0 (got -1)"
    )
    with pytest.raises(ConfigValidationError, match=r"override 'sp_ulysses_degree=0': sp_ulysses_degree: Input should"):
        load_config(write_yaml(MINIMAL), ["sp_ulysses_degree=0"])


@pytest.mark.parametrize(("override", "message"), [
    ("training.lerning_rate=1", "training.lerning_rate: unknown key; did you mean 'learning_rate'?"),
    ("learning_rate=1", "learning_rate: misplaced key; it belongs under training"),
    ("trainer_args.lerning_rate=1", "trainer_args.lerning_rate: unknown LMMS key; did you mean 'trainer_args.learning_rate'?"),
    ("dataset_config.dataset_type=vision_audio", "dataset_config.dataset_type: audio datasets"),
    ("training.learning_rate.x=1", "training.learning_rate.x: is not a section"),
    ("training.learning_rate", "expected key=value"),
    ("=3", "expected key=value"),
    ("training.learning_rate=[1", "training.learning_rate: value is not valid YAML"),
])
def test_bad_override_is_one_line(write_yaml, override: str, message: str) -> None:
    with pytest.raises(ConfigValidationError) as info:
        load_config(write_yaml(MINIMAL), [override])
    assert len(info.value.problems) == 1
    assert str(info.value) == f"override {override!r}: {message}" or message in str(info.value)
    assert str(info.value).startswith(f"override {override!r}: ")
