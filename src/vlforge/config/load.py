"""Load a training config: any accepted layout + ``key=value`` overrides -> a validated :class:`TrainConfig`.

Problems come back as one :class:`ConfigValidationError` whose lines each name the file (and line), the key
path and the fix; settings that have no effect on this machine are logged as one warning each.

Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
    >>> _ = path.write_text("data: {dataset_path: d.yaml}\\nmodel: {load_from_pretrained_path: tiny:qwen3_vl}\\n")
    >>> cfg = load_config(path, ["training.learning_rate=3e-4"])
    >>> cfg.training.learning_rate
    0.0003
    >>> load_config(path, ["training.lerning_rate=1"])
    Traceback (most recent call last):
    ...
    vlforge.config.problems.ConfigValidationError: override 'training.lerning_rate=1': training.lerning_rate: unknown key; did you mean 'learning_rate'?
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from vlforge.config.lmms import Translation, translate
from vlforge.config.overrides import apply_overrides
from vlforge.config.problems import ConfigValidationError, PathT, Problem, render_path
from vlforge.config.schema import TrainConfig, section_models
from vlforge.config.suggestions import unknown_key_message
from vlforge.config.yaml_source import YamlSource, read_yaml

logger = logging.getLogger(__name__)

__all__ = ["ConfigValidationError", "ResolvedConfig", "TrainConfig", "load_config", "resolve_config"]


@dataclass
class ResolvedConfig:
    """A validated config and how it was read."""

    config: TrainConfig
    origin: str
    layout: str
    """``native``, ``lmms`` (LMMS Engine mapping layout) or ``lmms_list`` (the guide's list layout)."""
    warnings: list[str] = field(default_factory=list)
    """Settings accepted but without effect on this machine (also logged)."""


def resolve_config(path: str | Path, overrides: Iterable[str] = ()) -> ResolvedConfig:
    """Read, translate, override and validate ``path``; raise :class:`ConfigValidationError` on any problem."""
    source = read_yaml(path)
    if source.data is None:
        raise ConfigValidationError([Problem(source.origin, None, "", "the config file is empty")])
    translation = translate(source.data, source.origin, source.line_of)
    if translation.problems:
        raise ConfigValidationError(translation.problems)
    native = copy.deepcopy(translation.native)
    if not isinstance(native, dict):
        kind = type(native).__name__
        raise ConfigValidationError([Problem(source.origin, 1, "", f"expected a mapping of sections, got {kind}")])
    from_overrides = apply_overrides(native, overrides)
    try:
        config = TrainConfig.model_validate(native)
    except ValidationError as error:
        raise ConfigValidationError(_problems(error, source, translation, from_overrides)) from None
    warnings = [*translation.warnings, *config.inert_warnings()]
    for warning in warnings:
        logger.warning("%s: %s", source.origin, warning)
    return ResolvedConfig(config, source.origin, translation.layout, warnings)


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> TrainConfig:
    """The validated :class:`TrainConfig` of ``path`` (native, LMMS or guide layout) with ``overrides``."""
    return resolve_config(path, overrides).config


def _problems(
    error: ValidationError, source: YamlSource, translation: Translation, from_overrides: dict[PathT, str]
) -> list[Problem]:
    details = error.errors(include_url=False)
    unknown = [item for item in details if item["type"] == "extra_forbidden"]
    if unknown:
        details = unknown  # a misspelled key also makes its intended key "missing": report the cause only
    problems: list[Problem] = []
    seen: set[PathT] = set()
    for item in details:
        loc, message = _describe(item)
        if loc in seen:
            continue
        seen.add(loc)
        problems.append(_locate(loc, message, source, translation, from_overrides))
    return problems


def _describe(item: dict[str, Any]) -> tuple[PathT, str]:
    loc: PathT = tuple(item["loc"])
    kind = item["type"]
    if kind == "vlforge_field":
        return (*loc, *item["ctx"]["field"].split(".")), item["msg"]
    if kind == "extra_forbidden":
        section = ".".join(part for part in loc[:-1] if isinstance(part, str))
        return loc, unknown_key_message(section, str(loc[-1]))
    if kind == "missing":
        section = section_models().get(".".join(str(part) for part in loc))
        required = [name for name, info in section.model_fields.items() if info.is_required()] if section else []
        if required:  # a missing section: name the key the user has to write
            return (*loc, required[0]), "required key is missing"
        return loc, "required section is missing" if section else "required key is missing"
    message = item["msg"]
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
    elif not isinstance(item.get("input"), dict | list):
        shown = repr(item.get("input"))
        message = f"{message} (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
    return loc, message


def _locate(
    loc: PathT, message: str, source: YamlSource, translation: Translation, from_overrides: dict[PathT, str]
) -> Problem:
    for cut in range(len(loc), 0, -1):
        if loc[:cut] in from_overrides:
            return Problem(from_overrides[loc[:cut]], None, render_path(loc), message)
    where = translation.source_path(loc)
    return Problem(source.origin, source.line_of(where), render_path(where), message)


def dump_problems(problems: Sequence[Problem]) -> list[dict[str, Any]]:
    """Problems as JSON-ready dicts (``file``, ``line``, ``key``, ``message``, ``text``)."""
    return [
        {"file": p.origin, "line": p.line, "key": p.path, "message": p.message, "text": str(p)} for p in problems
    ]
