"""The doctor's measurement: every distinct patch-conv shape of a model, stock conv vs GEMM, at a
realistic number of windows, forward and forward+backward. The timing itself (shared with
``precision="auto"``) is :mod:`vlforge.patches.timing`.

``seconds`` is a budget for the whole measurement: the forward pass gets half of it (all of it
without ``backward``), forward+backward what is left, and it starts only when its expected cost
(:data:`TRAIN_COST_FACTOR` times the forward figures, or more when one call on 1/:data:`PROBE_DIVISOR` of
the windows says so) fits. A figure that had to come from one
call is marked (``Measurement.extrapolated``); a variant or pass the budget did not reach is
reported as not measured (``Measurement.note``), never estimated. Before the clock starts, one
untimed call of each variant on a single window pays the process's one-time costs
(:func:`~vlforge.patches.timing.prime`).

Example (CPU, well under a second):
    >>> import torch
    >>> from vlforge.diagnosis.bench import measure_conv
    >>> conv = torch.nn.Conv3d(3, 16, (2, 4, 4), stride=(2, 4, 4))
    >>> m = measure_conv(conv, windows=64, seconds=0.2)
    >>> sorted(m.forward_ms), m.repeats >= 1
    (['conv', 'gemm'], True)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from vlforge.diagnosis.model_info import ConvInfo, ModelInfo
from vlforge.diagnosis.rules import Measurement
from vlforge.patches.timing import VariantTimes, conv_variants, prime, time_variants, timing_conv

logger = logging.getLogger(__name__)

DEFAULT_IMAGE_PIXELS = 1024 * 1024
"""Default workload: one 1024x1024 image (capped by the processor's max_pixels when smaller)."""
TRAIN_COST_FACTOR = 3.0
"""Expected forward+backward time per call, in forward calls (measured 2.3x-3.4x on CPU for conv and GEMM)."""
PROBE_DIVISOR = 32
"""The forward+backward probe's share of the windows (one call of each variant, within the budget)."""


def measure_conv(
    conv: nn.Module | ConvInfo,
    windows: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    backward: bool = True,
    seconds: float = 2.0,
    names: Sequence[str] = (),
) -> Measurement:
    """Time stock conv vs GEMM for ``windows`` Qwen-layout windows ``(windows, C, *kernel)``.

    ``device``/``dtype`` default to the conv's weight's (for a module) or CPU/float32.
    ``backward`` adds a forward+backward measurement (gradients of the weight and bias).
    """
    if isinstance(conv, nn.Module):
        device = torch.device(device) if device is not None else conv.weight.device
        dtype = _torch_dtype(dtype) if dtype is not None else conv.weight.dtype
        kernel = tuple(conv.kernel_size)
    else:
        device = torch.device(device or "cpu")
        dtype = _torch_dtype(dtype or conv.dtype)
        kernel = tuple(conv.kernel)
    shape = (windows, conv.in_channels, *kernel)
    with torch.inference_mode(False), torch.no_grad():
        stock = timing_conv(conv, device, dtype)
        prime(stock, shape, device, dtype, train=False)
    if backward:
        stock.requires_grad_(True)
        with torch.inference_mode(False), torch.enable_grad():
            prime(stock, shape, device, dtype, train=True)
        stock.requires_grad_(False)
    started = time.perf_counter()
    with torch.inference_mode(False), torch.no_grad():
        x = torch.randn(*shape, device=device, dtype=dtype)  # one input for both passes, made inside the budget
        share = (seconds / 2 if backward else seconds) - (time.perf_counter() - started)
        forward = time_variants(conv_variants(stock, shape, device, dtype, train=False, x=x), device, share)
    notes = [f"fwd: {forward.describe()}"] if not forward.complete else []
    train: VariantTimes | None = None
    if backward and not forward.complete:
        notes.append("fwd+bwd not measured")
    elif backward:
        expected = {name: TRAIN_COST_FACTOR * value for name, value in forward.seconds.items()}
        left = seconds - (time.perf_counter() - started)
        if sum(expected.values()) <= left:
            stock.requires_grad_(True)
            with torch.inference_mode(False), torch.enable_grad():
                expected = _probed(stock, shape, device, dtype, expected, seconds - (time.perf_counter() - started))
                left = seconds - (time.perf_counter() - started)
                if sum(expected.values()) <= left:  # else not even one call of each fits: no ratio could come of it
                    variants = conv_variants(stock, shape, device, dtype, train=True, x=x)
                    left = seconds - (time.perf_counter() - started)
                    train = time_variants(variants, device, left, estimates=expected)
        if train is None or not train.seconds:
            notes.append(f"fwd+bwd not measured (one call each expected to take {1000 * sum(expected.values()):.3g} "
                         f"ms, {1000 * max(left, 0):.3g} ms left)")
            train = None
        elif not train.complete:
            notes.append(f"fwd+bwd: {train.describe()}")
    note = None
    if notes:
        note = f"budget {seconds:.3g} s: " + "; ".join(notes)
        logger.info("measurement of %s is partial: %s", ", ".join(names) or "conv", note)
    return Measurement(
        convs=list(names),
        kernel=kernel,
        in_channels=conv.in_channels,
        out_channels=conv.out_channels,
        windows=windows,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        repeats=forward.repeats,
        forward_ms={k: v * 1000 for k, v in forward.seconds.items()},
        train_ms=None if train is None else {k: v * 1000 for k, v in train.seconds.items()},
        train_repeats=None if train is None else train.repeats,
        extrapolated=forward.extrapolated or (train is not None and train.extrapolated),
        note=note,
    )


def _probed(stock: nn.Module, shape: Sequence[int], device: torch.device, dtype: torch.dtype,
            expected: dict[str, float], left: float) -> dict[str, float]:
    """``expected`` seconds per forward+backward call, raised to what one call on 1/:data:`PROBE_DIVISOR` of the
    windows takes, scaled up: a backward far slower than :data:`TRAIN_COST_FACTOR` forwards (bf16 Conv3d on CPU,
    cuDNN off on a GPU) shows there, before a full call could spend minutes of a seconds budget. Few windows
    (under ``2 * PROBE_DIVISOR``) are not probed: so small a call is its own probe."""
    probe = shape[0] // PROBE_DIVISOR
    if probe < 2:
        return expected
    times = time_variants(conv_variants(stock, (probe, *shape[1:]), device, dtype, train=True), device, left,
                          max_repeats=0, estimates={k: v / PROBE_DIVISOR for k, v in expected.items()})
    if times.skipped:  # the probe did not fit, so 32x it cannot: ``expected`` already says no
        return expected
    return {name: max(value, times.seconds[name] * shape[0] / probe) for name, value in expected.items()}


def default_windows(conv: ConvInfo, max_pixels: int | None = None) -> int:
    """Windows of one 1024x1024 image at this conv's spatial patch size (capped by ``max_pixels``)."""
    spatial = conv.kernel[-2:] if len(conv.kernel) >= 2 else conv.kernel
    pixels = DEFAULT_IMAGE_PIXELS if max_pixels is None else min(DEFAULT_IMAGE_PIXELS, max_pixels)
    return max(1, pixels // max(1, math.prod(spatial)))


def measure_model(
    info: ModelInfo,
    *,
    device: torch.device | str,
    dtype: torch.dtype | str,
    windows: int | None = None,
    seconds: float = 10.0,
    backward: bool = True,
) -> list[Measurement]:
    """One measurement per distinct patchable conv shape of the model, within ``seconds`` in all (a shape the
    budget did not reach is a Measurement with no figures and a note)."""
    groups: dict[tuple[Any, ...], list[ConvInfo]] = {}
    for conv in info.convs:
        if conv.patchable:
            groups.setdefault(conv.signature, []).append(conv)
    results = []
    started = time.perf_counter()
    for index, convs in enumerate(groups.values()):
        first = convs[0]
        n = windows or default_windows(first, info.processor_max_pixels)
        left = seconds - (time.perf_counter() - started)
        # Each shape gets an equal share of what is left (a fast shape leaves more to the next).
        results.append(
            measure_conv(first, n, device=device, dtype=dtype, backward=backward,
                         seconds=max(left, 0.0) / (len(groups) - index), names=[c.name for c in convs])
        )
        logger.debug("measured %s: %s", first.name, results[-1])
    return results


def _torch_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    from vlforge.diagnosis.facts import canonical_dtype

    return getattr(torch, canonical_dtype(dtype))  # type: ignore[arg-type]
