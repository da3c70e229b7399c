"""FramesVideoProcessor: Qwen patch layout, resize rules, metadata and loud option handling."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from transformers import Qwen2VLImageProcessorPil
from transformers.video_utils import VideoMetadata

from vlforge.media.resize import smart_resize
from vlforge.models.frames_video import FramesVideoProcessor


def _frames(count: int, height: int = 50, width: int = 70, seed: int = 0) -> np.ndarray:
    return (np.random.RandomState(seed).rand(count, height, width, 3) * 255).astype(np.uint8)


def test_two_equal_frames_match_the_transformers_image_processor():
    # An image is a clip of one frame repeated over the temporal patch: both paths must agree.
    frame = _frames(1)[0]
    size = {"shortest_edge": 3136, "longest_edge": 200_000}
    image = Qwen2VLImageProcessorPil(patch_size=14, size=size)(Image.fromarray(frame), return_tensors="np")
    video = FramesVideoProcessor(patch_size=14, size=size)(np.stack([frame, frame]), return_tensors="np")
    assert video["video_grid_thw"].tolist() == image["image_grid_thw"].tolist()
    np.testing.assert_allclose(video["pixel_values_videos"], image["pixel_values"], atol=1e-5)


def test_odd_frame_counts_repeat_the_last_frame():
    processor = FramesVideoProcessor(patch_size=16, size={"shortest_edge": 1024, "longest_edge": 64 * 64 * 4})
    out = processor(_frames(3, 64, 64), return_tensors="np")
    grid_t, grid_h, grid_w = out["video_grid_thw"][0].tolist()
    assert grid_t == 2
    rows = out["pixel_values_videos"].reshape(grid_t, grid_h * grid_w, 3, 2, 16 * 16)
    np.testing.assert_array_equal(rows[1, :, :, 0], rows[1, :, :, 1])  # frame 3 padded with itself
    assert not np.array_equal(rows[0, :, :, 0], rows[0, :, :, 1])
    assert processor.get_num_of_video_patches(3, 64, 64) == rows.shape[0] * rows.shape[1]


def test_video_rule_spends_the_pixel_budget_over_all_frames():
    per_frame = smart_resize(480, 640, factor=32, min_pixels=4096, max_pixels=640 * 480)
    assert per_frame == (480, 640)
    h, w = smart_resize(480, 640, factor=32, min_pixels=4096, max_pixels=640 * 480, rule="video", num_frames=8)
    assert h % 32 == 0 and w % 32 == 0 and 8 * h * w <= 640 * 480
    assert abs(w / h - 640 / 480) < 0.2
    small = FramesVideoProcessor(patch_size=16, resize_rule="video", size={"shortest_edge": 0, "longest_edge": 8 * 64 * 64})
    grid = small(_frames(8, 128, 128), return_tensors="np")["video_grid_thw"][0].tolist()
    assert grid == [4, 4, 4]  # 8 frames x 64 x 64 fills the budget exactly


def test_metadata_is_returned_and_kept():
    processor = FramesVideoProcessor(patch_size=14)
    made = processor(_frames(4), return_metadata=True, fps=5.0)["video_metadata"][0]
    assert isinstance(made, VideoMetadata) and made.fps == 5.0 and made.frames_indices == [0, 1, 2, 3]
    given = {"total_num_frames": 40, "fps": 10.0, "frames_indices": [0, 10, 20, 30]}
    kept = processor(_frames(4), video_metadata=[given], return_metadata=True)["video_metadata"][0]
    assert kept.timestamps == [0.0, 1.0, 2.0, 3.0]


def test_unsupported_inputs_and_options_are_errors():
    processor = FramesVideoProcessor()
    with pytest.raises(ValueError, match="does not sample frames"):
        processor(_frames(4), do_sample_frames=True)
    with pytest.raises(ValueError, match="unsupported options: crop_size"):
        processor(_frames(4), crop_size=3)
    with pytest.raises(ValueError, match="decode the video first"):
        processor("/tmp/clip.mp4")


def test_settings_round_trip_through_to_dict():
    processor = FramesVideoProcessor(patch_size=16, resize_rule="video", fps=1.5, size={"shortest_edge": 1, "longest_edge": 2})
    settings = processor.to_dict()
    assert settings["video_processor_type"] == "FramesVideoProcessor"
    again = FramesVideoProcessor(**settings)
    assert again.to_dict() == settings
    with pytest.raises(ValueError, match="resize_rule"):
        FramesVideoProcessor(resize_rule="nearest")


@pytest.mark.parametrize("count", [2, 3, 5, 8])
@pytest.mark.parametrize("hw", [(20, 300), (50, 70), (480, 640)])
def test_grids_equal_transformers_resize_functions(count, hw):
    """The stand-ins size frames exactly as transformers' own functions (odd counts and tiny sides too)."""
    from transformers.models.glm4v.image_processing_pil_glm4v import smart_resize as glm_video_rule
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as qwen2_rule

    size = {"shortest_edge": 3136, "longest_edge": 4 * 64 * 64}
    frames = _frames(count, *hw)
    per_frame = FramesVideoProcessor(patch_size=14, size=size)(frames, return_tensors="np")["video_grid_thw"][0]
    h, w = qwen2_rule(*hw, factor=28, min_pixels=3136, max_pixels=4 * 64 * 64)
    assert per_frame.tolist()[1:] == [h // 14, w // 14]
    video = FramesVideoProcessor(patch_size=14, resize_rule="video", size=size)(frames, return_tensors="np")
    h, w = glm_video_rule(count, *hw, temporal_factor=2, factor=28, min_pixels=3136, max_pixels=4 * 64 * 64)
    assert video["video_grid_thw"][0].tolist()[1:] == [h // 14, w // 14]
