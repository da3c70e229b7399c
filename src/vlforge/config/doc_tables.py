"""Markdown generated from the schema and the LMMS classification (tests keep the docs in sync).

``python -m vlforge.config.doc_tables`` prints docs/train.md's two tables after a change to the schema or the
key table; ``python -m vlforge.config.doc_tables --lmms > docs/lmms_compat.md`` rewrites the whole LMMS Engine
compatibility page (every key of ``lmms_schema_0.1.4.json``, classified).

Example:
    >>> mapping_table().splitlines()[0]
    '| LMMS Engine key | vlforge key | notes |'
    >>> "## `trainer_args.fsdp_config`" in lmms_compat_doc()
    True
"""

from __future__ import annotations

import json
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from vlforge.config.lmms import BY_LMMS, KEY_TABLE, classification, inert_reason
from vlforge.config.lmms_keys import (
    REFUSED,
    REFUSED_OK,
    SCHEMA_FILE,
    SCHEMA_SCRIPT,
    lmms_defaults,
    load_schema,
)
from vlforge.config.schema import section_models
from vlforge.strict import model_in_annotation


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def mapping_table() -> str:
    """Every LMMS Engine key vlforge reads and the native key it becomes."""
    rows = ["| LMMS Engine key | vlforge key | notes |", "|---|---|---|"]
    rows += [f"| `{e.lmms}` | {f'`{e.native}`' if e.native else '-'} | {_cell(e.note)} |" for e in KEY_TABLE]
    return "\n".join(rows)


