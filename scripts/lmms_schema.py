#!/usr/bin/env python3
"""Dump LMMS Engine's whole config schema (every key, its type and default) as JSON, from the engine itself.

Run it with the PEER venv's python (``python3 scripts/peer_env.py path``), never vlforge's: it imports
``lmms_engine`` 0.1.4 and the transformers that engine was installed with. vlforge classifies every key
of the output (``src/vlforge/config/lmms.py``) and renders ``docs/lmms_compat.md`` from it;
``tests/train/test_lmms_schema.py`` re-runs this script and compares.

Groups (dotted, as in LMMS Engine's YAML):

* ``""``: :class:`lmms_engine.train.config.TrainerConfig`'s fields and the top-level keys of the shipped
  ``default_config.yaml`` (hydra's ``config_yaml``);
* ``dataset_config``, ``dataset_config.processor_config``, ``model_config``: the pydantic models;
* ``trainer_args``: LMMS Engine's ``TrainingArguments`` dataclass, with every field it inherits from
  transformers, plus the keys of ``default_config.yaml`` that are not fields any more (LMMS Engine's
  ``filter_training_args`` drops those with a warning: ``"dropped": true``);
* ``trainer_args.fsdp_config``: a plain dict; its keys are those transformers' ``TrainingArguments`` sets
  by default, those ``default_config.yaml`` writes, and every ``fsdp_config["key"]`` /
  ``fsdp_config.get("key", default)`` read in transformers' ``training_args.py`` or in ``lmms_engine``;
* ``trainer_args.accelerator_config``: transformers' ``AcceleratorConfig`` dataclass.

Each field: ``name``, ``type`` (text), ``default`` (JSON; null for none), ``required`` (no default), and
``in_default_config`` / ``default_config_value`` when the shipped ``default_config.yaml`` sets it.

Example:
    $(python3 scripts/peer_env.py path) scripts/lmms_schema.py --out src/vlforge/config/lmms_schema_0.1.4.json
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import enum
import importlib.metadata
import json
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "vlforge" / "train" / "lmms_schema_0.1.4.json"
_MISSING = object()


def _type_text(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", None)
    if text is None or getattr(annotation, "__args__", None):
        text = repr(annotation)
    return text.replace("typing.", "").replace("<class '", "").replace("'>", "")


def _json_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return _json_value(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _json_value(item) for key, item in value.items()}
    return repr(value)


def _field(name: str, annotation: Any, default: Any, shipped: dict[str, Any] | None) -> dict[str, Any]:
    record: dict[str, Any] = {"name": name, "type": _type_text(annotation)}
    record["required"] = default is _MISSING
    record["default"] = None if default is _MISSING else _json_value(default)
    if shipped is not None and name in shipped:
        record["in_default_config"] = True
        record["default_config_value"] = _json_value(shipped[name])
    return record


def _dataclass_fields(cls: type, shipped: dict[str, Any] | None) -> list[dict[str, Any]]:
    out = []
    for item in dataclasses.fields(cls):
        if not item.init or item.name.startswith("_"):
            continue  # not settable from a config
        if item.default is not dataclasses.MISSING:
            default = item.default
        elif item.default_factory is not dataclasses.MISSING:
            default = item.default_factory()
        else:
            default = _MISSING
        out.append(_field(item.name, item.type, default, shipped))
    return out


def _pydantic_fields(cls: type, shipped: dict[str, Any] | None) -> list[dict[str, Any]]:
    out = []
    for name, info in cls.model_fields.items():
        default = _MISSING if info.is_required() else info.get_default(call_default_factory=True)
        out.append(_field(name, info.annotation, default, shipped))
    return out


def _reads_of(path: Path, variable: str) -> dict[str, Any]:
    """``variable["key"]`` and ``variable.get("key", default)`` reads in one source file: key -> default."""
    found: dict[str, Any] = {}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        target, key, default = None, None, _MISSING
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target, key = node.value, node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            target, key = node.func.value, node.args[0].value
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                default = node.args[1].value
        if target is None or not isinstance(key, str):
            continue
        text = ast.unparse(target)
        named = text == variable or text.endswith("." + variable) or text.endswith(f"'{variable}', {{}})")
        if named and (key not in found or found[key] is _MISSING):
            found[key] = default
    return found


def _fsdp_config_fields(shipped: dict[str, Any] | None) -> list[dict[str, Any]]:
    import lmms_engine
    import transformers
    from lmms_engine.train.config import TrainingArguments

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post_init = TrainingArguments(output_dir="/nonexistent-lmms-schema").fsdp_config
    reads: dict[str, Any] = {}
    sources = [Path(transformers.__file__).parent / "training_args.py"]
    sources += sorted(Path(lmms_engine.__file__).parent.rglob("*.py"))
    for source in sources:
        for key, default in _reads_of(source, "fsdp_config").items():
            if key not in reads or reads[key] is _MISSING:
                reads[key] = default
    keys = list(post_init) + [k for k in (shipped or {}) if k not in post_init]
    keys += sorted(k for k in reads if k not in keys)
    out = []
    for key in keys:
        default = post_init.get(key, reads.get(key, _MISSING))
        default = None if default is _MISSING else default
        kind = type(default).__name__ if default is not None else "Any"
        out.append(_field(key, kind, default, shipped))
    return out


def dump() -> dict[str, Any]:
    """The schema record (see the module docstring)."""
    logging.disable(logging.WARNING)
    import lmms_engine
    import yaml
    from lmms_engine.datasets import DatasetConfig
    from lmms_engine.datasets.processor import ProcessorConfig
    from lmms_engine.models import ModelConfig
    from lmms_engine.train.config import TrainerConfig, TrainingArguments
    from transformers.trainer_pt_utils import AcceleratorConfig

    shipped_path = Path(lmms_engine.__file__).parent / "launch" / "config" / "default_config.yaml"
    shipped = yaml.safe_load(shipped_path.read_text(encoding="utf-8"))
    data = shipped.get("dataset_config") or {}
    args = shipped.get("trainer_args") or {}

    top = _dataclass_fields(TrainerConfig, shipped)
    top += [_field(key, type(value).__name__ if value is not None else "Any", None, shipped)
            for key, value in shipped.items() if key not in {f["name"] for f in top}]
    trainer_args = _dataclass_fields(TrainingArguments, args)
    known = {f["name"] for f in trainer_args}
    for key, value in args.items():
        if key not in known:
            record = _field(key, type(value).__name__ if value is not None else "Any", value, args)
            record["dropped"] = True  # its only default is the value the shipped file writes
            trainer_args.append(record)
    groups = {
        "": top,
        "dataset_config": _pydantic_fields(DatasetConfig, data),
        "dataset_config.processor_config": _pydantic_fields(ProcessorConfig, data.get("processor_config") or {}),
        "model_config": _pydantic_fields(ModelConfig, shipped.get("model_config") or {}),
        "trainer_args": trainer_args,
        "trainer_args.fsdp_config": _fsdp_config_fields(args.get("fsdp_config") or {}),
        "trainer_args.accelerator_config": _dataclass_fields(AcceleratorConfig, args.get("accelerator_config") or {}),
    }
    for name, fields in groups.items():  # a field that is a group of its own: its keys are listed there
        for record in fields:
            if (f"{name}.{record['name']}" if name else record["name"]) in groups:
                record["group"] = True
                record.pop("default_config_value", None)
    versions = {name: importlib.metadata.version(name) for name in ("lmms-engine", "transformers", "pydantic")}
    return {
        "engine": "lmms-engine",
        "versions": versions,
        "generated_by": "scripts/lmms_schema.py",
        "default_config": "lmms_engine/launch/config/default_config.yaml",
        "groups": groups,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help=f"write here (default: stdout; repo: {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with contextlib.redirect_stdout(sys.stderr):  # lmms_engine prints notices on import
        record = dump()
    text = json.dumps(record, indent=1, ensure_ascii=False) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
