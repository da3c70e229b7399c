"""One smart-resize, three rules: each equals the function it names (transformers' PIL copies, qwen-vl-utils)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from transformers.models.glm4v.image_processing_pil_glm4v import smart_resize as hf_video_rule
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_image_rule

from vlforge.errors import VlforgeError
from vlforge.media.resize import frame_max_pixels, smart_resize
from vlforge.models.inputs import VisionRules, frames_to_patches


def _cases(n: int = 3000):
    rng = np.random.default_rng(0)
    for _ in range(n):
        h, w = (int(v) for v in rng.integers(1, 2500, 2))
        if max(h, w) / min(h, w) > 150:
            continue
        lo, hi = sorted(int(v) for v in rng.choice([1, 3136, 4096, 100352, 4 * 64 * 64, 602112, 16 << 20], 2))
        yield h, w, int(rng.choice([28, 32])), lo, hi, int(rng.integers(2, 40))


def test_image_and_video_rules_equal_transformers():
    for h, w, f, lo, hi, n in _cases():
        assert smart_resize(h, w, factor=f, min_pixels=lo, max_pixels=hi) == hf_image_rule(
            h, w, factor=f, min_pixels=lo, max_pixels=hi), (h, w, f, lo, hi)
        got = smart_resize(h, w, factor=f, min_pixels=lo, max_pixels=hi, rule="video", num_frames=n)
        assert got == hf_video_rule(n, h, w, temporal_factor=2, factor=f, min_pixels=lo, max_pixels=hi)


def _qwen_vl_utils(height, width, factor, min_pixels, max_pixels):
    """qwen-vl-utils vision_process.smart_resize, restated from its documented steps for the test."""
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        return math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    if h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        return math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def test_qwen_vl_utils_rule_and_where_the_rules_differ():
    for h, w, f, lo, hi, _ in _cases(1000):
        assert smart_resize(h, w, factor=f, min_pixels=lo, max_pixels=hi, rule="qwen_vl_utils") == _qwen_vl_utils(
            h, w, f, lo, hi)
    # a side under half a factor: transformers rounds it to 0 and scales up, qwen-vl-utils keeps one factor
    assert smart_resize(10, 300, factor=28, min_pixels=1, max_pixels=10**6) == (28, 28)
    assert smart_resize(10, 300, factor=28, min_pixels=1, max_pixels=10**6, rule="qwen_vl_utils") == (28, 308)
    # the video rule bounds all frames together
    assert smart_resize(480, 640, factor=32, min_pixels=1, max_pixels=640 * 480, rule="video", num_frames=8) == (
        160, 224)


def test_bad_inputs_are_value_errors():
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(1, 300, factor=28, min_pixels=1, max_pixels=10**6)
    with pytest.raises(ValueError, match="temporal_factor"):
        smart_resize(64, 64, factor=28, min_pixels=1, max_pixels=10**6, rule="video", num_frames=1)
    with pytest.raises(ValueError, match="rule must be one of"):
        smart_resize(64, 64, factor=28, min_pixels=1, max_pixels=10**6, rule="nearest")


def test_frame_budget_follows_qwen_vl_utils():
    assert frame_max_pixels(602112, 100352, None, 400) == 602112
    assert frame_max_pixels(602112, 100352, 20 * 448 * 448, 8) == 602112  # the budget is not binding
    assert frame_max_pixels(602112, 100352, 20 * 448 * 448, 400) == int(100352 * 1.05)  # floor
    assert frame_max_pixels(602112, 10000, 20 * 448 * 448, 40) == 200704


def test_profile_inputs_follow_the_glm_image_processor_rule():
    """GLM-4V's image processor bounds temporal_patch_size frames together; the synthetic path must too."""
    frame = np.zeros((480, 640, 3), np.uint8)
    common = dict(patch_size=14, temporal_patch_size=2, merge_size=2, min_pixels=3136, max_pixels=640 * 480,
                  mean=(0.5,) * 3, std=(0.5,) * 3, rescale=1 / 255)
    _, qwen = frames_to_patches([frame], VisionRules(**common))
    _, glm = frames_to_patches([frame], VisionRules(**common, resize_rule="video"))
    h, w = hf_video_rule(2, 480, 640, temporal_factor=2, factor=28, min_pixels=3136, max_pixels=640 * 480)
    assert glm == [1, h // 14, w // 14] and qwen == [1, 476 // 14, 644 // 14]
    with pytest.raises(VlforgeError, match="frame 1x300: absolute aspect ratio"):
        frames_to_patches([np.zeros((1, 300, 3), np.uint8)], VisionRules(**common))
