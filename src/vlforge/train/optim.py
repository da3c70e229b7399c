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
from vlforge.memory.estimate import OPTIMIZER_CHUNK_ELEMENTS

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
                    device: torch.device) -> torch.optim.Optimizer:
    """AdamW over ``params`` (only those that require grad), per ``cfg.optim`` and ``cfg.optimizer_state_dtype``.

    ``adamw_torch_fused``: the fused kernel where ``device`` has one (CPU and CUDA in torch 2.13), else
    foreach with a log line saying so; ``adamw_torch``: ``torch.optim.AdamW`` with foreach. With
    ``optimizer_state_dtype: bfloat16``: :class:`AdamWLowPrecisionStates` (torch's fused and foreach kernels take one
    dtype for weights and states).
    """
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    trainable = [p for p in params if p.requires_grad]
    kwargs = {"lr": cfg.learning_rate, "betas": (cfg.adam_beta1, cfg.adam_beta2), "eps": cfg.adam_epsilon,
              "weight_decay": cfg.weight_decay}
    if cfg.optimizer_state_dtype != "float32":
        optimizer = AdamWLowPrecisionStates(trainable, state_dtype=getattr(torch, cfg.optimizer_state_dtype), **kwargs)
        logger.info("optimizer: AdamW with %s moments (update in float32, chunked foreach) over %d tensors",
                    cfg.optimizer_state_dtype, len(trainable))
        return optimizer
    fused = cfg.optim == "adamw_torch_fused" and device.type in _get_fused_kernels_supported_devices()
    if cfg.optim == "adamw_torch_fused" and not fused:
        logger.info("optim: adamw_torch_fused: torch has no fused AdamW kernel for %s devices; using foreach",
                    device.type)
    optimizer = torch.optim.AdamW(trainable, fused=fused, **kwargs) if fused else torch.optim.AdamW(
        trainable, foreach=True, **kwargs)
    logger.info("optimizer: AdamW (%s) over %d tensors", "fused" if fused else "foreach", len(trainable))
    return optimizer


class AdamWLowPrecisionStates(torch.optim.Optimizer):
    """AdamW (torch's formula, decoupled weight decay, bias correction) whose two moments are stored in
    ``state_dtype`` (bfloat16): each step reads them into float32, updates them and the weights in float32
    arithmetic, and stores them rounded. The first step equals torch's AdamW exactly; later ones differ by the
    rounding of the stored moments. State keys are torch's (``step``, ``exp_avg``, ``exp_avg_sq``), so distributed
    checkpoints hold it as they hold ``torch.optim.AdamW``'s."""

    def __init__(self, params: Iterable[torch.nn.Parameter], *, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, state_dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.state_dtype = state_dtype

    def _chunks(self, params: list[torch.nn.Parameter]) -> Iterable[list[torch.nn.Parameter]]:
        chunk: list[torch.nn.Parameter] = []
        size = 0
        for param in params:
            if chunk and (size + param.numel() > OPTIMIZER_CHUNK_ELEMENTS or param.device != chunk[0].device):
                yield chunk
                chunk, size = [], 0
            chunk.append(param)
            size += param.numel()
        if chunk:
            yield chunk

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for param in params:
                state = self.state[param]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)  # on the host, as torch's AdamW keeps it
                    state["exp_avg"] = torch.zeros_like(param, dtype=self.state_dtype,
                                                        memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=self.state_dtype,
                                                           memory_format=torch.preserve_format)
            for chunk in self._chunks(params):
                self._update(chunk, group)
        return loss

    def _update(self, params: list[torch.nn.Parameter], group: dict[str, Any]) -> None:
        lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        states = [self.state[p] for p in params]
        for state in states:
            state["step"] += 1
        step = float(states[0]["step"])  # a host tensor: no device sync
        grads = [p.grad.float() for p in params]
        means = [s["exp_avg"].float() for s in states]
        squares = [s["exp_avg_sq"].float() for s in states]
        if decay:
            torch._foreach_mul_(params, 1 - lr * decay)
        torch._foreach_lerp_(means, grads, 1 - beta1)
        torch._foreach_mul_(squares, beta2)
        torch._foreach_addcmul_(squares, grads, grads, 1 - beta2)
        correction1 = 1 - beta1 ** step
        correction2_sqrt = math.sqrt(1 - beta2 ** step)
        denominators = torch._foreach_sqrt(squares)
        torch._foreach_div_(denominators, correction2_sqrt)
        torch._foreach_add_(denominators, eps)
        torch._foreach_addcdiv_(params, means, denominators, -lr / correction1)
        for state, mean, square in zip(states, means, squares, strict=True):
            if state["exp_avg"] is not mean:
                state["exp_avg"].copy_(mean)
                state["exp_avg_sq"].copy_(square)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainingConfig, total: int) -> LambdaLR:
    """The ``lr_scheduler_type`` schedule over ``total`` optimiser steps."""
    warm = warmup_steps(cfg, total)
    kind, ratio, kw = cfg.lr_scheduler_type, cfg.lr_decay_ratio, dict(cfg.lr_scheduler_kwargs)
    return LambdaLR(optimizer, lambda step: lr_multiplier(step, kind, total=total, warmup=warm, decay_ratio=ratio,
                                                          kwargs=kw))


def follow_schedule(optimizer: torch.optim.Optimizer, scheduler: LambdaLR) -> None:
    """After a resume: the learning rate of the step about to run from *this* run's schedule. The optimizer's state
    restores the rate the saving run would have used next; a run resumed with another ``max_steps`` or warmup
    then took one step at the old schedule's rate. Bit-identical where the schedule is unchanged (the same
    product the scheduler computes)."""
    rates = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    scheduler._last_lr = rates

