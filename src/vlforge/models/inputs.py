"""Model inputs for profiling and verification: synthetic frames, image files or a video file.

- ``synthetic="8x720x1280"``: eight random RGB frames (fixed seed), resized with the image processor's
  smart-resize rule (:func:`vlforge.media.resize.smart_resize`: sides rounded to ``patch_size * merge_size``,
  pixel count clamped to the image processor's ``shortest_edge``/``longest_edge``; GLM-4V's bound covers
  ``temporal_patch_size`` frames), rescaled and normalised with the processor's own mean/std, then
  cut into ``temporal_patch_size x patch_size x patch_size`` patches in the processor's merge order.
  The clip is fed to the model as one image with ``grid_t = frames / temporal_patch_size`` (the
  vision tower sees exactly what a video of those frames gives it; only the text-side M-RoPE
  positions differ from the video path, which needs timestamps this harness does not invent).
- ``images=[...]``: the processor's own image path (``processor(text=..., images=...)``).
- ``video=FILE``: ``video_frames`` frames sampled uniformly and decoded by seeking (the data pipeline's
  reader, :mod:`vlforge.media.decode`; only those frames are held), then as synthetic.

``InputSpec.build(batch_size)`` is the "processor" step that the profiler times; it returns CPU
tensors (``input_ids``, ``attention_mask``, ``mm_token_type_ids``, ``pixel_values``,
``image_grid_thw``).

Example:
    >>> from vlforge.media.resize import smart_resize
    >>> smart_resize(720, 1280, factor=32, min_pixels=65536, max_pixels=16777216)
    (704, 1280)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from vlforge.errors import DataError, VlforgeError
from vlforge.media.resize import smart_resize
from vlforge.models.families import CLIP_MEAN, CLIP_STD, uses_image_processor
from vlforge.models.input_checks import check_sources, parse_synthetic

PROMPT = "Describe this."


@dataclass
class InputSpec:
    """How to build one batch, plus what it holds."""

    kind: str
    """``synthetic``, ``image`` or ``video``."""
    description: str
    build: Callable[[int], dict[str, torch.Tensor]] = field(repr=False)
    """``batch_size -> CPU tensors``; what the profiler times as the processor step."""


@dataclass(frozen=True)
class VisionRules:
    """The processor rules the synthetic path follows."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    rescale: float
    resize_rule: str = "image"
    """:func:`vlforge.media.resize.smart_resize` rule of the image processor: ``video`` for GLM-4V's (its
    bounds cover ``temporal_patch_size`` frames), ``image`` for the Qwen-VL ones."""


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def vision_rules(model: torch.nn.Module, processor: Any | None) -> VisionRules:
    """Patch geometry from the model's vision config, resize/normalise rules from its image processor."""
    vision = model.config.vision_config
    image_processor = getattr(processor, "image_processor", None)
    size = _get(image_processor, "size")
    merge = getattr(vision, "spatial_merge_size", None) or _get(image_processor, "merge_size") or 2
    return VisionRules(
        patch_size=int(vision.patch_size),
        temporal_patch_size=int(getattr(vision, "temporal_patch_size", 2)),
        merge_size=int(merge),
        min_pixels=int(_get(size, "shortest_edge") or _get(image_processor, "min_pixels") or 56 * 56),
        max_pixels=int(_get(size, "longest_edge") or _get(image_processor, "max_pixels") or 28 * 28 * 1280),
        mean=tuple(_get(image_processor, "image_mean") or CLIP_MEAN),
        std=tuple(_get(image_processor, "image_std") or CLIP_STD),
        rescale=float(_get(image_processor, "rescale_factor") or 1 / 255),
        resize_rule=owner.image_resize_rule if (owner := uses_image_processor(type(image_processor).__name__)) else "image",
    )


