"""The checks of a parallel layout, in one place: whether Ulysses sequence parallelism can split this model.

Torch-free: the trainer runs it once at start-up on the model's config, ``vlforge plan`` on the plan's layout.

Example:
    >>> check_sequence_parallel(2, family="qwen3_vl", heads=16, world=4)
    >>> check_sequence_parallel(3, family="qwen3_vl", heads=16, world=3)
    Traceback (most recent call last):
    ...
    vlforge.errors.ConfigError: sp_ulysses_degree: 3 does not divide the 16 attention heads of the text model; use a degree that divides 16
"""

from __future__ import annotations

from vlforge.errors import ConfigError
from vlforge.models.families import names, supports


def check_sequence_parallel(degree: int, *, family: str, heads: int, world: int,
                            processes: str = "process(es) of this run") -> None:
    """Refuse a degree the family, its text heads or the number of processes cannot take (one line each)."""
    if degree <= 1:
        return
    if not supports(family, "sequence_parallel"):
        raise ConfigError(f"sp_ulysses_degree: {degree} is not supported for model family {family!r} "
                          f"(supported: {', '.join(names(sequence_parallel=True))}); set sp_ulysses_degree: 1")
    if heads % degree:
        raise ConfigError(f"sp_ulysses_degree: {degree} does not divide the {heads} attention heads of the text "
                          f"model; use a degree that divides {heads}")
    if world % degree:
        raise ConfigError(f"sp_ulysses_degree: {degree} does not divide the {world} {processes}; "
                          f"use a multiple of {degree}")
