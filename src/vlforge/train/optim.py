"""AdamW (fused where the device has the kernel) and the learning-rate schedules.

Schedules are multipliers of the peak learning rate as a function of the optimiser step:
linear warm-up over ``warmup`` steps, then ``linear`` / ``cosine`` decay to 0 at ``total``,
``constant``, or ``wsd`` (warmup-stable-decay: constant, then a linear decay to 0 over the last
``decay_ratio * total`` steps).

Example:
    >>> [round(lr_multiplier(s, "cosine", total=10, warmup=2), 3) for s in (0, 1, 2, 6, 10)]
    [0.0, 0.5, 1.0, 0.5, 0.0]
    >>> [round(lr_multiplier(s, "wsd", total=10, warmup=0, decay_ratio=0.2), 2) for s in (0, 7, 8, 9, 10)]
    [1.0, 1.0, 1.0, 0.5, 0.0]
    >>> [round(lr_multiplier(s, "cosine", total=10, warmup=0, kwargs={"min_lr_ratio": 0.1}), 3) for s in (0, 5, 10)]
    [1.0, 0.55, 0.1]
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from vlforge.config.schema import TrainingConfig

logger = logging.getLogger(__name__)


def warmup_steps(cfg: TrainingConfig, total: int) -> int:
    """Warm-up steps from ``warmup_steps`` or ``warmup_ratio`` of ``total`` (rounded up)."""
    if cfg.warmup_steps:
        return cfg.warmup_steps
    return math.ceil(cfg.warmup_ratio * total)


def lr_multiplier(step: int, kind: str, *, total: int, warmup: int, decay_ratio: float = 0.1,
                  kwargs: dict[str, Any] | None = None) -> float:
    """Learning-rate multiplier of optimiser step ``step`` (0-based) for schedule ``kind``.

    ``kwargs`` are the schedule parameters of ``training.lr_scheduler_kwargs`` (LMMS Engine's names and
    formulas): ``cosine`` ``min_lr_ratio`` / ``num_cycles``; ``wsd`` with any of ``stable_ratio``,
    ``min_lr_ratio``, ``num_cycles``, ``decay`` follows LMMS Engine's warmup-stable-decay (the stable part is
    ``int(stable_ratio x (total - warmup))`` steps, default 0.9, then a cosine decay to ``min_lr_ratio``);
    ``constant`` warms up from ``start_factor`` to ``end_factor`` and stays there.
    """
    kw = kwargs or {}
    floor = float(kw.get("min_lr_ratio", 0.0))
    if kind == "constant":
        start, end = float(kw.get("start_factor", 0.0)), float(kw.get("end_factor", 1.0))
        if warmup and step < warmup:
            return start + (end - start) * step / warmup
        return end
    if warmup and step < warmup:
        return floor + (1.0 - floor) * step / warmup if kind == "cosine" else step / warmup
    if kind == "wsd" and kw:
        return _lmms_wsd(step, total=total, warmup=warmup, kw=kw)
    if kind == "wsd":
        decay = max(1, math.ceil(decay_ratio * total))
        start = max(warmup, total - decay)
        if step < start:
            return 1.0
        return max(0.0, (total - step) / max(1, total - start))
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    if kind == "linear":
        return 1.0 - progress
    if kind == "cosine":
        cycles = float(kw.get("num_cycles", 0.5))
        wave = math.cos(math.pi * cycles * 2.0 * progress)
        return max(floor, wave * (1.0 - floor) * 0.5 + (1.0 + floor) * 0.5)
    raise ValueError(f"unknown lr_scheduler_type {kind!r}")


def _lmms_wsd(step: int, *, total: int, warmup: int, kw: dict[str, Any]) -> float:
    floor, cycles = float(kw.get("min_lr_ratio", 0.0)), float(kw.get("num_cycles", 0.5))
    remaining = max(0, total - warmup)
    stable = int(remaining * float(kw.get("stable_ratio", 0.9)))
    if step < warmup + stable:
        return 1.0
    if step >= total:
        return floor
    progress = (step - warmup - stable) / max(1, remaining - stable)
    if kw.get("decay", "cosine") == "linear":
        value = max(0.0, 1.0 - progress)
    else:
        value = max(0.0, 0.5 * (1.0 + math.cos(math.pi * cycles * 2.0 * progress)))
    return (1.0 - floor) * value + floor


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: TrainingConfig,
                    device: torch.device) -> torch.optim.AdamW:
    """AdamW over ``params`` (only those that require grad), per ``cfg.optim``.

    ``adamw_torch_fused``: the fused kernel where ``device`` has one (CPU and CUDA in torch 2.13), else
    foreach with a log line saying so; ``adamw_torch``: ``torch.optim.AdamW`` with foreach.
    """
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    trainable = [p for p in params if p.requires_grad]
    kwargs = {"lr": cfg.learning_rate, "betas": (cfg.adam_beta1, cfg.adam_beta2), "eps": cfg.adam_epsilon,
              "weight_decay": cfg.weight_decay}
    fused = cfg.optim == "adamw_torch_fused" and device.type in _get_fused_kernels_supported_devices()
    if cfg.optim == "adamw_torch_fused" and not fused:
        logger.info("optim: adamw_torch_fused: torch has no fused AdamW kernel for %s devices; using foreach",
                    device.type)
    optimizer = torch.optim.AdamW(trainable, fused=fused, **kwargs) if fused else torch.optim.AdamW(
        trainable, foreach=True, **kwargs)
    logger.info("optimizer: AdamW (%s) over %d tensors", "fused" if fused else "foreach", len(trainable))
    return optimizer


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainingConfig, total: int) -> LambdaLR:
    """The ``lr_scheduler_type`` schedule over ``total`` optimiser steps."""
    warm = warmup_steps(cfg, total)
    kind, ratio, kw = cfg.lr_scheduler_type, cfg.lr_decay_ratio, dict(cfg.lr_scheduler_kwargs)
    return LambdaLR(optimizer, lambda step: lr_multiplier(step, kind, total=total, warmup=warm, decay_ratio=ratio,
                                                          kwargs=kw))
