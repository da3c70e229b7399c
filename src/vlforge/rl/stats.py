"""Group statistics of GRPO rewards and the verdict they give (no torch: the probe and the TRL callback share it).

GRPO's advantage of a completion is its reward minus its group's mean (over the group's spread): a group whose
rewards are all equal gives every completion advantage 0, and a step in which every group is like that changes
no weight.

Example:
    >>> groups = [group_stats(0, [0.0, 0.0]), group_stats(1, [1.0, 1.0]), group_stats(2, [0.0, 1.0])]
    >>> verdict(groups)[0], round(verdict(groups)[1], 2)
    ('weak', 0.67)
    >>> verdict([group_stats(0, [0.1, 0.1])])[0]
    'dead'
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel

from vlforge.errors import ExitCode

VERDICT_EXIT = {"ok": ExitCode.OK, "weak": ExitCode.WARNING, "dead": ExitCode.FAILED}
"""The exit code of each verdict of ``rl check`` and ``rl probe``."""

EQUAL = 1e-9
"""Rewards closer than this are equal."""
WEAK_SHARE = 0.5
"""More than this share of groups without spread: most prompts teach nothing (verdict ``weak``)."""


class GroupStats(BaseModel):
    """One prompt's group of completions."""

    prompt: int
    rewards: list[float | None]
    """None: the reward returned None / NaN (TRL counts it as NaN)."""
    mean: float | None
    std: float | None
    spread: float
    """max - min over the finite rewards (0 when fewer than two)."""


def group_stats(prompt: int, rewards: list[float]) -> GroupStats:
    finite = [r for r in rewards if r is not None and math.isfinite(r)]
    mean = sum(finite) / len(finite) if finite else None
    std = math.sqrt(sum((r - mean) ** 2 for r in finite) / len(finite)) if finite and mean is not None else None
    spread = (max(finite) - min(finite)) if len(finite) > 1 else 0.0
    return GroupStats(prompt=prompt, rewards=[r if r is not None and math.isfinite(r) else None for r in rewards],
                      mean=mean, std=std, spread=spread)


def zero_spread_share(groups: list[GroupStats]) -> float:
    return sum(g.spread <= EQUAL for g in groups) / len(groups) if groups else 1.0


def verdict(groups: list[GroupStats]) -> tuple[Literal["ok", "weak", "dead"], float, str]:
    """``(verdict, zero-spread share, message)``: dead when no group has spread, weak when most have none."""
    share = zero_spread_share(groups)
    values = sorted({round(r, 6) for g in groups for r in g.rewards if r is not None})
    if share >= 1.0:
        what = f"every reward is {values[0]:g}" if len(values) == 1 else (
            "no reward is a number" if not values else "every group's rewards are equal")
        return "dead", share, (f"no group of completions has any reward spread ({what}): every GRPO advantage is "
                               "0 and the steps change no weight")
    if share > WEAK_SHARE:
        return "weak", share, (f"{share:.0%} of the groups have no reward spread: those prompts teach nothing "
                               "(advantage 0)")
    return "ok", share, f"{1 - share:.0%} of the groups have reward spread"
