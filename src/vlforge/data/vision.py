"""Pixel processing under :class:`~vlforge.data.vision_settings.VisionSettings`: images via transformers' PIL image
processor, video frames through the same resize/normalise steps plus our own temporal patchify (no torchvision).

Example:
    >>> from PIL import Image
    >>> s = VisionSettings.for_family("qwen3_vl", min_pixels=32 * 32, max_pixels=64 * 64)
    >>> out = process_images([Image.new("RGB", (64, 48))], s)
    >>> out["image_grid_thw"].tolist(), tuple(out["pixel_values"].shape)
    ([[1, 4, 4]], (16, 1536))
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers.image_utils import SizeDict

from vlforge.data.vision_settings import VisionSettings
from vlforge.media.resize import frame_max_pixels, smart_resize


@functools.lru_cache(maxsize=16)
def image_processor_for(settings: VisionSettings) -> Any:
    """transformers' PIL-backed image processor (Qwen2-VL's or GLM-4V's) configured from ``settings`` (cached)."""
    common = dict(patch_size=settings.patch_size, temporal_patch_size=settings.temporal_patch_size,
                  merge_size=settings.merge_size, image_mean=list(settings.image_mean),
                  image_std=list(settings.image_std),
                  size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels})
    import transformers

    return getattr(transformers, settings.image_processor)(**common)


def process_images(images: list[Image.Image], settings: VisionSettings) -> dict[str, torch.Tensor]:
    """``pixel_values`` (patches, C*T*p*p) and ``image_grid_thw`` (n, 3) via the HF PIL image processor."""
    out = image_processor_for(settings)(images=images, return_tensors="pt")
    return {"pixel_values": out["pixel_values"].float(), "image_grid_thw": out["image_grid_thw"].long()}


def video_frame_size(height: int, width: int, num_frames: int, settings: VisionSettings) -> tuple[int, int]:
    """Resized (height, width) of every frame of a video with ``num_frames`` sampled frames.

    Per frame (LMMS Engine / qwen-vl-utils): :func:`vlforge.media.resize.smart_resize` rule ``image``
    (transformers' Qwen2-VL rounding) with the area within ``[video_min_pixels, per-frame max]``, the max
    being ``video_max_pixels`` lowered by :func:`~vlforge.media.resize.frame_max_pixels` when
    ``video_total_pixels`` is set.
    """
    max_pixels = frame_max_pixels(settings.video_max_pixels, settings.video_min_pixels, settings.video_total_pixels,
                                  num_frames, settings.temporal_patch_size)
    return smart_resize(height, width, factor=settings.factor, min_pixels=settings.video_min_pixels,
                        max_pixels=max_pixels)


def patchify_video(frames: np.ndarray, settings: VisionSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(T, C, H, W) float frames -> (grid_t*grid_h*grid_w, C*tp*p*p) in the order Qwen's ViT expects.

    T is padded to a multiple of ``temporal_patch_size`` by repeating the last frame.
    """
    tp, p, m = settings.temporal_patch_size, settings.patch_size, settings.merge_size
    if pad := -frames.shape[0] % tp:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
    t, c, h, w = frames.shape
    gt, gh, gw = t // tp, h // p, w // p
    x = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * p * p)), (gt, gh, gw)


def process_video_frames(frames: list[np.ndarray], settings: VisionSettings) -> dict[str, torch.Tensor]:
    """HWC uint8 RGB frames (all one size) -> ``pixel_values_videos`` and ``video_grid_thw`` (1, 3).

    Each frame goes through the image processor's own resize (PIL bicubic), rescale and normalise.
    """
    ip = image_processor_for(settings)
    height, width = frames[0].shape[:2]
    rh, rw = video_frame_size(height, width, len(frames), settings)
    size = SizeDict(height=rh, width=rw)
    out = []
    for frame in frames:
        chw = np.ascontiguousarray(frame.transpose(2, 0, 1))
        if (height, width) != (rh, rw):
            chw = super(type(ip), ip).resize(chw, size=size, resample=ip.resample)  # the PIL backend's plain resize
        chw = ip.normalize(ip.rescale(chw, ip.rescale_factor), list(settings.image_mean), list(settings.image_std))
        out.append(chw.astype(np.float32))
    patches, grid = patchify_video(np.stack(out), settings)
    return {"pixel_values_videos": torch.from_numpy(patches), "video_grid_thw": torch.tensor([grid])}
