"""Patch-embedding convolutions computed as one GEMM.

A convolution whose stride equals its kernel size, with no padding, dilation 1 and one group, sees
every input element exactly once: it is a reshape of the input into non-overlapping windows followed
by one matrix multiply with the flattened weight (:mod:`vlforge.patches.gemm`). This module holds the
patched classes and which convolutions qualify; ``registry.py`` decides which modules get them.

The swap changes only the module's class (to a subclass with this forward). Parameters, buffers,
``state_dict`` keys, shapes and storage stay exactly as they were, so checkpoints are untouched and
``isinstance(module, nn.Conv3d)`` still holds.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from vlforge.patches.patch_embed import is_patchable
    >>> conv = nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4))
    >>> is_patchable(conv)
    True
"""

from __future__ import annotations

import torch
from torch import nn

from vlforge.patches.auto import auto_path
from vlforge.patches.gemm import gemm_conv_forward

PRECISIONS = ("native", "fp32", "auto")
"""Precisions a patched module can compute in: the input's own dtype, or fp32 then cast back, or
``auto``: the faster of the stock conv and the native GEMM, measured on first call (see :func:`auto_path`)."""

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


def patched_forward(conv: nn.Conv2d | nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
    """The forward of a patched module: the GEMM (:func:`vlforge.patches.gemm.gemm_conv_forward`), or with
    ``precision="auto"`` whichever of it and the stock conv :func:`~vlforge.patches.auto.auto_path` chose."""
    if getattr(conv, "_vlforge_precision", "native") == "auto" and auto_path(conv, x) == "conv":
        return conv._conv_forward(x, conv.weight, conv.bias)
    return gemm_conv_forward(conv, x)


class GemmConv2d(nn.Conv2d):
    """An ``nn.Conv2d`` whose forward is :func:`gemm_conv_forward` (set by ``vlforge.patch``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return patched_forward(self, input)


class GemmConv3d(nn.Conv3d):
    """An ``nn.Conv3d`` whose forward is :func:`gemm_conv_forward` (set by ``vlforge.patch``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return patched_forward(self, input)


_STATIC = {nn.Conv2d: GemmConv2d, nn.Conv3d: GemmConv3d}
_DYNAMIC: dict[type, type] = {}


def _gemm_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    return patched_forward(self, input)


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
