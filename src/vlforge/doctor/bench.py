"""The doctor's measurement: every distinct patch-conv shape of a model, stock conv vs GEMM, at a
realistic number of windows, forward and forward+backward. The timing itself (shared with
``precision="auto"``) is :mod:`vlforge.patches.timing`.

Example (CPU, well under a second):
    >>> import torch
    >>> from vlforge.doctor.bench import measure_conv
    >>> conv = torch.nn.Conv3d(3, 16, (2, 4, 4), stride=(2, 4, 4))
    >>> m = measure_conv(conv, windows=64, seconds=0.2)
    >>> sorted(m.forward_ms), m.repeats >= 1
    (['conv', 'gemm'], True)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from vlforge.doctor.model_info import ConvInfo, ModelInfo
from vlforge.doctor.rules import Measurement
from vlforge.patches.timing import conv_variants, time_variants, timing_conv

logger = logging.getLogger(__name__)

DEFAULT_IMAGE_PIXELS = 1024 * 1024
"""Default workload: one 1024x1024 image (capped by the processor's max_pixels when smaller)."""


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
    budget = seconds / 2 if backward else seconds
    with torch.inference_mode(False), torch.no_grad():
        stock = timing_conv(conv, device, dtype)
        forward, repeats = time_variants(conv_variants(stock, shape, device, dtype, train=False), device, budget)
    train = None
    if backward:
        stock.requires_grad_(True)
        with torch.inference_mode(False), torch.enable_grad():
            train, _ = time_variants(conv_variants(stock, shape, device, dtype, train=True), device, budget)
    return Measurement(
        convs=list(names),
        kernel=kernel,
        in_channels=conv.in_channels,
        out_channels=conv.out_channels,
        windows=windows,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        repeats=repeats,
        forward_ms={k: v * 1000 for k, v in forward.items()},
        train_ms=None if train is None else {k: v * 1000 for k, v in train.items()},
    )


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
    """One measurement per distinct patchable conv shape of the model, splitting ``seconds`` between them."""
    groups: dict[tuple[Any, ...], list[ConvInfo]] = {}
    for conv in info.convs:
        if conv.patchable:
            groups.setdefault(conv.signature, []).append(conv)
    results = []
    for convs in groups.values():
        first = convs[0]
        n = windows or default_windows(first, info.processor_max_pixels)
        results.append(
            measure_conv(first, n, device=device, dtype=dtype, backward=backward,
                         seconds=seconds / len(groups), names=[c.name for c in convs])
        )
        logger.debug("measured %s: %s", first.name, results[-1])
    return results


def _torch_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    from vlforge.doctor.facts import canonical_dtype

    return getattr(torch, canonical_dtype(dtype))  # type: ignore[arg-type]
