"""Timing of a stock conv against vlforge's GEMM path on the actual device: used by ``precision="auto"``
and by ``vlforge doctor``'s measurement (which adds model-level reporting on top).

Timing runs on the actual device and dtype: CUDA events (after a synchronise) on CUDA, otherwise
``time.perf_counter`` around a device synchronise. Each value is the median of repeats after one
warm-up; tiny calls are looped so a sample lasts at least ~1 ms. Inputs and weights are fresh
tensors of the conv's shape, so measuring never touches a model's parameters or gradients.

Example (CPU, well under a second):
    >>> import torch
    >>> from vlforge.patches.timing import choose_path
    >>> conv = torch.nn.Conv3d(3, 16, (2, 4, 4), stride=(2, 4, 4))
    >>> choose_path(conv, torch.randn(64, 3, 2, 4, 4), train=False, seconds=0.1) in ("gemm", "conv")
    True
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from vlforge.patches.patch_embed import gemm_conv_forward

logger = logging.getLogger(__name__)

MAX_REPEATS = 15
MIN_SAMPLE_SECONDS = 1e-3


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu":
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None and accelerator.is_available():
            accelerator.synchronize()


def time_once(fn: Callable[[], Any], device: torch.device, inner: int) -> float:
    """Seconds per call of ``fn``, averaged over ``inner`` back-to-back calls."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0 / inner
    synchronize(device)
    begin = time.perf_counter()
    for _ in range(inner):
        fn()
    synchronize(device)
    return (time.perf_counter() - begin) / inner


def time_variants(
    variants: dict[str, Callable[[], Any]], device: torch.device, seconds: float, max_repeats: int = MAX_REPEATS
) -> tuple[dict[str, float], int]:
    """Median seconds per call of each variant, repeats interleaved, within about ``seconds``.

    One warm-up per variant estimates its cost; repeats are then sized to the budget (at least 1,
    at most ``max_repeats``). Returns ``({name: median_seconds}, repeats)``.
    """
    started = time.perf_counter()
    estimate = {name: time_once(fn, device, 1) for name, fn in variants.items()}
    inner = {name: max(1, min(100, math.ceil(MIN_SAMPLE_SECONDS / max(t, 1e-7)))) for name, t in estimate.items()}
    per_round = sum(estimate[name] * inner[name] for name in variants)
    remaining = seconds - (time.perf_counter() - started)
    repeats = max(1, min(max_repeats, int(remaining / max(per_round, 1e-9))))
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            samples[name].append(time_once(fn, device, inner[name]))
    return {name: statistics.median(values) for name, values in samples.items()}, repeats


def timing_conv(conv: Any, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A fresh stock conv with ``conv``'s shape: an ``nn.Conv*`` or a record with ``kernel``,
    ``in_channels``, ``out_channels`` and ``bias`` (never the model's own module or weights)."""
    kernel = tuple(conv.kernel_size if isinstance(conv, nn.Module) else conv.kernel)
    klass = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[len(kernel)]
    return klass(
        conv.in_channels, conv.out_channels, kernel, stride=kernel,
        bias=(conv.bias is not None) if isinstance(conv, nn.Module) else conv.bias,
        device=device, dtype=dtype,
    )


def conv_variants(
    stock: nn.Module, shape: Sequence[int], device: torch.device, dtype: torch.dtype, train: bool
) -> dict[str, Callable[[], Any]]:
    x = torch.randn(*shape, device=device, dtype=dtype)
    params = [p for p in stock.parameters()]

    def conv_fwd() -> torch.Tensor:
        return stock._conv_forward(x, stock.weight, stock.bias)

    def gemm_fwd() -> torch.Tensor:
        return gemm_conv_forward(stock, x)

    if not train:
        return {"conv": conv_fwd, "gemm": gemm_fwd}
    with torch.no_grad():
        grad_out = torch.randn_like(conv_fwd())

    def backward(fn: Callable[[], torch.Tensor]) -> Callable[[], Any]:
        def run() -> Any:
            out = fn()
            return torch.autograd.grad(out, params, grad_out)

        return run

    return {"conv": backward(conv_fwd), "gemm": backward(gemm_fwd)}


AUTO_SECONDS = 0.5
"""Budget of one ``precision="auto"`` decision (per key, once per process)."""
_auto_lock = threading.Lock()


def choose_path(
    conv: nn.Module, x: torch.Tensor, *, train: bool, dtype: torch.dtype | None = None, seconds: float = AUTO_SECONDS
) -> str:
    """``"gemm"`` or ``"conv"``: whichever is faster for ``conv`` on ``x``'s device and shape.

    Measured with fresh tensors of ``x``'s shape in ``dtype`` (default ``x.dtype``; the autocast
    dtype inside autocast), forward, or forward+backward when ``train``, with autocast off; the GEMM
    wins ties. Called by ``vlforge.patches`` once per key; never under graph capture.
    """
    device, dtype = x.device, dtype or x.dtype
    with _auto_lock, torch.inference_mode(False), torch.autocast(device.type, enabled=False):
        stock = timing_conv(conv, device, dtype)
        stock.requires_grad_(train)
        grad_mode = torch.enable_grad() if train else torch.no_grad()
        with grad_mode:
            variants = conv_variants(stock, tuple(x.shape), device, dtype, train=train)
            medians, repeats = time_variants(variants, device, seconds, max_repeats=7)
    choice = "gemm" if medians["gemm"] <= medians["conv"] else "conv"
    logger.info(
        "precision=auto: %s for %s %s on %s (%s%s): conv %.3g ms, GEMM %.3g ms, %d repeats",
        choice, type(conv).__name__, tuple(x.shape), device, str(dtype).removeprefix("torch."),
        ", fwd+bwd" if train else "", medians["conv"] * 1000, medians["gemm"] * 1000, repeats,
    )
    return choice
