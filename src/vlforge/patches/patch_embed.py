"""Patch-embedding convolutions computed as one GEMM.

A convolution whose stride equals its kernel size, with no padding, dilation 1 and one group, sees
every input element exactly once: it is a reshape of the input into non-overlapping windows followed
by one matrix multiply with the flattened weight. This module holds that forward; ``registry.py``
decides which modules get it.

The swap changes only the module's class (to a subclass with this forward). Parameters, buffers,
``state_dict`` keys, shapes and storage stay exactly as they were, so checkpoints are untouched and
``isinstance(module, nn.Conv3d)`` still holds.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from vlforge.patches.patch_embed import gemm_conv_forward, is_patchable
    >>> conv = nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4))
    >>> is_patchable(conv)
    True
    >>> x = torch.randn(5, 3, 2, 4, 4)
    >>> torch.allclose(gemm_conv_forward(conv, x), conv(x), atol=1e-5)
    True
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

PRECISIONS = ("native", "fp32")
"""Precisions a patched module can compute in: the input's own dtype, or fp32 then cast back."""

_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def is_patchable(module: nn.Module) -> bool:
    """True when ``module`` is a Conv2d/Conv3d that equals reshape + GEMM.

    The rule: stride == kernel_size, zero padding, dilation 1, groups 1, padding mode ``zeros``.
    """
    if not isinstance(module, (nn.Conv2d, nn.Conv3d)):
        return False
    kernel = tuple(module.kernel_size)
    padding = module.padding
    if isinstance(padding, str):
        zero_padding = padding == "valid"
    else:
        zero_padding = all(p == 0 for p in padding)
    return (
        tuple(module.stride) == kernel
        and zero_padding
        and all(d == 1 for d in module.dilation)
        and module.groups == 1
        and module.padding_mode == "zeros"
        and not module.transposed
    )


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, precision: str) -> torch.Tensor:
    if precision == "fp32" and x.dtype != torch.float32:
        out = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
        return out.to(x.dtype)
    return F.linear(x, weight, bias)


def _windows_matmul(
    patches: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, precision: str
) -> torch.Tensor:
    """``weight (O, K) @ patches (B, K, L) + bias`` -> ``(B, O, L)``, optionally computed in fp32."""
    dtype = patches.dtype
    if precision == "fp32" and dtype != torch.float32:
        patches, weight = patches.float(), weight.float()
        bias = None if bias is None else bias.float()
    out = torch.matmul(weight, patches)
    if bias is not None:
        out = out + bias.view(1, -1, 1)
    return out.to(dtype)


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
      anything else unexpected go to the stock convolution.
    """
    precision = getattr(conv, "_vlforge_precision", "native")
    weight = conv.weight
    kernel = tuple(conv.kernel_size)
    nd = len(kernel)
    if not weight.is_contiguous() or _is_channels_last(x) or x.dim() not in (nd + 1, nd + 2):
        return conv._conv_forward(x, weight, conv.bias)
    out_channels = weight.shape[0]
    weight_2d = weight.reshape(out_channels, -1)

    if x.dim() == nd + 2 and tuple(x.shape[2:]) == kernel and x.is_contiguous():
        rows = x.reshape(x.shape[0], -1)
        out = _linear(rows, weight_2d, conv.bias, precision)
        return out.view(x.shape[0], out_channels, *([1] * nd))

    unbatched = x.dim() == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    batch, channels = x.shape[:2]
    spatial = x.shape[2:]
    counts = [size // k for size, k in zip(spatial, kernel)]
    if any(c == 0 for c in counts):
        # The conv raises its own error for inputs smaller than the kernel; keep that message.
        return conv._conv_forward(x.squeeze(0) if unbatched else x, weight, conv.bias)
    crop = tuple(slice(0, c * k) for c, k in zip(counts, kernel))
    x = x[(slice(None), slice(None), *crop)]
    # (B, C, n1, k1, n2, k2, ...) -> (B, C, k1, k2, ..., n1, n2, ...) -> (B, C*k1*k2..., L)
    split = [batch, channels]
    for c, k in zip(counts, kernel):
        split += [c, k]
    x = x.reshape(split)
    kernel_dims = [3 + 2 * i for i in range(nd)]
    count_dims = [2 + 2 * i for i in range(nd)]
    patches = x.permute(0, 1, *kernel_dims, *count_dims).reshape(batch, -1, math.prod(counts))
    out = _windows_matmul(patches, weight_2d, conv.bias, precision)
    out = out.view(batch, out_channels, *counts)
    return out.squeeze(0) if unbatched else out


class GemmConv2d(nn.Conv2d):
    """An ``nn.Conv2d`` whose forward is :func:`gemm_conv_forward` (set by ``vlforge.patch``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return gemm_conv_forward(self, input)


class GemmConv3d(nn.Conv3d):
    """An ``nn.Conv3d`` whose forward is :func:`gemm_conv_forward` (set by ``vlforge.patch``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return gemm_conv_forward(self, input)


_STATIC = {nn.Conv2d: GemmConv2d, nn.Conv3d: GemmConv3d}
_DYNAMIC: dict[type, type] = {}


def _gemm_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    return gemm_conv_forward(self, input)


def gemm_class_for(cls: type) -> type:
    """The patched subclass for a conv class (``nn.Conv3d`` -> ``GemmConv3d``; subclasses get a cached one)."""
    if cls in _STATIC:
        return _STATIC[cls]
    if cls not in _DYNAMIC:
        _DYNAMIC[cls] = type(
            f"Gemm{cls.__name__}",
            (cls,),
            {"forward": _gemm_forward, "__module__": __name__, "_vlforge_stock_class": cls},
        )
    return _DYNAMIC[cls]


GemmConv2d._vlforge_stock_class = nn.Conv2d
GemmConv3d._vlforge_stock_class = nn.Conv3d


def is_patched(module: nn.Module) -> bool:
    """True when ``module`` currently runs the GEMM forward (also after FSDP wrapped its class)."""
    return any("_vlforge_stock_class" in klass.__dict__ for klass in type(module).__mro__)