def frames_to_patches(frames: Sequence[np.ndarray], rules: VisionRules) -> tuple[torch.Tensor, list[int]]:
    """RGB uint8 frames (H, W, 3) -> ``pixel_values`` (N, C*T*P*P) and ``grid_thw`` [t, h, w]."""
    height, width = frames[0].shape[:2]
    p, m, tp = rules.patch_size, rules.merge_size, rules.temporal_patch_size
    try:
        new_h, new_w = smart_resize(height, width, factor=p * m, min_pixels=rules.min_pixels,
                                    max_pixels=rules.max_pixels, rule=rules.resize_rule, num_frames=tp,
                                    temporal_factor=tp)
    except ValueError as error:
        raise VlforgeError(f"frame {height}x{width}: {error}") from None
    mean = np.asarray(rules.mean, dtype=np.float32)[:, None, None]
    std = np.asarray(rules.std, dtype=np.float32)[:, None, None]
    stack = []
    for frame in frames:
        image = Image.fromarray(frame)
        if (new_h, new_w) != (height, width):
            image = image.resize((new_w, new_h), Image.Resampling.BICUBIC)
        array = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) * rules.rescale
        stack.append((array - mean) / std)
    while len(stack) % tp:
        stack.append(stack[-1])
    video = np.stack(stack)  # (T, C, H, W)
    channels = video.shape[1]
    gt, gh, gw = len(stack) // tp, new_h // p, new_w // p
    patches = video.reshape(gt, tp, channels, gh // m, m, p, gw // m, m, p)
    # -> (gt, gh/m, gw/m, m, m, C, tp, p, p): merge groups contiguous, each row C*T*P*P as the conv expects
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = np.ascontiguousarray(patches).reshape(gt * gh * gw, channels * tp * p * p)
    return torch.from_numpy(flat), [gt, gh, gw]


def _token_ids(model: torch.nn.Module) -> tuple[int, int, int]:
    config = model.config
    image = getattr(config, "image_token_id", None)
    start = getattr(config, "vision_start_token_id", None) or getattr(config, "image_start_token_id", None)
    end = getattr(config, "vision_end_token_id", None) or getattr(config, "image_end_token_id", None)
    if image is None or start is None or end is None:
        raise VlforgeError(f"{config.model_type}: config lacks image_token_id / vision start / end token ids")
    return int(start), int(image), int(end)


def _tokenizer(loaded: Any) -> Any:
    tokenizer = getattr(loaded, "tokenizer", None) or getattr(getattr(loaded, "processor", None), "tokenizer", None)
    if tokenizer is None:
        raise VlforgeError(f"{getattr(loaded, 'source', 'model')}: no tokenizer loaded; profile and verify need one")
    return tokenizer


def _clip_spec(loaded: Any, frames: list[np.ndarray], kind: str, description: str) -> InputSpec:
    model = loaded.model
    rules = vision_rules(model, getattr(loaded, "processor", None))
    start, image_id, end = _token_ids(model)
    text_ids = _tokenizer(loaded)(PROMPT, add_special_tokens=False)["input_ids"]

    def build(batch_size: int) -> dict[str, torch.Tensor]:
        pixels, grid = frames_to_patches(frames, rules)
        tokens = grid[0] * grid[1] * grid[2] // rules.merge_size**2
        ids = torch.tensor([start] + [image_id] * tokens + [end] + list(text_ids)).repeat(batch_size, 1)
        return {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "mm_token_type_ids": (ids == image_id).to(torch.int32),
            "pixel_values": pixels.repeat(batch_size, 1),
            "image_grid_thw": torch.tensor([grid] * batch_size),
        }

    return InputSpec(kind=kind, description=description, build=build)


def synthetic_spec(loaded: Any, synthetic: str, *, seed: int = 0) -> InputSpec:
    """Random frames of the given size, processed with the model's own rules (see module docstring)."""
    count, height, width = parse_synthetic(synthetic)
    rng = np.random.default_rng(seed)
    frames = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(count)]
    return _clip_spec(loaded, frames, "synthetic", f"synthetic {count}x{height}x{width}")


def decode_video(path: Path, frames: int) -> list[np.ndarray]:
    """``frames`` RGB frames sampled uniformly over the whole video; only those are decoded and kept
    (:func:`vlforge.media.decode.read_video`, the data pipeline's seeking reader)."""
    from vlforge.media.decode import DECODE_ERRORS, read_video

    if not path.is_file():
        raise DataError(f"{path}: video file not found")

    def pick(total: int, rate: float) -> list[int]:
        return np.linspace(0, total - 1, num=min(frames, total)).round().astype(int).tolist()

    try:
        return read_video(path, pick, label=str(path)).frames
    except DECODE_ERRORS as error:
        raise DataError(f"{path}: cannot decode video: {error}") from error


def video_spec(loaded: Any, path: Path, *, frames: int = 8) -> InputSpec:
    """Frames of a video file, sampled uniformly, then processed like synthetic frames."""
    picked = decode_video(Path(path), frames)
    height, width = picked[0].shape[:2]
    return _clip_spec(loaded, picked, "video", f"video {Path(path).name}: {len(picked)}x{height}x{width}")


def image_spec(loaded: Any, paths: Sequence[Path]) -> InputSpec:
    """Image files through the processor's own image path, all images in one prompt."""
    processor = getattr(loaded, "processor", None)
    if processor is None or getattr(processor, "image_processor", None) is None:
        raise VlforgeError(f"{getattr(loaded, 'source', 'model')}: no image processor loaded; --image needs one")
    images = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: image file not found")
        try:
            with Image.open(path) as image:
                images.append(image.convert("RGB"))
        except (OSError, Image.DecompressionBombError) as error:
            raise DataError(f"{path}: cannot read image: {error}") from error
    start, image_id, end = _token_ids(loaded.model)
    tokenizer = _tokenizer(loaded)
    marker = tokenizer.convert_ids_to_tokens(start) + processor.image_token + tokenizer.convert_ids_to_tokens(end)
    prompt = marker * len(images) + PROMPT

    def build(batch_size: int) -> dict[str, torch.Tensor]:
        batch = processor(text=[prompt] * batch_size, images=[list(images) for _ in range(batch_size)],
                          return_tensors="pt")
        out = {key: value for key, value in batch.items() if isinstance(value, torch.Tensor)}
        if "mm_token_type_ids" not in out:
            out["mm_token_type_ids"] = (out["input_ids"] == image_id).to(torch.int32)
        return out

    sizes = ", ".join(f"{image.width}x{image.height}" for image in images)
    return InputSpec(kind="image", description=f"{len(images)} image(s): {sizes}", build=build)


def make_spec(loaded: Any, *, synthetic: str | None = None, images: Sequence[Path] | None = None,
              video: Path | None = None, video_frames: int = 8) -> InputSpec:
    """Exactly one of ``synthetic``, ``images``, ``video``; ``synthetic="1x224x224"`` when none is given."""
    check_sources(synthetic, images, video)
    if images:
        return image_spec(loaded, images)
    if video:
        return video_spec(loaded, video, frames=video_frames)
    return synthetic_spec(loaded, synthetic or "1x224x224")
