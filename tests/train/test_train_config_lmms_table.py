"""The LMMS key table: honoured keys map onto native keys, take LMMS Engine's defaults, drive the docs."""

from __future__ import annotations

import pytest
import yaml
from cfgkit import GUIDE_NAMES, REPO, guide_path

from vlforge.config.doc_tables import all_native_keys, mapping_table, schema_tables
from vlforge.config.lmms import BY_LMMS, KEY_TABLE, Expand, Ignore, classification, translate
from vlforge.config.lmms_keys import lmms_fields
from vlforge.config.schema import SECTION_FIELDS

DOCS = REPO / "docs" / "train.md"


def _leaf_paths(data, prefix=()):
    if isinstance(data, dict):
        for key, value in data.items():
            if key in {"dataset_config", "model_config", "processor_config", "fsdp_config", "trainer_args"}:
                yield from _leaf_paths(value, (*prefix, key))
            else:
                yield (*prefix, key)


def test_every_native_target_exists_and_every_lmms_key_is_in_the_schema() -> None:
    natives = set(all_native_keys())
    for entry in KEY_TABLE:
        assert entry.native == "" or entry.native in natives or entry.native in SECTION_FIELDS, entry
        assert entry.lmms in lmms_fields(), entry.lmms
    assert len({entry.lmms for entry in KEY_TABLE}) == len(KEY_TABLE)
    shared = [e.lmms for e in KEY_TABLE if e.native == "data.seed"]
    assert shared == ["dataset_config.data_seed", "trainer_args.data_seed"]  # the only native key of two LMMS keys
    others = [e.native for e in KEY_TABLE if e.native and e.native != "data.seed"]
    assert len(others) == len(set(others))


@pytest.mark.parametrize("name", GUIDE_NAMES)
def test_every_guide_key_is_honoured(name: str) -> None:
    config = yaml.safe_load(guide_path(name).read_text())[0]["config"]
    seen = 0
    for path in _leaf_paths(config):
        key = ".".join(path)
        lmms = key if path[0] in ("trainer_type", "dataset_config", "model_config") else f"trainer_args.{key}"
        assert classification(lmms) == "honoured" or lmms == "dataset_config.video_backend", lmms
        seen += 1
    assert seen >= 35


@pytest.mark.parametrize("entry", [e for e in KEY_TABLE if e.convert is None], ids=lambda e: e.lmms)
def test_translation_puts_each_key_where_the_table_says(entry) -> None:
    sentinel = f"value-of-{entry.lmms}"
    data: dict = {}
    parts = entry.lmms.split(".")
    target = data
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = sentinel
    data.setdefault("dataset_config", {})  # make it the mapping layout even for top-level keys
    result = translate(data, "t.yaml")
    assert result.problems == []
    value = result.native
    for part in entry.native.split("."):
        value = value[part]
    assert value == sentinel
    assert result.source_path(tuple(entry.native.split("."))) == tuple(parts)


@pytest.mark.parametrize(("lmms", "value", "native"), [
    ("dataset_config.dataset_type", "vision", False),
    ("dataset_config.dataset_type", "qwen3_vl_iterable", True),
    ("dataset_config.dataset_type", "vision_iterable", False),  # vlforge streams anyway and counts the steps
    ("trainer_args.max_steps", 12, 12),
    ("trainer_args.resume_from_checkpoint", True, "auto"),
    ("trainer_args.resume_from_checkpoint", "ckpt/step-5", "ckpt/step-5"),
    ("trainer_args.optim", "adamw_torch", "adamw_torch"),
    ("trainer_args.reduce_dtype", "half", "float16"),
    ("trainer_args.output_dtype", "float32", "float32"),
])
def test_value_conversions(lmms: str, value, native) -> None:
    entry = BY_LMMS[lmms]
    assert entry.convert(value) == native


def test_values_without_effect_and_expansions() -> None:
    assert isinstance(BY_LMMS["trainer_args.optim"].convert("adafactor"), Ignore)
    pixels = BY_LMMS["dataset_config.processor_config.extra_kwargs"].convert({"image_max_pixels": 50176})
    assert pixels == Expand({"processor.max_pixels": 50176})
    video = BY_LMMS["dataset_config.processor_config.extra_kwargs"].convert({"video_max_pixels": 1,
                                                                           "video_min_pixels": None})
    assert video == Expand({"video.video_max_pixels": 1})  # LMMS Engine 0.1.4's Qwen3.5 example sets them here
    with pytest.raises(ValueError, match="max_frames"):
        BY_LMMS["dataset_config.processor_config.extra_kwargs"].convert({"max_frames": 8})
    assert isinstance(BY_LMMS["dataset_config.extra_kwargs"].convert({"packing_kwargs": {"num_buckets": 2}}), Ignore)
    with pytest.raises(ValueError, match="use_audio_in_video"):
        BY_LMMS["dataset_config.extra_kwargs"].convert({"use_audio_in_video": True})
    nearest = BY_LMMS["dataset_config.packing_strategy"].convert("balanced")
    assert nearest.value == "best_fit" and "num_buckets" in nearest.reason
    with pytest.raises(ValueError, match="not a floating dtype"):
        BY_LMMS["trainer_args.reduce_dtype"].convert("int8")


def test_left_out_keys_take_lmms_engine_defaults() -> None:
    result = translate({"trainer_args": {"max_steps": -1, "eval_steps": None}, "dataset_config": None}, "t.yaml")
    assert result.problems == [] and result.warnings == []
    training = result.native["training"]
    assert "max_steps" not in training and "eval_steps" not in training  # null / -1: unset
    assert (training["learning_rate"], training["per_device_train_batch_size"], training["num_train_epochs"]) == (
        5e-05, 8, 3.0)
    assert result.native["packing"] == {"packing": False, "packing_length": 32000, "filter_overlong": True,
                                        "group_by_length": False}
    assert result.native["checkpointing"]["output_dir"] == "trainer_output"
    assert result.native["fsdp"]["reduce_dtype"] == result.native["fsdp"]["output_dtype"] == "bfloat16"
    # where a left-out key would be written, for error messages
    assert result.source_path(("training", "learning_rate")) == ("trainer_args", "learning_rate")


def test_docs_list_every_key_and_carry_the_generated_tables() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for entry in KEY_TABLE:
        assert f"`{entry.lmms}`" in text, entry.lmms
    assert mapping_table() in text, "docs/train.md mapping table is stale: python -m vlforge.config.doc_tables"
    assert schema_tables() in text, "docs/train.md schema tables are stale: python -m vlforge.config.doc_tables"


def test_keys_lmms_engine_drops_are_warnings_and_a_typo_stays_an_error():
    """Its own examples write model_config.torch_dtype / model_type, which its pydantic ModelConfig ignores."""
    model = {"load_from_pretrained_path": "tiny:qwen3_vl", "torch_dtype": "bfloat16", "model_type": "qwen3_vl"}
    result = translate({"model_config": model, "trainer_args": {"output_dir": "o"}}, "t.yaml")
    assert not result.problems
    assert sum("has no effect: LMMS Engine 0.1.4's ModelConfig has no such field" in w for w in result.warnings) == 2
    typo = translate({"model_config": {**model, "atn_implementation": "sdpa"}, "trainer_args": {"output_dir": "o"}},
                     "t.yaml")
    assert any("did you mean 'attn_implementation'" in str(p) for p in typo.problems)