def _value(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return f"`{_cell(text if len(text) <= 40 else text[:37] + '...')}`"


#: Honoured keys whose effect still differs from LMMS Engine's (the note says how; docs/train.md, Migrating).
DIFFERS = frozenset({"dataset_config.shuffle"})

_KIND_TEXT = {"honoured": "**honoured**", "inert": "inert", "refused": "**refused**", "group": "group"}


def _what(key: str) -> str:
    kind = classification(key)
    if kind == "honoured":
        entry = BY_LMMS[key]
        target = f"-> `{entry.native}`" if entry.native else "accepted"
        return f"{target}{'; ' + _cell(entry.note) if entry.note else ''}"
    if kind == "inert":
        return _cell(inert_reason(key))
    if kind == "refused":
        extra = REFUSED_OK.get(key, ())
        also = f" (also accepted: {', '.join(_value(v) for v in extra)})" if extra else ""
        return _cell(REFUSED[key]) + also
    return "a mapping of the keys below" if kind == "group" else "?"


def lmms_compat_doc() -> str:
    """docs/lmms_compat.md: every key of LMMS Engine 0.1.4's schema, its default and what vlforge does with it."""
    schema = load_schema()
    versions = schema["versions"]
    groups = schema["groups"]
    keys = [f"{g}.{f['name']}" if g else f["name"] for g, fields in groups.items() for f in fields]
    counts = {kind: sum(classification(k) == kind for k in keys) for kind in ("honoured", "inert", "refused")}
    out = [
        f"# LMMS Engine {versions['lmms-engine']} configs in vlforge: every key",
        "",
        "<!-- Generated: python -m vlforge.config.doc_tables --lmms > docs/lmms_compat.md (do not edit by hand). -->",
        "",
        f"This page lists every key of LMMS Engine {versions['lmms-engine']}'s training config (with transformers "
        f"{versions['transformers']}, the version it installs), as the engine itself reports it: "
        f"`{SCHEMA_SCRIPT}` imports LMMS Engine in its own venv (`python3 scripts/peer_env.py build`) and dumps "
        f"every field of its config classes, with every TrainingArguments field LMMS Engine inherits from "
        f"transformers, into `src/vlforge/train/{SCHEMA_FILE.name}`. This page is rendered from that file and "
        "from vlforge's classification (`src/vlforge/config/lmms.py`, `lmms_keys.py`); "
        "`tests/train/test_lmms_schema.py` checks that both cover every key and that this page is current.",
        "",
        f"{len(keys) - sum(classification(k) == 'group' for k in keys)} keys: {counts['honoured']} **honoured** "
        f"(mapped onto a vlforge key with the meaning they have in LMMS Engine's fsdp2 trainer), {counts['inert']} "
        f"inert (accepted; a value other than LMMS Engine's default logs one warning naming the key and why it "
        f"has no effect), {counts['refused']} **refused** (a value other than the default is an error, because "
        "ignoring it would change what is trained). A key the engine does not have is an error with a \"did you "
        "mean\" hint. A key left out of the file takes LMMS Engine's default, also for the honoured keys "
        "(`learning_rate` 5e-5, `per_device_train_batch_size` 8, ...). \"Default\" counts the dataclass default "
        "and, where LMMS Engine's shipped `default_config.yaml` writes another value (a dump of one machine's "
        "run: `logging_dir`, `hub_token`, ...), that value too. The semantic differences that remain are in "
        "[Migrating from LMMS Engine](train.md#migrating-from-lmms-engine).",
        "",
        "Keys marked *dropped* are written by the shipped `default_config.yaml` but are no TrainingArguments "
        f"field of transformers {versions['transformers']}: LMMS Engine drops them with a warning.",
        "",
    ]
    for group, fields in groups.items():
        out += [f"## `{group}`" if group else "## top level", "",
                "| key | LMMS Engine default | vlforge | what vlforge does |", "|---|---|---|---|"]
        for record in fields:
            key = f"{group}.{record['name']}" if group else record["name"]
            if record.get("required"):
                default = "required"
            else:
                values = []
                for value in lmms_defaults(key):
                    if _value(value) not in values:
                        values.append(_value(value))
                default = " / ".join(values)
            name = f"`{record['name']}`" + (" (*dropped*)" if record.get("dropped") else "")
            kind = _KIND_TEXT[classification(key)] + (", **differs**" if key in DIFFERS else "")
            out.append(f"| {name} | {default} | {kind} | {_what(key)} |")
        out.append("")
    return "\n".join(out)


def type_name(annotation: Any) -> str:
    """Readable type: ``int``, ``list of str``, ``fps \\| frame_num``, ``... or null``."""
    origin = get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(json.dumps(arg) if not isinstance(arg, str) else arg for arg in get_args(annotation))
    if origin in (Union, types.UnionType):
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        inner = " or ".join(type_name(arg) for arg in args)
        return f"{inner} or null" if len(args) < len(get_args(annotation)) else inner
    if origin is list:
        item = get_args(annotation)[0]
        return "list of entries" if model_in_annotation(item) else f"list of {type_name(item)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: Any) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "**required**"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{json.dumps(value)}`"


def schema_tables() -> str:
    """One table per native section: key, type, default, description."""
    out: list[str] = []
    for path, cls in section_models().items():
        out += [f"#### `{path}`" if path else "#### top level", "", "| key | type | default | description |",
                "|---|---|---|---|"]
        for name, info in cls.model_fields.items():
            if path == "" and model_in_annotation(info.annotation) is not None:
                kind = "section"
            else:
                kind = type_name(info.annotation)
            out.append(f"| `{name}` | {kind} | {_default(info)} | {_cell(info.description or '')} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def all_native_keys() -> list[str]:
    """Every native dotted key (sections included), e.g. ``training.learning_rate``."""
    keys = []
    for path, cls in section_models().items():
        keys += [f"{path}.{name}" if path else name for name in cls.model_fields]
    return keys


if __name__ == "__main__":  # pragma: no cover - a maintenance helper
    import sys

    if "--lmms" in sys.argv[1:]:
        sys.stdout.write(lmms_compat_doc())
        sys.exit(0)
    sys.stdout.write("### LMMS Engine keys\n\n" + mapping_table() + "\n\n### Schema\n\n" + schema_tables())
