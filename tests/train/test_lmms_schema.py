"""LMMS Engine 0.1.4's whole config schema: generated from the engine, every key classified, docs current.

With the peer venv (``python3 scripts/peer_env.py build``) the schema is dumped again by
``scripts/lmms_schema.py`` with the engine's own python and must equal the committed JSON, so a new
LMMS Engine key cannot slip through unclassified. Without the venv the committed JSON is checked alone.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from cfgkit import REPO

from vlforge.config import load_config, resolve_config
from vlforge.config.doc_tables import lmms_compat_doc
from vlforge.config.lmms import KEY_TABLE, classification, translate
from vlforge.config.lmms_keys import INERT, REFUSED, SCHEMA_FILE, SCHEMA_SCRIPT, lmms_fields, load_schema
from vlforge.config.problems import ConfigValidationError

sys.path.insert(0, str(REPO / "scripts"))
import peer_env

DOC = REPO / "docs" / "lmms_compat.md"
GROUPS = {"": "top level", "dataset_config": "", "dataset_config.processor_config": "", "model_config": "",
          "trainer_args": "", "trainer_args.fsdp_config": "", "trainer_args.accelerator_config": ""}


def test_the_committed_schema_is_the_whole_engine_schema() -> None:
    schema = load_schema()
    assert schema["versions"]["lmms-engine"] == "0.1.4" and schema["versions"]["transformers"] == "5.8.1"
    assert set(schema["groups"]) == set(GROUPS)
    fields = lmms_fields()
    # transformers' TrainingArguments fields LMMS Engine inherits, and its own
    for key in ("trainer_args.ddp_timeout", "trainer_args.hub_token", "trainer_args.use_cpu",
                "trainer_args.reduce_dtype", "trainer_args.ema_decay", "trainer_args.fsdp_config.hsdp_shard_size",
                "trainer_args.accelerator_config.even_batches", "dataset_config.video_min_pixels",
                "model_config.overwrite_config", "model_config.monkey_patch_kwargs", "config_yaml"):
        assert key in fields, key
    assert sum(key.startswith("trainer_args.") for key in fields) > 150


def test_every_key_is_classified_and_every_classification_is_a_key() -> None:
    kinds = {key: classification(key) for key in lmms_fields()}
    assert [key for key, kind in kinds.items() if kind == "unknown"] == []
    classified = {entry.lmms for entry in KEY_TABLE} | set(INERT) | set(REFUSED)
    assert classified - set(kinds) == set(), "classification of keys LMMS Engine does not have"
    assert set(INERT).isdisjoint(REFUSED) and {e.lmms for e in KEY_TABLE}.isdisjoint(set(INERT) | set(REFUSED))
    for group in GROUPS:
        if group:
            assert kinds[group] == "group"


def test_docs_page_is_generated_from_the_schema() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert text == lmms_compat_doc(), "docs/lmms_compat.md is stale: python -m vlforge.config.doc_tables --lmms"
    for key, record in lmms_fields().items():
        assert f"`{record['name']}`" in text, key


def test_the_engine_dumps_the_committed_schema() -> None:
    python = peer_env.peer_python()
    if python is None:
        pytest.skip(f"LMMS Engine's venv is not built (python3 scripts/peer_env.py build); {SCHEMA_SCRIPT} "
                    "re-dumps the schema with it")
    done = subprocess.run([str(python), str(REPO / SCHEMA_SCRIPT)], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == json.loads(SCHEMA_FILE.read_text(encoding="utf-8")), (
        f"LMMS Engine's schema changed: {SCHEMA_SCRIPT} --out {SCHEMA_FILE.relative_to(REPO)}, then classify the "
        "new keys")


# ---- what each kind does --------------------------------------------------------------------------------------

BASE = """trainer_type: fsdp2_trainer
dataset_config:
  dataset_type: vision
  dataset_path: examples/data/dataset.yaml
  shuffle: false
model_config:
  load_from_pretrained_path: tiny:qwen3_vl
trainer_args:
  max_steps: 2
"""


def test_inert_key_at_its_default_is_silent_and_otherwise_warns_once(write_yaml, caplog) -> None:
    quiet = resolve_config(write_yaml(BASE + "  torch_compile: false\n  hub_token: <HUB_TOKEN>\n  ema_decay: 0.9999\n"))
    assert quiet.warnings == []
    with caplog.at_level(logging.WARNING, logger="vlforge.train"):
        loud = resolve_config(write_yaml(BASE + "  torch_compile: true\n  ema_enabled: true\n"))
    assert len(loud.warnings) == 2
    assert loud.warnings[0].startswith("trainer_args.torch_compile: true has no effect: transformers Trainer's")
    assert loud.warnings[1].startswith("trainer_args.ema_enabled: true has no effect: LMMS Engine's EMA copy")
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("torch_compile" in message for message in logged) == 1


def test_dropped_keys_of_the_default_config_are_inert(write_yaml) -> None:
    resolved = resolve_config(write_yaml(BASE + "  per_gpu_train_batch_size: 4\n  fp16_opt_level: O1\n"))
    assert resolved.warnings == ["trainer_args.per_gpu_train_batch_size: 4 has no effect: not a TrainingArguments "
                                 "field of transformers 5.8.1: LMMS Engine 0.1.4 drops it with a warning "
                                 "('Filtering out unsupported TrainingArguments parameters')"]
    assert resolved.config.training.per_device_train_batch_size == 8  # LMMS Engine's default, not 4


@pytest.mark.parametrize(("extra", "where", "reason"), [
    ("  tp_degree: 2\n", "trainer_args.tp_degree", "tensor parallelism"),
    ("config_yaml: other.yaml\n", "config_yaml", "vlforge reads one file"),
    ("  ema_resume_from_ema: true\n", "trainer_args.ema_resume_from_ema", "no EMA weights"),
])
def test_refused_keys_are_one_line_errors(write_yaml, extra, where, reason) -> None:
    with pytest.raises(ConfigValidationError) as info:
        load_config(write_yaml(BASE + extra))
    assert len(info.value.problems) == 1 and info.value.problems[0].path == where
    assert " is refused: " in str(info.value) and reason in str(info.value)


def test_refused_keys_at_their_default_are_accepted(write_yaml) -> None:
    text = BASE.replace("model_config:\n", "model_config:\n  load_from_config: null\n  extra_kwargs: {}\n")
    assert load_config(write_yaml(text + "  tp_degree: 1\n")).training.max_steps == 2


def test_a_typo_of_a_real_key_is_still_an_error(write_yaml) -> None:
    with pytest.raises(ConfigValidationError, match=r"trainer_args.ddp_timout: unknown key; did you mean "
                                                     r"'ddp_timeout'\?"):
        load_config(write_yaml(BASE + "  ddp_timout: 60\n"))
    with pytest.raises(ConfigValidationError, match=r"fsdp_config.hsdp_shard_sise: unknown key; did you mean"):
        load_config(write_yaml(BASE + "  fsdp_config: {hsdp_shard_sise: 2}\n"))


def test_fsdp_prefixed_keys_inside_fsdp_config_are_read_as_transformers_does() -> None:
    result = translate({"trainer_args": {"fsdp_config": {"fsdp_transformer_layer_cls_to_wrap": "X"}}}, "t.yaml")
    assert result.problems == [] and result.native["fsdp"]["transformer_layer_cls_to_wrap"] == "X"
