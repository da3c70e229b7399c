"""Model references and dtype names, checked without torch or transformers (so a typo costs < 1 s).

A model reference is a local checkpoint directory (holding ``config.json``), a ``tiny:FAMILY[+untied][@SEED]``
preset, a ``real:NAME[@SEED]`` real-size preset (:mod:`vlforge.models.presets`), or an ``org/name`` hub id. :func:`check_model_ref` refuses what :func:`vlforge.models.load.resolve`
would refuse, with the same message, before anything heavy is imported.

Example:
    >>> dtype_name("bf16")
    'bfloat16'
    >>> check_model_ref("tiny:qwen3_vl")
    >>> check_model_ref("./no-such-checkpoint")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    vlforge.errors.ModelLoadError: no-such-checkpoint does not exist (and is neither a tiny: preset nor ...)
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from vlforge.errors import ConfigError, ModelLoadError
from vlforge.models.presets import PRESET_PREFIX, REAL_PREFIX, parse_preset, parse_real

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DTYPE_NAMES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
}


def dtype_name(dtype: str) -> str:
    """Canonical name (``float32``, ``bfloat16``, ``float16``) of a dtype alias such as ``"bf16"``."""
    key = dtype.strip().lower().removeprefix("torch.")
    if key not in DTYPE_NAMES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of {', '.join(sorted(DTYPE_NAMES))}")
    return DTYPE_NAMES[key]


def text_setting(config: dict[str, Any], key: str) -> Any:
    """``key`` of a checkpoint's language model from its ``config.json``: ``text_config``'s (a VLM), else the top
    level's (None when neither has it)."""
    text = config.get("text_config")
    return text[key] if isinstance(text, dict) and key in text else config.get(key)


def local_checkpoint(text: str) -> Path | None:
    """The checkpoint directory ``text`` names when it exists on disk, else None (a preset or a hub id).

    A file, or a directory without ``config.json``, is a ModelLoadError; so is a path that does not
    exist and cannot be a hub id either.
    """
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{path} is a file; pass the checkpoint directory that holds config.json")
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} has no config.json; it is not a Hugging Face checkpoint directory")
        return path.absolute()
    if not _HUB_ID.match(text) or text.startswith((".", "~")):
        raise ModelLoadError(f"{path} does not exist (and is neither a tiny:/real: preset nor an org/name hub id)")
    return None


def check_model_ref(ref: str | os.PathLike[str]) -> None:
    """Refuse a model reference that cannot be loaded (as ``resolve`` would), importing nothing heavy."""
    text = os.fspath(ref)
    if text.startswith(PRESET_PREFIX):
        parse_preset(text)
    elif text.startswith(REAL_PREFIX):
        parse_real(text)
    else:
        local_checkpoint(text)


def model_family(ref: str | os.PathLike[str]) -> str | None:
    """``model_type`` of a preset or local checkpoint, read without loading it; None for a hub id or an odd config."""
    text = os.fspath(ref)
    if text.startswith(PRESET_PREFIX):
        return parse_preset(text).family
    if text.startswith(REAL_PREFIX):
        return parse_real(text)[1].family
    local = local_checkpoint(text)
    if local is None:
        return None
    import json

    try:
        model_type = json.loads((local / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return model_type if isinstance(model_type, str) else None
