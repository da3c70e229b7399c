"""Our processing equals transformers' own processor classes (PIL image processor + frames video processor).

The HF processors are built by ``vlforge.models.tiny.build_processor`` (the processors tiny checkpoints
ship); we feed them our decoded frames and their metadata, so the comparison covers the chat text (incl.
Qwen3-VL's per-frame timestamps), placeholder expansion, pixels, grids and ``mm_token_type_ids``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.video_utils import VideoMetadata

from vlforge.data import QwenVLProcessor, parse_conversation
from vlforge.data.media import Media
from vlforge.data.video import decode_video


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_sample_equals_the_hf_processor_output(tokenizer, media_dir, family):
    from vlforge.models.families import family as record
    from vlforge.models.tiny import build_processor, build_tokenizer

    hf = build_processor(family, tokenizer if record(family).tokenizer == "qwen3" else build_tokenizer(family))
    proc = QwenVLProcessor.from_hf_processor(hf, family, video_min_pixels=16 * 16, video_max_pixels=64 * 64)
    assert proc.settings.patch_size == hf.image_processor.patch_size
    messages = [
        {"role": "user", "content": [{"type": "image", "image": "img1.png"}, {"type": "video", "video": "clip.mp4"},
                                     {"type": "text", "text": "What changes?"}]},
        {"role": "assistant", "content": "The colour."},
    ]
    ours = proc.process(parse_conversation({"messages": messages}, "s.jsonl", "line 1"), media_dir)

    video = decode_video(Media(media_dir / "clip.mp4", None, "clip.mp4"), proc.settings, source="s", location="l")
    # the same per-frame bounds for the HF frames processor (Qwen3-VL's bounds cover all frames)
    frames_factor = len(video.frames) if record(family).video_resize_rule == "video" else 1
    hf.video_processor.size = {"shortest_edge": 16 * 16, "longest_edge": 64 * 64 * frames_factor}
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    meta = VideoMetadata(total_num_frames=video.total_frames, fps=video.video_fps, frames_indices=video.indices)
    kwargs = {"fps": video.sample_fps} if family == "qwen2_5_vl" else {}
    out = hf(text=[text], images=[Image.open(media_dir / "img1.png")], videos=[np.stack(video.frames)],
             video_metadata=[meta], return_tensors="pt", **kwargs)

    assert torch.equal(out["input_ids"][0], ours.input_ids)
    if "mm_token_type_ids" in out:
        assert torch.equal(out["mm_token_type_ids"][0].int(), ours.mm_token_type_ids)
    for key in ("image_grid_thw", "video_grid_thw"):
        assert torch.equal(out[key], getattr(ours, key)), key
    torch.testing.assert_close(out["pixel_values"].float(), ours.pixel_values)
    torch.testing.assert_close(out["pixel_values_videos"].float(), ours.pixel_values_videos, atol=1e-6, rtol=0)
    if family == "qwen2_5_vl":
        torch.testing.assert_close(torch.as_tensor(out["second_per_grid_ts"]).float(), ours.second_per_grid_ts)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # raised inside transformers' Glm4vProcessor
def test_glm4v_sample_equals_the_hf_processor_output(media_dir):
    from vlforge.models.tiny import build_processor, build_tokenizer

    tokenizer = build_tokenizer("glm4v")
    hf = build_processor("glm4v", tokenizer)
    proc = QwenVLProcessor.from_hf_processor(hf, "glm4v", min_pixels=28 * 28, max_pixels=64 * 64,
                                             video_min_pixels=16 * 16, video_max_pixels=64 * 64)
    assert proc.settings.image_processor == "Glm4vImageProcessorPil"
    messages = [
        {"role": "user", "content": [{"type": "image", "image": "img2.png"}, {"type": "video", "video": "clip.mp4"},
                                     {"type": "text", "text": "Describe."}]},
        {"role": "assistant", "content": "Noise, then colour."},
    ]
    ours = proc.process(parse_conversation({"messages": messages}, "s.jsonl", "line 1"), media_dir)
    video = decode_video(Media(media_dir / "clip.mp4", None, "clip.mp4"), proc.settings, source="s", location="l")
    hf.image_processor.size = {"shortest_edge": 28 * 28, "longest_edge": 64 * 64}
    hf.video_processor.size = {"shortest_edge": 16 * 16, "longest_edge": 64 * 64 * len(video.frames)}
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    meta = VideoMetadata(total_num_frames=video.total_frames, fps=video.video_fps, frames_indices=video.indices)
    out = hf(text=[text], images=[Image.open(media_dir / "img2.png")], videos=[np.stack(video.frames)],
             video_metadata=[meta], return_tensors="pt")

    # our text = the template's, plus <|endoftext|> closing the final (trained) assistant reply
    assert torch.equal(out["input_ids"][0], ours.input_ids[:-1])
    assert tokenizer.decode(ours.input_ids[-1:]) == "<|endoftext|>"
    assert torch.equal(out["mm_token_type_ids"][0].int(), ours.mm_token_type_ids[:-1])
    assert int((ours.mm_token_type_ids == 2).sum()) > 0 and int((ours.mm_token_type_ids == 1).sum()) > 0
    for key in ("image_grid_thw", "video_grid_thw"):
        assert torch.equal(out[key], getattr(ours, key)), key
    torch.testing.assert_close(out["pixel_values"].float(), ours.pixel_values)
    torch.testing.assert_close(out["pixel_values_videos"].float(), ours.pixel_values_videos, atol=1e-6, rtol=0)
    assert tokenizer.decode(ours.labels[ours.labels >= 0]) == "Noise, then colour.<|endoftext|>"


def test_glm4v_positions_and_multi_turn_labels(media_dir):
    from transformers import Glm4vModel

    from vlforge.models.tiny import build_config, build_processor, build_tokenizer

    tokenizer = build_tokenizer("glm4v")
    proc = QwenVLProcessor.from_hf_processor(build_processor("glm4v", tokenizer), "glm4v", max_pixels=64 * 64,
                                             video_min_pixels=16 * 16, video_max_pixels=64 * 64)
    record = {"messages": [
        {"role": "user", "content": [{"type": "video", "video": "clip.mp4"}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": "Bars."},
        {"role": "user", "content": [{"type": "image", "image": "img0.png"}, {"type": "text", "text": "And?"}]},
        {"role": "assistant", "content": "Noise."}]}
    sample = proc.process(parse_conversation(record, "s.jsonl", "line 1"), media_dir)
    assert tokenizer.decode(sample.labels[sample.labels >= 0]) == "Bars.<|user|>Noise.<|endoftext|>"
    config, _, _ = build_config("glm4v", tokenizer)
    expected, _ = Glm4vModel(config).get_rope_index(
        sample.input_ids[None], sample.mm_token_type_ids[None], image_grid_thw=sample.image_grid_thw,
        video_grid_thw=sample.video_grid_thw)
    assert torch.equal(sample.position_ids, expected[:, 0])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # raised inside transformers' Glm4vProcessor
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "glm4v"])
def test_a_video_of_frame_images_equals_the_hf_processor_fed_those_frames(tokenizer, media_dir, family):
    """qwen-vl-utils' frame list: every frame, the last repeated to a temporal patch, frame i at i / sample_fps s."""
    from vlforge.models.families import family as record
    from vlforge.models.tiny import build_processor, build_tokenizer

    hf = build_processor(family, build_tokenizer(family) if family in ("qwen3_5", "glm4v") else tokenizer)
    proc = QwenVLProcessor.from_hf_processor(hf, family, video_min_pixels=16 * 16, video_max_pixels=64 * 64)
    rng = np.random.default_rng(7)
    frames = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(5)]
    for i, frame in enumerate(frames):
        Image.fromarray(frame).save(media_dir / f"frame{i}.png")
    part = {"type": "video", "video": [f"frame{i}.png" for i in range(5)], "sample_fps": 1.5}
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "What moves?"}]},
                {"role": "assistant", "content": "Nothing."}]
    ours = proc.process(parse_conversation({"messages": messages}, "s.jsonl", "line 1"), media_dir)

    padded = frames + frames[-1:]  # 5 frames -> 6, a multiple of temporal_patch_size 2
    frames_factor = len(padded) if record(family).video_resize_rule == "video" else 1
    hf.video_processor.size = {"shortest_edge": 16 * 16, "longest_edge": 64 * 64 * frames_factor}
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    meta = VideoMetadata(total_num_frames=6, fps=1.5, frames_indices=list(range(6)))
    kwargs = {"fps": 1.5} if family == "qwen2_5_vl" else {}
    out = hf(text=[text], videos=[np.stack(padded)], video_metadata=[meta], return_tensors="pt", **kwargs)

    closing = 1 if family == "glm4v" else 0  # GLM's trained reply ends with <|endoftext|>, past the template's text
    assert torch.equal(out["input_ids"][0], ours.input_ids[: len(ours.input_ids) - closing])
    assert ours.video_grid_thw[0, 0].item() == 3
    assert torch.equal(out["video_grid_thw"], ours.video_grid_thw)
    torch.testing.assert_close(out["pixel_values_videos"].float(), ours.pixel_values_videos, atol=1e-6, rtol=0)
    if family == "qwen2_5_vl":
        assert ours.second_per_grid_ts.tolist() == pytest.approx([2 / 1.5])
        torch.testing.assert_close(torch.as_tensor(out["second_per_grid_ts"]).float(), ours.second_per_grid_ts)
