"""Models: the one loader (:func:`load`), tiny presets per family, torchvision-free processors.

Importing this package makes Qwen-VL-family processors constructible without torchvision (see
:mod:`vlforge.models.compat`); with torchvision installed that step does nothing.

Example (CPU, a few seconds):
    >>> from vlforge.models import load
    >>> loaded = load("tiny:qwen2_vl")                                  # doctest: +SKIP
    >>> loaded.family                                                   # doctest: +SKIP
    'qwen2_vl'
"""

from __future__ import annotations

from vlforge.models.compat import ensure_processor_support
from vlforge.models.load import LoadedModel, load, parse_dtype, resolve

ensure_processor_support()

__all__ = ["LoadedModel", "load", "parse_dtype", "resolve"]
