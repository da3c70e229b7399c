"""``precision="auto"``: per (device, dtype, conv shape, input-size bucket) choice between stock conv and GEMM.

The input's shape is bucketed (every dimension rounded up to a power of two), so a model fed images
of many sizes measures once per bucket, not once per size: the patch count of a Qwen-VL input
changes with every image. The decision is made once per key, on the first call with that key, by timing both paths on the
actual device (``vlforge.patches.timing.choose_path``: CUDA events on GPU, ``perf_counter`` on CPU,
fresh tensors of the input's shape, so it also works under ``no_grad``/``inference_mode`` and never
touches the model's gradients). The choice is cached process-wide. It is never measured inside
graph capture: under ``torch.compile`` tracing or CUDA graph capture the last choice for this conv
(same device, dtype, shape of weights, gradient mode) is reused, else the GEMM.

Example:
    >>> import torch, vlforge
    >>> model = torch.nn.Sequential(torch.nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4)))
    >>> _ = vlforge.patch(model, precision="auto")
    >>> model(torch.randn(4, 3, 2, 4, 4)).shape   # first call measures, later calls reuse
    torch.Size([4, 8, 1, 1, 1])
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from vlforge.patches.timing import choose_path

logger = logging.getLogger(__name__)

_AUTO_CHOICES: dict[tuple, str] = {}
"""Decisions, process-wide: (device, index, dtype, kernel, in, out, bias, grad, input shape) -> path."""
_AUTO_LAST: dict[tuple, str] = {}
"""The latest decision per key without the input shape: what graph capture reuses."""


def shape_bucket(shape: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
    """Every dimension rounded up to a power of two: ``(6080, 3, 2, 16, 16) -> (8192, 4, 2, 16, 16)``."""
    return tuple(1 << max(int(size) - 1, 0).bit_length() for size in shape)


def auto_path(conv: nn.Module, x: torch.Tensor) -> str:
    """``"gemm"`` or ``"conv"`` for a ``precision="auto"`` module on this input (see the module doc)."""
    train = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in conv.parameters()))
    device = x.device.type
    # Inside an autocast region both paths compute in the autocast dtype: decide (and measure) for that.
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    sig = (device, x.device.index, dtype, tuple(conv.kernel_size), conv.in_channels,
           conv.out_channels, conv.bias is not None, train)
    if torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
        return _AUTO_LAST.get(sig, "gemm")
    key = (*sig, shape_bucket(x.shape))
    choice = _AUTO_CHOICES.get(key)
    if choice is None:
        try:
            choice = choose_path(conv, x, train=train, dtype=dtype)
        except RuntimeError as error:  # e.g. the stock conv has no kernel for this dtype on this device
            logger.warning("precision=auto: measuring failed (%s); using the GEMM", str(error).splitlines()[0])
            choice = "gemm"
        _AUTO_CHOICES[key] = choice
        _AUTO_LAST[sig] = choice
    return choice


def clear_auto_cache() -> None:
    """Forget every ``precision="auto"`` decision (the next call per key measures again)."""
    _AUTO_CHOICES.clear()
    _AUTO_LAST.clear()
