"""The LMMS key table: one native key per LMMS key, covers the guide, drives translation and the docs."""

from __future__ import annotations

import pytest
import yaml
from cfgkit import GUIDE_NAMES, REPO, guide_path

from vlforge.train.doc_tables import all_native_keys, mapping_table, schema_tables
from vlforge.train.lmms_compat import BY_LMMS, KEY_TABLE, translate

DOCS = REPO / "docs" / "train.md"


def _leaf_paths(data, prefix=()):
    if isinstance(data, dict):
        for key, value in data.items():
            if key in {"dataset_config", "model_config", "processor_config", "fsdp_config", "trainer_args"}:
                yield from _leaf_paths(value, (*prefix, key))
            else:
                yield (*prefix, key)


def test_every_native_target_exists_and_is_used_once() -> None:
    natives = set(all_native_keys())
    for entry in KEY_TABLE:
        assert entry.native in natives, entry
    assert len({entry.native for entry in KEY_TABLE}) == len(KEY_TABLE)
    assert len({entry.lmms for entry in KEY_TABLE}) == len(KEY_TABLE)


@pytest.mark.parametrize("name", GUIDE_NAMES)
def test_every_guide_key_is_in_the_table(name: str) -> None:
    config = yaml.safe_load(guide_path(name).read_text())[0]["config"]
    seen = 0
    for path in _leaf_paths(config):
        key = ".".join(path)
        lmms = key if path[0] in ("trainer_type", "dataset_config", "model_config") else f"trainer_args.{key}"
        assert lmms in BY_LMMS, lmms
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
    ("trainer_args.max_steps", 12, 12),
    ("trainer_args.resume_from_checkpoint", True, "auto"),
    ("trainer_args.resume_from_checkpoint", "ckpt/step-5", "ckpt/step-5"),
])
def test_value_conversions(lmms: str, value, native) -> None:
    entry = BY_LMMS[lmms]
    assert entry.convert(value) == native


def test_unset_values_take_native_defaults() -> None:
    result = translate({"trainer_args": {"max_steps": -1, "eval_steps": None}, "dataset_config": None}, "t.yaml")
    assert result.problems == [] and result.native == {}


def test_docs_list_every_key_and_carry_the_generated_tables() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for entry in KEY_TABLE:
        assert f"`{entry.lmms}`" in text and f"`{entry.native}`" in text, entry.lmms
    assert mapping_table() in text, "docs/train.md mapping table is stale: python -m vlforge.train.doc_tables"
    assert schema_tables() in text, "docs/train.md schema tables are stale: python -m vlforge.train.doc_tables"
