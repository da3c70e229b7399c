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

from vlforge.patches.auto import auto_path

PRECISIONS = ("native", "fp32", "auto")
"""Precisions a patched module can compute in: the input's own dtype, or fp32 then cast back, or
``auto``: the faster of the stock conv and the native GEMM, measured on first call (see :func:`auto_path`)."""

_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _has_stock_forward(cls: type) -> bool:
    """True when no class between ``cls`` and ``nn.Conv2d``/``nn.Conv3d`` redefines the forward.

    Subclasses that pad, standardise weights or otherwise change the forward (e.g. BiT's
    ``WeightStandardizedConv2d``) are not a plain conv, so replacing their forward would be wrong.
    Our own patched classes count as their stock class; classes stacked on top by wrappers such as
    FSDP2's ``fully_shard`` (which add hooks, not a forward) are looked through.
    """
    for klass in cls.__mro__:
        if klass in (nn.Conv2d, nn.Conv3d):
            return True
        if "_vlforge_stock_class" in klass.__dict__:
            return _has_stock_forward(klass.__dict__["_vlforge_stock_class"])
        if "forward" in klass.__dict__ or "_conv_forward" in klass.__dict__:
            return False
    return False


def is_patchable(module: nn.Module) -> bool:
    """True when ``module`` is a Conv2d/Conv3d that equals reshape + GEMM.

    The rule: stride == kernel_size, zero padding, dilation 1, groups 1, padding mode ``zeros``, and
    the stock forward (subclasses that redefine ``forward`` or ``_conv_forward`` are left alone).
    """
    if not isinstance(module, (nn.Conv2d, nn.Conv3d)):
        return False
    kernel = tuple(module.kernel_size)
    padding = module.padding
    zero_padding = padding == "valid" if isinstance(padding, str) else all(p == 0 for p in padding)
    return (
        tuple(module.stride) == kernel
        and zero_padding
        and all(d == 1 for d in module.dilation)
        and module.groups == 1
        and module.padding_mode == "zeros"
        and not module.transposed
        and _has_stock_forward(type(module))
    )


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
    if precision == "auto" and auto_path(conv, x) == "conv":
        return conv._conv_forward(x, conv.weight, conv.bias)
    weight = conv.weight
    kernel = tuple(conv.kernel_size)
    nd = len(kernel)
    if (
        not weight.is_contiguous()
        or _is_channels_last(x)
        or x.dim() not in (nd + 1, nd + 2)
        or x.shape[-nd - 1] != conv.in_channels
    ):
        # Includes wrong channel counts: the stock conv raises its own, familiar error.
        return conv._conv_forward(x, weight, conv.bias)
    out_channels = weight.shape[0]
    in_features = weight[0].numel()
    weight_2d = weight.reshape(out_channels, in_features)

    if x.dim() == nd + 2 and tuple(x.shape[2:]) == kernel and x.is_contiguous():
        rows = x.reshape(x.shape[0], in_features)
        out = _compute(rows, weight_2d, conv.bias, precision)
        return out.view(x.shape[0], out_channels, *([1] * nd))

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
