"""``key=value`` overrides on top of a config, by native dotted path or by LMMS Engine key.

Native paths (``training.learning_rate=1e-4``, ``data.datasets.0.weight=2``) work for every layout; LMMS
keys (``trainer_args.learning_rate=1e-4``, ``dataset_config.packing=false``) are translated through the same
key table as files. Values are read as YAML (``true``, ``1e-4``, ``[visual]``, ``null``).

Example:
    >>> native = {"training": {"learning_rate": 1e-5}}
    >>> applied = apply_overrides(native, ["training.learning_rate=3e-4", "trainer_args.bf16=true"])
    >>> native["training"], native["fsdp"], sorted(applied)[:2]
    ({'learning_rate': '3e-4', 'bf16': True}, {'mixed_precision': 'pure_bf16', 'param_dtype': 'bfloat16'}, [('fsdp', 'mixed_precision'), ('fsdp', 'param_dtype')])
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, get_args, get_origin

import yaml

from vlforge.config.lmms import (
    BY_LMMS,
    GROUPS,
    LMMS_SECTIONS,
    Expand,
    Ignore,
    classification,
    group_children,
    inert_reason,
    precision_values,
)
from vlforge.config.lmms_keys import REFUSED, REFUSED_OK, is_default
from vlforge.config.problems import ConfigValidationError, PathT, Problem, render_path, suggest
from vlforge.config.schema import TrainConfig
from vlforge.config.suggestions import unknown_key_message
from vlforge.strict import model_in_annotation

logger = logging.getLogger(__name__)


def apply_overrides(native: dict[str, Any], overrides: Iterable[str]) -> dict[PathT, str]:
    """Apply each ``key=value`` to ``native`` in place; return native path -> the override that set it.

    Raises :class:`ConfigValidationError` naming every malformed or unknown override.
    """
    applied: dict[PathT, str] = {}
    problems: list[Problem] = []
    for text in overrides:
        origin = f"override {text!r}"
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(Problem(origin, None, "", "expected key=value, e.g. training.learning_rate=1e-4"))
            continue
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as error:
            reason = getattr(error, "problem", None) or "cannot parse"
            problems.append(Problem(origin, None, key, f"value is not valid YAML: {reason}"))
            continue
        parts = key.split(".")
        if parts[0] in LMMS_SECTIONS:
            resolved = _lmms_paths(parts, value, origin, problems)
        else:
            native_path = _native_path(parts, origin, problems)
            resolved = None if native_path is None else [(native_path, value)]
        for path, value in resolved or ():
            problem = _assign(native, path, value)
            if problem:
                problems.append(Problem(origin, None, render_path(path), problem))
            else:
                applied[path] = origin
    if problems:
        raise ConfigValidationError(problems)
    return applied


def _lmms_paths(parts: list[str], value: Any, origin: str,
                problems: list[Problem]) -> list[tuple[PathT, Any]] | None:
    """Native (path, value) pairs of one LMMS-key override (several for ``bf16``; none for an inert key)."""
    dotted = ".".join(parts)
    kind = classification(dotted)
    if kind in ("unknown", "group"):
        group = next(g for g in sorted(GROUPS, key=len, reverse=True) if dotted.startswith(g + ".") or g == "")
        close = suggest(dotted[len(group) + 1:] if group else dotted, group_children(group))
        hint = f"; did you mean {group + '.' + close!r}?" if close else ""
        problems.append(Problem(origin, None, dotted, f"unknown LMMS key{hint}"))
        return None
    if kind != "honoured":
        if is_default(dotted, value) or value in REFUSED_OK.get(dotted, ()):
            return []
        if kind == "refused":
            problems.append(Problem(origin, None, dotted, f"{value!r} is refused: {REFUSED[dotted]}"))
            return None
        logger.warning("%s: %s has no effect: %s", origin, dotted, inert_reason(dotted))
        return []
    if dotted in ("trainer_args.bf16", "trainer_args.fp16"):
        if value is None or (dotted == "trainer_args.fp16" and not value):
            return []
        values = precision_values(bool(value) and dotted == "trainer_args.bf16")
        return [(tuple(native.split(".")), item) for native, item in values.items()]
    entry = BY_LMMS[dotted]
    if entry.convert is not None and value is not None:
        try:
            value = entry.convert(value)
        except ValueError as error:
            problems.append(Problem(origin, None, dotted, str(error)))
            return None
    if isinstance(value, Ignore):
        logger.warning("%s: %s has no effect: %s", origin, dotted, value.reason)
        return []
    values = value.values if isinstance(value, Expand) else {entry.native: value} if entry.native else {}
    return [(tuple(native.split(".")), item) for native, item in values.items()]


def _native_path(parts: list[str], origin: str, problems: list[Problem]) -> PathT | None:
    path: list[str | int] = []
    cls: Any = TrainConfig
    in_list = False
    for part in parts:
        if in_list:
            if not part.isdigit():
                problems.append(Problem(origin, None, render_path(path), f"expected a list index, got {part!r}"))
                return None
            path.append(int(part))
            in_list = False
            continue
        if cls is None or part not in cls.model_fields:
            section = ".".join(str(p) for p in path if isinstance(p, str))
            message = unknown_key_message(section, part) if cls is not None else "is not a section"
            problems.append(Problem(origin, None, render_path([*path, part]), message))
            return None
        annotation = cls.model_fields[part].annotation
        path.append(part)
        cls = model_in_annotation(annotation)
        in_list = cls is not None and _is_list(annotation)
    return tuple(path)


def _is_list(annotation: Any) -> bool:
    if get_origin(annotation) is list:
        return True
    return any(_is_list(arg) for arg in get_args(annotation))


def _assign(native: dict[str, Any], path: PathT, value: Any) -> str | None:
    target: Any = native
    for depth, part in enumerate(path[:-1]):
        nxt = path[depth + 1]
        if isinstance(part, int):
            if not isinstance(target, list) or part >= len(target):
                return f"there is no entry [{part}] to override"
            target = target[part]
            continue
        if not isinstance(target, dict):
            return "the enclosing value is not a mapping"
        if part not in target or target[part] is None:
            if isinstance(nxt, int):
                return f"there is no list at {render_path(path[: depth + 1])} to index"
            target[part] = {}
        target = target[part]
    last = path[-1]
    if isinstance(last, int):
        if not isinstance(target, list) or last >= len(target):
            return f"there is no entry [{last}] to override"
    elif not isinstance(target, dict):
        return "the enclosing value is not a mapping"
    target[last] = value
    return None
