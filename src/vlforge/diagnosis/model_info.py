"""What the doctor reads from a model: its convolutions, its config, and hooks for other audits.

Example:
    >>> import torch
    >>> from vlforge.diagnosis.model_info import inspect_model
    >>> info = inspect_model(torch.nn.Sequential(torch.nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4))))
    >>> [(c.name, c.kernel, c.patchable, c.patched) for c in info.convs]
    [('0', (2, 4, 4), True, False)]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from vlforge.patches import is_patchable, is_patched


@dataclass(frozen=True)
class ConvInfo:
    """One convolution of the model."""

    name: str
    conv: str
    """Stock class name (``Conv3d``, ``Conv2d``, or a subclass's name)."""
    weight_ndim: int
    kernel: tuple[int, ...]
    in_channels: int
    out_channels: int
    bias: bool
    patchable: bool
    """stride == kernel, no padding: vlforge can run it as a GEMM."""
    patched: bool
    precision: str | None
    """Precision of the vlforge patch (``native``/``fp32``/``auto``), None when unpatched."""
    memory_format: str
    """``contiguous`` or ``channels_last_3d``/``channels_last`` (read from the weight)."""
    dtype: str

    @property
    def signature(self) -> tuple[Any, ...]:
        """Shape identity used to measure each distinct conv once."""
        return (self.conv, self.kernel, self.in_channels, self.out_channels, self.bias)


@dataclass
class ModelInfo:
    """The model-side input of the rules."""

    model_type: str | None = None
    attn_implementation: str | None = None
    dtype: str | None = None
    """dtype of the model's floating-point parameters (the first one found)."""
    convs: list[ConvInfo] = field(default_factory=list)
    processor_max_pixels: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Results of other audits keyed by name, for rules that need them. ``extra["tokens"]`` holds the
    tokens audit (a :class:`vlforge.diagnosis.tokens.TokensAudit`, attached by :func:`vlforge.diagnosis.report`),
    read by the ``untrained-template-token*`` rules."""

    def to_dict(self) -> dict[str, Any]:
        tokens = self.extra.get("tokens")
        return {
            "model_type": self.model_type,
            "attn_implementation": self.attn_implementation,
            "dtype": self.dtype,
            "convs": [asdict(c) for c in self.convs],
            "tokens": tokens.to_dict() if hasattr(tokens, "to_dict") else None,
        }


def _memory_format(weight: torch.Tensor) -> str:
    if weight.dim() == 5 and not weight.is_contiguous() and weight.is_contiguous(
        memory_format=torch.channels_last_3d
    ):
        return "channels_last_3d"
    if weight.dim() == 4 and not weight.is_contiguous() and weight.is_contiguous(
        memory_format=torch.channels_last
    ):
        return "channels_last"
    return "contiguous"


def _stock_name(module: nn.Module) -> str:
    stock = getattr(type(module), "_vlforge_stock_class", None)
    return (stock or type(module)).__name__


def _config_attn(config: Any) -> str | None:
    for holder in (config, getattr(config, "vision_config", None)):
        if holder is None:
            continue
        value = getattr(holder, "_attn_implementation", None)
        if isinstance(value, str):
            return value
    return None


def _processor_max_pixels(processor: Any) -> int | None:
    image_processor = getattr(processor, "image_processor", processor)
    if image_processor is None:
        return None
    size = getattr(image_processor, "size", None)
    for key in ("max_pixels", "longest_edge"):  # Qwen processors keep max pixels in ``longest_edge``
        value = size.get(key) if isinstance(size, dict) else getattr(size, key, None)
        if isinstance(value, int):
            return value
    value = getattr(image_processor, "max_pixels", None)
    return value if isinstance(value, int) else None


def inspect_model(model: nn.Module, processor: Any = None) -> ModelInfo:
    """Walk ``model``'s convolutions and config (no forward pass, no copies)."""
    config = getattr(model, "config", None)
    info = ModelInfo(
        model_type=getattr(config, "model_type", None),
        attn_implementation=_config_attn(config),
        processor_max_pixels=_processor_max_pixels(processor) if processor is not None else None,
    )
    for param in model.parameters():
        if param.is_floating_point():
            info.dtype = str(param.dtype).removeprefix("torch.")
            break
    for name, module in model.named_modules():
        if not isinstance(module, nn.modules.conv._ConvNd) or module.transposed:
            continue
        weight = module.weight
        patched = is_patched(module)
        info.convs.append(
            ConvInfo(
                name=name,
                conv=_stock_name(module),
                weight_ndim=weight.dim(),
                kernel=tuple(module.kernel_size),
                in_channels=module.in_channels,
                out_channels=module.out_channels,
                bias=module.bias is not None,
                patchable=is_patchable(module),
                patched=patched,
                precision=getattr(module, "_vlforge_precision", None) if patched else None,
                memory_format=_memory_format(weight),
                dtype=str(weight.dtype).removeprefix("torch."),
            )
        )
    return info
