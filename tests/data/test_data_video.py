"""Golden rules for video: frame sampling, smart-resize grids, token counts, Qwen3-VL timestamps, PyAV decode."""

from __future__ import annotations

import inspect

import av
import numpy as np
import pytest
import torch
from datakit import SMALL, chat, write_video
from PIL import Image

from vlforge.data import (
    VisionSettings,
    parse_conversation,
    process_images,
    process_video_frames,
    sample_frame_indices,
    video_frame_size,
)
from vlforge.data.media import Media
from vlforge.data.video import decode_video


@pytest.mark.parametrize(("kwargs", "expected"), [
    (dict(total_frames=16, video_fps=8, fps=2), [0, 5, 10, 15]),  # 2 s clip at 2 fps
    (dict(total_frames=300, video_fps=30, fps=1), [0, 33, 66, 100, 133, 166, 199, 233, 266, 299]),  # 10 s, 1 fps
    (dict(total_frames=10, video_fps=30, fps=1), [0, 3, 6, 9]),  # 0.33 s: raised to min_frames=4
    (dict(total_frames=3, video_fps=30, fps=2), [0, 2]),  # fewer frames than min_frames: floor to 2
    (dict(total_frames=1, video_fps=30, fps=2), [0, 0]),  # one frame: repeated to a temporal patch
    (dict(total_frames=16, video_fps=8, frame_num=5), [0, 5, 10, 15]),  # 5 -> rounded to 4
    (dict(total_frames=16, video_fps=8, frame_num=7), [0, 2, 4, 6, 9, 11, 13, 15]),  # 7 -> 8
])
def test_frame_sampling_golden(kwargs, expected):
    assert sample_frame_indices(**kwargs) == expected


def test_video_max_frames_caps_and_keeps_the_temporal_multiple():
    got = sample_frame_indices(total_frames=3000, video_fps=30, fps=2, max_frames=65)
    assert len(got) == 64 and got[0] == 0 and got[-1] == 2999
    assert len(sample_frame_indices(total_frames=3000, video_fps=30, frame_num=100, max_frames=33)) == 32


