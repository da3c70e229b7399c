"""Messages for unknown keys in the native layout: misplaced, LMMS-named, or misspelled.

Example:
    >>> unknown_key_message("data", "learning_rate")
    'misplaced key; it belongs under training'
    >>> unknown_key_message("training", "lerning_rate")
    "unknown key; did you mean 'learning_rate'?"
    >>> unknown_key_message("data", "dataset_type")
    "unknown key; LMMS Engine's dataset_config.dataset_type is 'data.streaming' here"
"""

from __future__ import annotations

from vlforge.config.lmms import KEY_TABLE
from vlforge.config.problems import suggest
from vlforge.config.schema import section_models
from vlforge.strict import model_in_annotation

#: LMMS Engine sub-mappings and the native section each one became.
_RENAMED_GROUPS = {"processor_config": "processor", "fsdp_config": "fsdp"}


def _join(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def unknown_key_message(section: str, key: str) -> str:
    """Why ``key`` is not valid in native ``section`` (dotted, "" = top level) and what to write instead."""
    sections = section_models()
    own = sections.get(section)
    valid = list(own.model_fields) if own is not None else []
    homes = [path for path, cls in sections.items() if path != section and key in cls.model_fields]
    homes.sort(key=lambda path: model_in_annotation(sections[path].model_fields[key].annotation) is not None)
    if homes:
        return f"misplaced key; it belongs under {homes[0] or 'the top level'}"
    if key in _RENAMED_GROUPS:
        return f"unknown key; LMMS Engine's {key} is the {_RENAMED_GROUPS[key]!r} section here"
    renamed = [entry for entry in KEY_TABLE if entry.lmms.rsplit(".", 1)[-1] == key
               and entry.native and entry.native not in sections]
    if renamed:
        return f"unknown key; LMMS Engine's {renamed[0].lmms} is {renamed[0].native!r} here"
    close = suggest(key, valid)
    if close:
        return f"unknown key; did you mean {close!r}?"
    everywhere = [_join(path, name) for path, cls in sections.items() for name in cls.model_fields]
    close = suggest(key, everywhere) or suggest(key, [name.rsplit(".", 1)[-1] for name in everywhere])
    if close:
        full = next(name for name in everywhere if name == close or name.endswith("." + close))
        return f"unknown key; did you mean {full!r}?"
    return "unknown key; valid here: " + ", ".join(valid)
