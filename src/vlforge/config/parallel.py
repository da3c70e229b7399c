"""The checks of a parallel layout, in one place: whether Ulysses sequence parallelism can split this model.

Torch-free: the trainer runs it once at start-up on the model's config, ``vlforge plan`` on the plan's layout.

Example:
    >>> check_sequence_parallel(2, family="qwen3_vl", heads=16, world=4)
    >>> check_sequence_parallel(3, family="qwen3_vl", heads=16, world=3)
    Traceback (most recent call last):
    ...
    vlforge.errors.ConfigError: sp_ulysses_degree: 3 does not divide the 16 attention heads of the text model; use a degree that divides 16
    >>> check_sequence_parallel(4, family="qwen3_5", heads=16, world=4, linear_key_heads=2)
    Traceback (most recent call last):
    ...
    vlforge.errors.ConfigError: sp_ulysses_degree: 4 does not divide the 2 key heads of the text model's Gated DeltaNet (linear attention) layers, which are split by heads; use a degree that divides 2
"""

from __future__ import annotations

from typing import Any

from vlforge.errors import ConfigError
from vlforge.models.families import names, supports


def sequence_parallel_heads(model_config: Any) -> dict[str, Any]:
    """The head counts :func:`check_sequence_parallel` reads, from a model's (top-level) config."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    return {"heads": text.num_attention_heads, "linear_key_heads": getattr(text, "linear_num_key_heads", None)}


def check_sequence_parallel(degree: int, *, family: str, heads: int, world: int,
                            processes: str = "process(es) of this run", linear_key_heads: int | None = None) -> None:
    """Refuse a degree the family, its text heads (``linear_key_heads``: the Gated DeltaNet layers' key heads,
    Qwen3.5) or the number of processes cannot take (one line each)."""
    if degree <= 1:
        return
    if not supports(family, "sequence_parallel"):
        raise ConfigError(f"sp_ulysses_degree: {degree} is not supported for model family {family!r} "
                          f"(supported: {', '.join(names(sequence_parallel=True))}); set sp_ulysses_degree: 1")
    if heads % degree:
        raise ConfigError(f"sp_ulysses_degree: {degree} does not divide the {heads} attention heads of the text "
                          f"model; use a degree that divides {heads}")
    if linear_key_heads is not None and linear_key_heads % degree:
        raise ConfigError(f"sp_ulysses_degree: {degree} does not divide the {linear_key_heads} key heads of the "
                          f"text model's Gated DeltaNet (linear attention) layers, which are split by heads; "
                          f"use a degree that divides {linear_key_heads}")
    if world % degree:
        raise ConfigError(f"sp_ulysses_degree: {degree} does not divide the {world} {processes}; "
                          f"use a multiple of {degree}")
