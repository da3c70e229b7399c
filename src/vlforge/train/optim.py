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
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

from vlforge.train.schema import TrainingConfig

logger = logging.getLogger(__name__)


def warmup_steps(cfg: TrainingConfig, total: int) -> int:
    """Warm-up steps from ``warmup_steps`` or ``warmup_ratio`` of ``total`` (rounded up)."""
    if cfg.warmup_steps:
        return cfg.warmup_steps
    return math.ceil(cfg.warmup_ratio * total)


def lr_multiplier(step: int, kind: str, *, total: int, warmup: int, decay_ratio: float = 0.1) -> float:
    """Learning-rate multiplier of optimiser step ``step`` (0-based) for schedule ``kind``."""
    if warmup and step < warmup:
        return step / warmup
    if kind == "constant":
        return 1.0
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
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_scheduler_type {kind!r}")


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: TrainingConfig,
                    device: torch.device) -> torch.optim.AdamW:
    """AdamW over ``params`` (only those that require grad), fused when the device supports it."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    trainable = [p for p in params if p.requires_grad]
    fused = device.type in _get_fused_kernels_supported_devices()
    kwargs = {"lr": cfg.learning_rate, "betas": (cfg.adam_beta1, cfg.adam_beta2), "eps": cfg.adam_epsilon,
              "weight_decay": cfg.weight_decay}
    optimizer = torch.optim.AdamW(trainable, fused=fused, **kwargs) if fused else torch.optim.AdamW(
        trainable, foreach=True, **kwargs)
    logger.info("optimizer: AdamW (%s) over %d tensors", "fused" if fused else "foreach", len(trainable))
    return optimizer


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainingConfig, total: int) -> LambdaLR:
    """The ``lr_scheduler_type`` schedule over ``total`` optimiser steps."""
    warm = warmup_steps(cfg, total)
    kind, ratio = cfg.lr_scheduler_type, cfg.lr_decay_ratio
    return LambdaLR(optimizer, lambda step: lr_multiplier(step, kind, total=total, warmup=warm, decay_ratio=ratio))
