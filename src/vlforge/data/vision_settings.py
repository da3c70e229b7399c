"""The image and video preprocessing settings of a run (:class:`VisionSettings`) and of one media item with its own
options (:func:`item_settings`). No torch: ``vlforge validate`` checks a record's options with them.

Example:
    >>> VisionSettings.for_family("qwen3_vl").patch_size
    16
    >>> item_settings(VisionSettings.for_family("qwen2_vl"), {"video_max_frames": 1}, "video", source="d.jsonl",
    ...               location="line 3")
    Traceback (most recent call last):
    vlforge.data.errors.SampleError: d.jsonl:line 3: schema: video option max_frames / video_max_frames: 1 is less than the 2 frames of one temporal patch
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from vlforge.data.errors import SampleError
from vlforge.data.schema import FRAME_LIST_KEYS, video_option_name
from vlforge.models.families import CLIP_MEAN, CLIP_STD, family, uses_image_processor
from vlforge.strict import StrictModel, field_error, first_problem


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


def item_settings(settings: VisionSettings, options: dict[str, Any], kind: str, *, source: str = "",
                  location: str = "") -> VisionSettings:
    """``settings`` with one media item's own options (an image's ``min_pixels`` / ``max_pixels``, a video's ``fps``
    / ``frame_num`` / ``video_*``, as :func:`vlforge.data.schema.parse_conversation` reads them); a bad option is a
    ``schema`` :class:`~vlforge.data.errors.SampleError` of the record at ``source`` / ``location``, naming the option
    as the record may write it."""
    overrides = {key: value for key, value in options.items() if key not in FRAME_LIST_KEYS}  # read when resolved
    if not overrides:
        return settings
    if "frame_num" in overrides:
        overrides["video_sampling_strategy"] = "frame_num"
    elif "fps" in overrides:
        overrides["video_sampling_strategy"] = "fps"
    try:
        return VisionSettings.with_overrides(settings.model_dump(), overrides)
    except ValidationError as exc:
        loc, message, _ = first_problem(exc)
        option = ".".join(map(str, loc))
        raise SampleError("schema", source, location, f"{kind} option "
                          f"{video_option_name(option) if kind == 'video' else option}: {message}") from None
