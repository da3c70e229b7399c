"""transformers' tokenizer and processor readers, with Python's cyclic collector paused while they run.

Every place vlforge reads a tokenizer or processor from files goes through here: reading a Qwen tokenizer makes
hundreds of thousands of small objects, and each full collection meanwhile walks the millions that torch and
transformers hold (:mod:`vlforge.collector`; a Qwen2.5-VL processor 1.5 -> 1.0 s). What is read is unchanged.
"""

from __future__ import annotations

import os
from typing import Any

from vlforge.collector import collector_paused


def read_tokenizer(path: str | os.PathLike[str], **kwargs: Any) -> Any:
    """``AutoTokenizer.from_pretrained(path, **kwargs)``."""
    from transformers import AutoTokenizer

    with collector_paused():
        return AutoTokenizer.from_pretrained(path, **kwargs)


def read_processor(path: str | os.PathLike[str], **kwargs: Any) -> Any:
    """``AutoProcessor.from_pretrained(path, **kwargs)`` (a tokenizer alone for a text-only checkpoint)."""
    from transformers import AutoProcessor

    with collector_paused():
        return AutoProcessor.from_pretrained(path, **kwargs)