@pytest.mark.parametrize(("family", "size", "overrides", "frame_hw", "tokens_per_frame"), [
    ("qwen2_5_vl", (480, 640), {}, (476, 644), 391),  # 17x23 merged tokens
    ("qwen2_5_vl", (480, 640), {"video_max_pixels": 224 * 224}, (168, 252), 54),  # LMMS guide budget
    ("qwen3_vl", (480, 640), {"video_max_pixels": 224 * 224}, (192, 256), 48),
    ("qwen3_vl", (720, 1280), {}, (640, 1152), 720),  # per-frame ceiling 768 tokens of 32x32 px
    ("qwen3_vl", (48, 64), SMALL, (64, 64), 4),
    ("qwen2_vl", (20, 20), {"video_min_pixels": 56 * 56}, (56, 56), 4),  # tiny frames scale up
])
def test_smart_resize_golden(family, size, overrides, frame_hw, tokens_per_frame):
    s = VisionSettings.for_family(family, **overrides)
    h, w = video_frame_size(*size, num_frames=8, settings=s)
    assert (h, w) == frame_hw
    assert h % s.factor == 0 and w % s.factor == 0
    assert s.video_min_pixels <= h * w <= s.video_max_pixels
    assert (h // s.patch_size) * (w // s.patch_size) // s.merge_size**2 == tokens_per_frame


def test_total_pixel_budget_shrinks_frames_of_long_clips():
    s = VisionSettings.for_family("qwen2_5_vl", video_total_pixels=20 * 448 * 448)
    few, many = video_frame_size(480, 640, 8, s), video_frame_size(480, 640, 400, s)
    assert few[0] * few[1] > many[0] * many[1] >= s.video_min_pixels


def test_static_video_patches_equal_the_image_processor(tmp_path):
    """Two identical frames must patchify exactly like transformers' image path for that frame."""
    s = VisionSettings.for_family("qwen3_vl", min_pixels=64 * 64, max_pixels=96 * 128, video_min_pixels=64 * 64,
                                  video_max_pixels=96 * 128)
    frame = np.random.default_rng(3).integers(0, 256, (90, 120, 3), dtype=np.uint8)
    video = process_video_frames([frame, frame], s)
    image = process_images([Image.fromarray(frame)], s)
    assert video["video_grid_thw"].tolist() == image["image_grid_thw"].tolist() == [[1, 6, 8]]  # 90x120 -> 96x128
    torch.testing.assert_close(video["pixel_values_videos"], image["pixel_values"])


def test_patch_order_temporal_then_spatial_blocks():
    s = VisionSettings.for_family("qwen3_vl", **SMALL)
    frames = [np.full((64, 64, 3), v, np.uint8) for v in (0, 255, 0, 255)]
    out = process_video_frames(frames, s)
    assert out["video_grid_thw"].tolist() == [[2, 4, 4]]
    pv = out["pixel_values_videos"].view(2 * 16, 3, 2, 16, 16)  # (patches, C, tp, p, p)
    assert torch.all(pv[:, :, 0] == -1) and torch.all(pv[:, :, 1] == 1)  # frame 0 black, frame 1 white


@pytest.mark.parametrize("codec", ["mpeg4", "libx264"])
def test_pyav_decode_picks_the_sampled_frames(tmp_path, codec):
    if codec not in av.codecs_available:
        pytest.skip(f"{codec} not in this PyAV build")
    path = write_video(tmp_path / "c.mp4", frames=40, codec=codec)
    s = VisionSettings.for_family("qwen3_vl", **SMALL)
    video = decode_video(Media(path, None, str(path)), s, source="s", location="line 1")
    assert (video.total_frames, video.video_fps) == (40, 8.0)
    assert video.indices == [0, 4, 9, 13, 17, 22, 26, 30, 35, 39]
    red = [int(np.median(f[..., 0])) for f in video.frames]
    assert all(abs(r - (i * 13) % 256) <= 12 for r, i in zip(red, video.indices, strict=True)), red


def test_qwen3_video_text_has_one_timestamp_per_temporal_patch(make_processor, tokenizer, tmp_path):
    write_video(tmp_path / "five_s.mp4", frames=40)  # 5 s at 8 fps -> 10 frames at fps 2 -> 5 patches
    proc = make_processor("qwen3_vl", fps=2)
    sample = proc.process(parse_conversation(chat([{"type": "video", "video": "five_s.mp4"}]), "s", "line 1"),
                          tmp_path)
    assert sample.video_grid_thw.tolist() == [[5, 4, 4]]
    text = tokenizer.decode(sample.input_ids)
    body = text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
    frame = "<|vision_start|>" + "<|video_pad|>" * 4 + "<|vision_end|>"
    stamps = ["0.2", "1.4", "2.4", "3.5", "4.6"]  # mean time of each patch's two frames
    assert body == "<|vision_start|>" + "".join(f"<{t} seconds>{frame}" for t in stamps) + "<|vision_end|>"
    assert int((sample.mm_token_type_ids == 2).sum()) == 20


def test_qwen25_video_tokens_and_temporal_positions(make_processor, tmp_path):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel

    write_video(tmp_path / "v.mp4", frames=16)
    proc = make_processor("qwen2_5_vl", fps=4)  # 8 of 16 frames at 8 fps -> 4 temporal patches of 0.5 s
    sample = proc.process(parse_conversation(chat([{"type": "video", "video": "v.mp4"}]), "s", "line 1"), tmp_path)
    assert sample.video_grid_thw.tolist() == [[4, 4, 4]]  # 48x64 -> 56x56 (factor 28, max 64*64 px)
    assert sample.second_per_grid_ts.tolist() == [0.5]
    assert int((sample.mm_token_type_ids == 2).sum()) == 4 * 4
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=151680, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1,
                         rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
                           tokens_per_second=2, fullatt_block_indexes=[0]))
    expected, _ = Qwen2_5_VLModel(config).get_rope_index(
        sample.input_ids[None], sample.mm_token_type_ids[None], video_grid_thw=sample.video_grid_thw,
        second_per_grid_ts=sample.second_per_grid_ts)
    assert torch.equal(sample.position_ids, expected[:, 0])
    temporal = sample.position_ids[0][sample.mm_token_type_ids == 2].unique()
    # transformers 5.17 truncates the seconds per patch (int(0.5) = 0: every patch at one temporal position);
    # vlforge's positions are the installed transformers' own (equal above), README "Supported versions"
    truncates = "int(next(second_per_grid_ts))" in inspect.getsource(Qwen2_5_VLModel.get_rope_index)
    assert (temporal - temporal[0]).tolist() == ([0] if truncates else [0, 1, 2, 3])  # 0.5 s/patch * 2 tokens/s
