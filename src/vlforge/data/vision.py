"""Vision settings per family and pixel processing: images via transformers' PIL image processor,
video frames through the same resize/normalise steps plus our own temporal patchify (no torchvision).

Example:
    >>> from PIL import Image
    >>> s = VisionSettings.for_family("qwen3_vl", min_pixels=32 * 32, max_pixels=64 * 64)
    >>> out = process_images([Image.new("RGB", (64, 48))], s)
    >>> out["image_grid_thw"].tolist(), tuple(out["pixel_values"].shape)
    ([[1, 4, 4]], (16, 1536))
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from pydantic import ConfigDict, Field, model_validator
from transformers.image_utils import SizeDict

from vlforge.media.resize import frame_max_pixels, smart_resize
from vlforge.models.families import CLIP_MEAN, CLIP_STD, family, uses_image_processor
from vlforge.strict import StrictModel, field_error


class VisionSettings(StrictModel):
    """Image and video preprocessing knobs (LMMS Engine key names for the video ones)."""

    model_config = ConfigDict(frozen=True)

    patch_size: int = Field(14, gt=0, description="ViT patch side in pixels")
    temporal_patch_size: int = Field(2, gt=0, description="frames per temporal patch")
    merge_size: int = Field(2, gt=0, description="spatial merge (tokens = patches / merge_size**2)")
    min_pixels: int = Field(56 * 56, gt=0, description="image pixel floor after resize")
    max_pixels: int = Field(28 * 28 * 1280, gt=0, description="image pixel ceiling after resize")
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    video_min_pixels: int = Field(128 * 28 * 28, gt=0, description="per-frame pixel floor")
    video_max_pixels: int = Field(768 * 28 * 28, gt=0, description="per-frame pixel ceiling")
    video_total_pixels: int | None = Field(None, gt=0, description="optional budget over all frames")
    video_sampling_strategy: Literal["fps", "frame_num"] = "fps"
    fps: float = Field(2.0, gt=0, description="frames sampled per second (strategy fps)")
    frame_num: int | None = Field(None, gt=0, description="frames sampled per video (strategy frame_num)")
    video_min_frames: int = Field(4, gt=0)
    video_max_frames: int = Field(768, gt=0)
    tokens_per_second: float = Field(2.0, gt=0, description="Qwen2.5-VL temporal rope scale")
    image_processor: Literal["Qwen2VLImageProcessorPil", "Glm4vImageProcessorPil"] = Field(
        "Qwen2VLImageProcessorPil", description="transformers' PIL image processor class (the family's)")

    @model_validator(mode="after")
    def _check(self) -> VisionSettings:
        if self.min_pixels > self.max_pixels:
            raise field_error("min_pixels", f"{self.min_pixels} > max_pixels {self.max_pixels}")
        if self.video_min_pixels > self.video_max_pixels:
            raise field_error("video_min_pixels", f"{self.video_min_pixels} > video_max_pixels {self.video_max_pixels}")
        if self.video_sampling_strategy == "frame_num" and self.frame_num is None:
            raise field_error("frame_num", "video_sampling_strategy 'frame_num' needs frame_num")
        if self.video_max_frames < self.temporal_patch_size:
            raise field_error("video_max_frames", f"{self.video_max_frames} is less than the {self.temporal_patch_size} "
                                                  "frames of one temporal patch")
        return self

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this (patch_size * merge_size)."""
        return self.patch_size * self.merge_size

    @classmethod
    def for_family(cls, family: str, **overrides: Any) -> VisionSettings:
        """Defaults of a model family (``config.model_type``) with overrides."""
        return cls.with_overrides(_defaults(family), overrides)

    @classmethod
    def with_overrides(cls, base: dict[str, Any], overrides: dict[str, Any]) -> VisionSettings:
        """``base`` values updated by ``overrides``; a ceiling overridden below the base floor drops
        the floor to one merged token (so ``video_max_pixels: 50176`` works with any family)."""
        values = {**base, **overrides}
        for lo, hi in (("min_pixels", "max_pixels"), ("video_min_pixels", "video_max_pixels")):
            both_ints = isinstance(values.get(lo), int) and isinstance(values.get(hi), int)
            if hi in overrides and lo not in overrides and both_ints and values[lo] > values[hi]:
                factor = values.get("patch_size", 14) * values.get("merge_size", 2)
                values[lo] = min(factor * factor, values[hi])
        return cls(**values)

    @classmethod
    def from_image_processor(cls, image_processor: Any, family: str | None = None,
                             **overrides: Any) -> VisionSettings:
        """Patch/merge sizes, pixel bounds and mean/std of a loaded HF image processor; the video knobs
        come from the ``family`` preset (if given), then ``overrides`` apply."""
        size = dict(getattr(image_processor, "size", None) or {})
        read: dict[str, Any] = {
            "patch_size": image_processor.patch_size,
            "temporal_patch_size": image_processor.temporal_patch_size,
            "merge_size": image_processor.merge_size,
            "min_pixels": size.get("shortest_edge", getattr(image_processor, "min_pixels", None)),
            "max_pixels": size.get("longest_edge", getattr(image_processor, "max_pixels", None)),
            "image_mean": tuple(image_processor.image_mean),
            "image_std": tuple(image_processor.image_std),
        }
        owner = uses_image_processor(type(image_processor).__name__)
        if owner is not None:
            read["image_processor"] = owner.image_processor_class
        base = _defaults(family) if family is not None else {}
        base.update({k: v for k, v in read.items() if v is not None})
        return cls.with_overrides(base, overrides)


def _defaults(name: str) -> dict[str, Any]:
    """The family's data-pipeline defaults (its record's ``vision_defaults`` and PIL image processor)."""
    record = family(name)
    return {**record.vision_defaults, "image_processor": record.image_processor_class}


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
