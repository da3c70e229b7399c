"""The one smart-resize: target frame sizes of the Qwen-VL families, rule by rule.

Every rule keeps the aspect ratio, makes both sides multiples of ``factor`` (patch_size * merge_size)
and keeps a pixel count within ``[min_pixels, max_pixels]``; they differ in edge cases:

- ``"image"``: transformers ``models/qwen2_vl/image_processing_qwen2_vl.py`` ``smart_resize`` (also used
  by its PIL copy and by ``video_processing_qwen2_vl.py``): bounds on ``h * w`` of one image or frame.
- ``"video"``: transformers ``models/glm4v/image_processing_glm4v.py`` ``smart_resize`` (used by
  ``video_processing_qwen3_vl.py``, ``video_processing_glm4v.py`` and, with ``num_frames =
  temporal_factor``, by GLM-4V's image processors): a side below ``factor`` is scaled up first and the
  bounds apply to ``t * h * w``, ``t`` = ``num_frames`` rounded to a multiple of ``temporal_factor``.
- ``"qwen_vl_utils"``: qwen-vl-utils ``vision_process.smart_resize``: sides first rounded to at least one
  ``factor``, no one-``factor`` floor when shrinking.

:func:`frame_max_pixels` is qwen-vl-utils ``fetch_video``'s per-frame ceiling under a total budget.

Example:
    >>> smart_resize(720, 1280, factor=32, min_pixels=65536, max_pixels=16777216)
    (704, 1280)
    >>> smart_resize(480, 640, factor=32, min_pixels=4096, max_pixels=640 * 480, rule="video", num_frames=8)
    (160, 224)
"""

from __future__ import annotations

import math
from typing import Literal

Rule = Literal["image", "video", "qwen_vl_utils"]
RULES: tuple[str, ...] = ("image", "video", "qwen_vl_utils")


def smart_resize(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int, rule: Rule = "image",
                 num_frames: int = 1, temporal_factor: int = 2) -> tuple[int, int]:
    """``(height, width)`` after the family's resize ``rule`` (see the module docstring); ValueError for an
    aspect ratio above 200, a non-positive side or (rule ``video``) fewer frames than ``temporal_factor``."""
    if rule not in RULES:
        raise ValueError(f"resize rule must be one of {', '.join(RULES)}, got {rule!r}")
    if min(height, width) <= 0:
        raise ValueError(f"frame size must be positive, got {height}x{width}")
    frames = 1
    if rule == "video":
        if num_frames < temporal_factor:
            raise ValueError(f"t:{num_frames} must be at least temporal_factor:{temporal_factor}")
        if height < factor or width < factor:
            scale = max(factor / height, factor / width)
            height, width = int(height * scale), int(width * scale)
        frames = round(num_frames / temporal_factor) * temporal_factor
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if rule == "qwen_vl_utils":
        h_bar, w_bar = max(factor, h_bar), max(factor, w_bar)
    count = num_frames if rule == "video" else 1  # the rescale uses the frames as given
    if frames * h_bar * w_bar > max_pixels:
        beta = math.sqrt(count * height * width / max_pixels)
        h_bar, w_bar = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
        if rule != "qwen_vl_utils":
            h_bar, w_bar = max(factor, h_bar), max(factor, w_bar)
    elif frames * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (count * height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def frame_max_pixels(max_pixels: int, min_pixels: int, total_pixels: int | None, num_frames: int,
                     temporal_factor: int = 2) -> int:
    """Per-frame pixel ceiling: ``max_pixels``, lowered to ``total_pixels * temporal_factor / num_frames``
    when a total budget is given, never below ``1.05 * min_pixels`` (qwen-vl-utils ``fetch_video``; the
    share is truncated to an integer)."""
    if total_pixels is None:
        return max_pixels
    share = total_pixels / num_frames * temporal_factor
    return max(min(max_pixels, int(share)), int(min_pixels * 1.05))
