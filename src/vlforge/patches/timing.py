"""Timing of a stock conv against vlforge's GEMM path on the actual device: used by ``precision="auto"``
and by ``vlforge doctor``'s measurement (which adds model-level reporting on top).

Timing runs on the actual device and dtype: CUDA events (after a synchronise) on CUDA, otherwise
``time.perf_counter`` around a device synchronise. Each value is the median of repeats after one
warm-up; tiny calls are looped so a sample lasts at least ~1 ms. Inputs and weights are fresh
tensors of the conv's shape, so measuring never touches a model's parameters or gradients.

The time budget is a budget: no call starts once it is spent, nor when its expected cost (its
warm-up's time, or an estimate the caller gives) exceeds what is left. A variant whose warm-up
was the only call that fitted is reported with that one call's time (``extrapolated``); a variant
that never ran is reported as not measured (absent), never invented. Only a call whose cost
could not be known beforehand (a variant's first call) can overrun the budget, by that one call.
One-time costs of the process (the first autograd call, library start-up) are paid before the clock
starts by :func:`prime`, on a single window, so they do not pose as the conv's cost.

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
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vlforge.patches.gemm import gemm_conv_forward

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


@dataclass
class VariantTimes:
    """What :func:`time_variants` measured within its budget."""

    seconds: dict[str, float]
    """Seconds per call of each variant that ran: the median of ``repeats`` timed samples, or its one
    warm-up call when ``repeats`` is 0. A variant that never ran is absent."""
    repeats: int
    """Timed rounds (each variant once per round); 0 when the budget allowed only the warm-ups."""
    skipped: list[str] = field(default_factory=list)
    """Variants never measured: the budget was spent (or their expected cost exceeded it) first."""
    budget: float = 0.0
    elapsed: float = 0.0

    @property
    def extrapolated(self) -> bool:
        """The figures are single (warm-up) calls, not medians of timed repeats."""
        return self.repeats == 0 and bool(self.seconds)

    @property
    def complete(self) -> bool:
        """Every variant measured, with at least one timed repeat."""
        return not self.skipped and self.repeats > 0

    def describe(self) -> str:
        """What is partial, in words ("" when complete)."""
        parts = []
        if self.extrapolated:
            each = " each" if len(self.seconds) > 1 else ""
            parts.append(f"{', '.join(self.seconds)} from one call{each} (no timed repeat fitted)")
        if self.skipped:
            parts.append(f"{', '.join(self.skipped)} not measured")
        return "; ".join(parts)


def time_variants(
    variants: dict[str, Callable[[], Any]],
    device: torch.device,
    seconds: float,
    max_repeats: int = MAX_REPEATS,
    *,
    estimates: dict[str, float] | None = None,
) -> VariantTimes:
    """Median seconds per call of each variant, repeats interleaved, within ``seconds``.

    One warm-up per variant (in order) measures its cost; then as many interleaved rounds as fit
    in what is left (at most ``max_repeats``, possibly none). A warm-up starts only while budget is
    left and, when ``estimates`` gives the variant's expected seconds per call, only if that fits;
    otherwise it and every later variant are skipped. Returns a :class:`VariantTimes`.

    Example (a fast and a slow variant under a 0.2 s budget: the slow one's warm-up spends it):
        >>> import time, torch
        >>> fast, slow = (lambda: time.sleep(0.001)), (lambda: time.sleep(0.25))
        >>> t = time_variants({"fast": fast, "slow": slow, "never": fast}, torch.device("cpu"), 0.2)
        >>> sorted(t.seconds), t.repeats, t.skipped, t.extrapolated
        (['fast', 'slow'], 0, ['never'], True)
    """
    started = time.perf_counter()

    def left() -> float:
        return seconds - (time.perf_counter() - started)

    first: dict[str, float] = {}
    skipped: list[str] = []
    for name, fn in variants.items():
        expected = (estimates or {}).get(name, 0.0)
        if skipped or left() <= 0 or expected > left():
            skipped.append(name)
            continue
        first[name] = time_once(fn, device, 1)
    if skipped:
        return VariantTimes(first, 0, skipped, seconds, time.perf_counter() - started)
    inner = {name: max(1, min(100, math.ceil(MIN_SAMPLE_SECONDS / max(t, 1e-7)))) for name, t in first.items()}
    per_round = sum(first[name] * inner[name] for name in variants)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    repeats = 0
    while repeats < max_repeats and per_round <= left():
        round_started = time.perf_counter()
        for name, fn in variants.items():
            samples[name].append(time_once(fn, device, inner[name]))
        repeats += 1
        per_round = time.perf_counter() - round_started  # the next round costs about what this one did
    figures = first if repeats == 0 else {name: statistics.median(values) for name, values in samples.items()}
    return VariantTimes(figures, repeats, [], seconds, time.perf_counter() - started)


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
    stock: nn.Module, shape: Sequence[int], device: torch.device, dtype: torch.dtype, train: bool,
    x: torch.Tensor | None = None,
) -> dict[str, Callable[[], Any]]:
    """``{"conv": ..., "gemm": ...}`` calls on ``x`` (default: a fresh random input of ``shape``; making one
    of a real shape takes a while, ~0.5 s for 65536 windows on CPU, so callers timing two passes share it)."""
    x = torch.randn(*shape, device=device, dtype=dtype) if x is None else x
    params = [p for p in stock.parameters()]

    def conv_fwd() -> torch.Tensor:
        return stock._conv_forward(x, stock.weight, stock.bias)

    def gemm_fwd() -> torch.Tensor:
        return gemm_conv_forward(stock, x)

    if not train:
        return {"conv": conv_fwd, "gemm": gemm_fwd}
    # stride == kernel on windows of exactly the kernel's size: one output position per window (no untimed
    # conv call to learn the shape; a stock conv call can take seconds).
    grad_out = torch.randn(shape[0], stock.out_channels, *([1] * (len(shape) - 2)), device=device, dtype=dtype)

    def backward(fn: Callable[[], torch.Tensor]) -> Callable[[], Any]:
        def run() -> Any:
            out = fn()
            return torch.autograd.grad(out, params, grad_out)

        return run

    return {"conv": backward(conv_fwd), "gemm": backward(gemm_fwd)}


def prime(stock: nn.Module, shape: Sequence[int], device: torch.device, dtype: torch.dtype, train: bool) -> None:
    """Run each variant once on a single window, untimed: one-time costs of the process (the first
    autograd call starts its engine, ~0.3 s on CPU; library handles and kernels load) must not land in
    the first timed call, which is the figure when the budget fits no repeat."""
    for fn in conv_variants(stock, (1, *shape[1:]), device, dtype, train=train).values():
        fn()
    synchronize(device)


AUTO_SECONDS = 0.5
"""Budget of one ``precision="auto"`` decision (per key, once per process)."""
_auto_lock = threading.Lock()


def choose_path(
    conv: nn.Module, x: torch.Tensor, *, train: bool, dtype: torch.dtype | None = None, seconds: float = AUTO_SECONDS
) -> str:
    """``"gemm"`` or ``"conv"``: whichever is faster for ``conv`` on ``x``'s device and shape.

    Measured with fresh tensors of ``x``'s shape in ``dtype`` (default ``x.dtype``; the autocast
    dtype inside autocast), forward, or forward+backward when ``train``, with autocast off; the GEMM
    wins ties. Within the ``seconds`` budget: when a single call leaves no room for repeats, the
    one-call times decide; when the stock conv's first call spends the budget before the GEMM ran,
    the GEMM is kept (vlforge's default path) and the log says so. Called by ``vlforge.patches`` once
    per key; never under graph capture.
    """
    device, dtype = x.device, dtype or x.dtype
    with _auto_lock, torch.inference_mode(False), torch.autocast(device.type, enabled=False):
        stock = timing_conv(conv, device, dtype)
        stock.requires_grad_(train)
        grad_mode = torch.enable_grad() if train else torch.no_grad()
        with grad_mode:
            prime(stock, tuple(x.shape), device, dtype, train=train)
            variants = conv_variants(stock, tuple(x.shape), device, dtype, train=train)
            timed = time_variants(variants, device, seconds, max_repeats=7)
    ms = {name: timed.seconds[name] * 1000 if name in timed.seconds else None for name in ("conv", "gemm")}
    where = (f"{type(conv).__name__} {tuple(x.shape)} on {device} ({str(dtype).removeprefix('torch.')}"
             f"{', fwd+bwd' if train else ''})")
    if ms["conv"] is None or ms["gemm"] is None:
        measured = ", ".join(f"{name} {value:.3g} ms" for name, value in ms.items() if value is not None)
        logger.info("precision=auto: gemm for %s: %s not measured within the %.3g s budget (%s, one call); "
                    "keeping the GEMM, vlforge's default path", where, " and ".join(timed.skipped), seconds,
                    measured or "nothing")
        return "gemm"
    choice = "gemm" if ms["gemm"] <= ms["conv"] else "conv"
    how = f"{timed.repeats} repeats" if timed.repeats else "one call each, the budget fitted no repeat"
    logger.info("precision=auto: %s for %s: conv %.3g ms, GEMM %.3g ms, %s",
                choice, where, ms["conv"], ms["gemm"], how)
    return choice
