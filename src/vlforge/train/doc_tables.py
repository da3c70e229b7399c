"""Markdown tables for docs/train.md, generated from the schema and the LMMS key table (tests keep them in sync).

Run ``python -m vlforge.train.doc_tables`` to print both tables after changing the schema or the key table.

Example:
    >>> mapping_table().splitlines()[0]
    '| LMMS Engine key | vlforge key | notes |'
"""

from __future__ import annotations

import json
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from vlforge.train.lmms_compat import KEY_TABLE
from vlforge.train.schema import model_in_annotation, section_models


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def mapping_table() -> str:
    """Every LMMS Engine key vlforge reads and the native key it becomes."""
    rows = ["| LMMS Engine key | vlforge key | notes |", "|---|---|---|"]
    rows += [f"| `{e.lmms}` | `{e.native}` | {_cell(e.note)} |" for e in KEY_TABLE]
    return "\n".join(rows)


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

    sys.stdout.write("### LMMS Engine keys\n\n" + mapping_table() + "\n\n### Schema\n\n" + schema_tables())
