"""Models: the one loader (:func:`load`), tiny and real-size presets, torchvision-free processors.

:func:`preset_config` returns the transformers config of a ``tiny:FAMILY`` or ``real:NAME`` preset
(:mod:`vlforge.models.presets` holds the published real sizes and their sources).

Without torchvision, Qwen-VL-family processors are made constructible by :mod:`vlforge.models.compat`
(installed by ``import vlforge``); with torchvision that step does nothing. Public names import their
module on first use, so importing a light submodule never loads torch or transformers.

Example (CPU, a few seconds):
    >>> from vlforge.models import load
    >>> loaded = load("tiny:qwen2_vl")                                  # doctest: +SKIP
    >>> loaded.family                                                   # doctest: +SKIP
    'qwen2_vl'
"""

from __future__ import annotations

from vlforge.lazy import lazy_exports

__all__ = ["LoadedModel", "ensure_processor_support", "load", "parse_dtype", "preset_config", "resolve"]

lazy_exports(__name__, {
    "LoadedModel": "vlforge.models.load",
    "load": "vlforge.models.load",
    "parse_dtype": "vlforge.models.load",
    "resolve": "vlforge.models.load",
    "preset_config": "vlforge.models.presets",
    "ensure_processor_support": "vlforge.models.compat",
})
