"""A stride == kernel convolution computed as one GEMM: the math behind the patched modules.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from vlforge.patches.gemm import gemm_conv_forward
    >>> conv = nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4))
    >>> x = torch.randn(5, 3, 2, 4, 4)
    >>> torch.allclose(gemm_conv_forward(conv, x), conv(x), atol=1e-5)
    True
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}
_ONES = {2: (1, 1), 3: (1, 1, 1)}


def _gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` for rows ``(N, K)``, or ``weight @ x + bias`` for windows ``(B, K, L)``.

    The bias is fused into the GEMM (one rounding, as the conv does) in both layouts.
    """
    if x.dim() == 2:
        return F.linear(x, weight, bias)
    if bias is None:
        return torch.matmul(weight, x)
    return torch.baddbmm(bias.view(1, -1, 1), weight.expand(x.shape[0], *weight.shape), x)


def _compute(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, precision: str) -> torch.Tensor:
    """Run :func:`_gemm` in ``precision``.

    ``"fp32"`` computes in at least fp32 (fp64 stays fp64) with autocast switched off, then casts to
    the dtype the stock conv would return: the autocast dtype inside an autocast region, otherwise
    the input's dtype.
    """
    if precision != "fp32":
        return _gemm(x, weight, bias)
    device = x.device.type
    out_dtype = x.dtype
    if torch.is_autocast_enabled(device) and x.dtype != torch.float64:
        out_dtype = torch.get_autocast_dtype(device)
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=device, enabled=False):
        out = _gemm(x.to(compute), weight.to(compute), None if bias is None else bias.to(compute))
    return out.to(out_dtype)


def _is_channels_last(x: torch.Tensor) -> bool:
    fmt = _CHANNELS_LAST.get(x.dim())
    return fmt is not None and not x.is_contiguous() and x.is_contiguous(memory_format=fmt)


def gemm_conv_forward(conv: nn.Conv2d | nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
    """The conv's output computed as a GEMM; falls back to the stock conv where a GEMM would not help.

    Handles three input forms:
    - one window per row, ``(N, C, *kernel)`` (the Qwen-VL layout): reshape + ``F.linear``;
    - a general batched ``(B, C, *spatial)`` or unbatched ``(C, *spatial)`` input: crop the remainder
      as the conv does, unfold windows by reshape/permute, one GEMM, fold back;
    - channels-last inputs and weights (where cuDNN has fast kernels and a reshape would copy) and
      anything else unexpected (wrong rank or channel count, input smaller than the kernel) go to
      the stock convolution, which gives its own result or error. Empty batches work.
    """
    precision = getattr(conv, "_vlforge_precision", "native")
    weight = conv.weight
    kernel = conv.kernel_size
    nd = len(kernel)
    if x.dim() == nd + 2 and x.shape[2:] == kernel and x.shape[1] == conv.in_channels and x.is_contiguous() \
            and weight.is_contiguous():
        # The Qwen-VL layout, one window per row: two views and one GEMM, nothing else dispatched (no select to count
        # the window's elements, no reshape that only forwards to view; tests/patches count the ops)
        window = math.prod(kernel) * x.shape[1]  # explicit: an empty batch has no -1 to infer
        rows = x.view(x.shape[0], window)
        out = _compute(rows, weight.view(weight.shape[0], window), conv.bias, precision)
        return out.view(x.shape[0], weight.shape[0], *_ONES[nd])
    kernel = tuple(kernel)
    if (
        not weight.is_contiguous()
        or _is_channels_last(x)
        or x.dim() not in (nd + 1, nd + 2)
        or x.shape[-nd - 1] != conv.in_channels
    ):
        # Includes wrong channel counts: the stock conv raises its own, familiar error.
        return conv._conv_forward(x, weight, conv.bias)
    out_channels = weight.shape[0]
    in_features = math.prod(weight.shape[1:])
    weight_2d = weight.view(out_channels, in_features)

    unbatched = x.dim() == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    batch, channels = x.shape[:2]
    spatial = x.shape[2:]
    counts = [size // k for size, k in zip(spatial, kernel, strict=True)]
    if any(c == 0 for c in counts):
        # The conv raises its own error for inputs smaller than the kernel; keep that message.
        return conv._conv_forward(x.squeeze(0) if unbatched else x, weight, conv.bias)
    crop = tuple(slice(0, c * k) for c, k in zip(counts, kernel, strict=True))
    x = x[(slice(None), slice(None), *crop)]
    # (B, C, n1, k1, n2, k2, ...) -> (B, C, k1, k2, ..., n1, n2, ...) -> (B, C*k1*k2..., L)
    split = [batch, channels]
    for c, k in zip(counts, kernel, strict=True):
        split += [c, k]
    x = x.reshape(split)
    kernel_dims = [3 + 2 * i for i in range(nd)]
    count_dims = [2 + 2 * i for i in range(nd)]
    patches = x.permute(0, 1, *kernel_dims, *count_dims).reshape(batch, in_features, math.prod(counts))
    out = _compute(patches, weight_2d, conv.bias, precision)
    out = out.view(batch, out_channels, *counts)
    return out.squeeze(0) if unbatched else out
