"""Images and videos in one forward for the families that write both with one placeholder token (GLM-4.1V, GLM-4.5V).

GLM-4V's processor expands a video into frames of the image placeholder ``<|image|>`` between
``<|begin_of_video|>`` and ``<|end_of_video|>``. transformers' ``get_placeholder_mask`` of those models (5.24)
therefore counts every placeholder as both an image and a video token, and a batch or packed row holding images
and a video stops with "Image features and image tokens do not match". The processor already tells them apart by
the video markers (its ``mm_token_type_ids``, which the mrope positions read); :func:`separate_video_placeholders`
gives the inner model a ``get_placeholder_mask`` that applies the same rule: a placeholder inside a
``<|begin_of_video|>`` ... ``<|end_of_video|>`` span is a video token, any other an image token, with the stock
count checks. A batch of images only gets the
stock image mask and one of videos only the stock video mask (the one each forward uses); only batches holding
both change (from an error to the right placement).

The change is an attribute on the one model instance (its class, other models and the checkpoint are untouched),
logged, and undone by :func:`restore`. Asking for it on a model without such a method, or whose config lacks the
video marker ids, raises.

Example (CPU, seconds):
    >>> from vlforge.models import load                                        # doctest: +SKIP
    >>> separate_video_placeholders(load("tiny:glm4v").model)                  # doctest: +SKIP
    'Glm4vModel'
"""

from __future__ import annotations

import logging
import types
from typing import Any

import torch

logger = logging.getLogger(__name__)

_STOCK = "_vlforge_stock_placeholder_mask"


def video_spans(input_ids: torch.Tensor, start_id: int, end_id: int) -> torch.Tensor:
    """True from a video start marker up to (not including) the next end marker, per row: a position is in a
    span when the last marker at or before it is a start. Unbalanced markers (a literal marker in one packed
    sample's text) therefore reach no further than the next marker, and never shift a later sample's video."""
    marker = (input_ids == start_id).long() - (input_ids == end_id).long()
    positions = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)
    last = torch.where(marker != 0, positions, -1).cummax(-1).values
    return (last >= 0) & (marker.gather(-1, last.clamp(min=0)) > 0)


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose class defines ``get_placeholder_mask`` (the ``*Model`` inside, through any wrapper)."""
    inner = next((m for m in model.modules() if callable(getattr(type(m), "get_placeholder_mask", None))), None)
    if inner is None:
        raise ValueError(f"{type(model).__name__} has no get_placeholder_mask to separate image and video tokens")
    return inner


def separate_video_placeholders(model: torch.nn.Module) -> str:
    """Give ``model``'s inner ``*Model`` the span-aware placeholder mask (idempotent; logged); returns its class
    name. Raises when the model has no such method or its config names no video markers."""
    inner = _inner(model)
    config = inner.config
    ids = [getattr(config, key, None) for key in ("image_token_id", "video_start_token_id", "video_end_token_id")]
    if any(value is None for value in ids):
        raise ValueError(f"{type(config).__name__} lacks image_token_id / video_start_token_id / video_end_token_id")
    image_id, start_id, end_id = (int(value) for value in ids)
    if _STOCK in inner.__dict__:
        return type(inner).__name__
    stock = inner.get_placeholder_mask

    def get_placeholder_mask(self: Any, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor,
                             image_features: torch.Tensor | None = None,
                             video_features: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if input_ids is None:  # embeddings given directly: the stock comparison of embeddings
            return stock(input_ids, inputs_embeds, image_features=image_features, video_features=video_features)
        placeholder = input_ids == image_id
        in_video = video_spans(input_ids, start_id, end_id)
        masks = []
        for kind, mask, features in (("Image", placeholder & ~in_video, image_features),
                                     ("Video", placeholder & in_video, video_features)):
            if features is not None:  # the stock check (a host read, as the stock method's)
                count = int(mask.sum())
                if count * inputs_embeds.shape[-1] != features.numel():
                    raise ValueError(f"{kind} features and {kind.lower()} tokens do not match, tokens: {count}, "
                                     f"features: {features.shape[0]}")
            masks.append(mask.unsqueeze(-1).to(inputs_embeds.device))
        return masks[0], masks[1]

    setattr(inner, _STOCK, stock)
    inner.get_placeholder_mask = types.MethodType(get_placeholder_mask, inner)
    logger.info("media: %s tells video placeholders (between the video markers) from image ones, so one batch may "
                "hold both", type(inner).__name__)
    return type(inner).__name__


def restore(model: torch.nn.Module) -> bool:
    """Undo :func:`separate_video_placeholders` on ``model``; False when it was not applied."""
    inner = _inner(model)
    if _STOCK not in inner.__dict__:
        return False
    del inner.get_placeholder_mask
    delattr(inner, _STOCK)
    return True
