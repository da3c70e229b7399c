"""Qwen-VL processing with the real Qwen3 tokenizer and real media: ids, labels, grids, mrope, bad input."""

from __future__ import annotations

import base64

import pytest
import torch
from datakit import chat
from PIL import Image

from vlforge.data import IGNORE_INDEX, SampleError, parse_conversation


def _process(proc, record, folder, location="line 1"):
    return proc.process(parse_conversation(record, "set.jsonl", location), folder)


def test_labels_cover_exactly_the_assistant_replies(make_processor, tokenizer, media_dir):
    record = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image", "image": "img0.png"}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": "Noise."},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Yes, noise."}]},
    ]}
    sample = _process(make_processor("qwen3_vl"), record, media_dir)
    kept = sample.labels[sample.labels != IGNORE_INDEX]
    assert tokenizer.decode(kept) == "Noise.<|im_end|>Yes, noise.<|im_end|>"
    assert torch.equal(sample.labels[sample.labels != IGNORE_INDEX], sample.input_ids[sample.labels != IGNORE_INDEX])
    text = tokenizer.decode(sample.input_ids)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<|vision_start|>")
    assert text.endswith("<|im_start|>assistant\nYes, noise.<|im_end|>\n")


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_render_matches_the_family_chat_template(make_processor, media_dir, family):
    from vlforge.models.families import family as family_record
    from vlforge.models.templates import render

    messages = [{"role": "user", "content": [{"type": "image", "image": "img0.png"}, {"type": "text", "text": "Hi"}]},
                {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello."},
                {"role": "user", "content": "Again?"},
                {"role": "assistant", "content": [{"type": "text", "text": "<think>\nok\n</think>\n\nHello again."}]}]
    proc = make_processor(family)
    text, _ = proc.render(parse_conversation({"messages": messages}, "s", "line 1"),
                          ["<|vision_start|><|image_pad|><|vision_end|>"])
    assert text == render(family_record(family).template, messages, add_generation_prompt=False)
    assert ("hm" in text) == (family != "qwen3_vl") and "<think>\nok\n</think>" in text


def test_image_grid_tokens_and_pixels_agree_with_the_hf_image_processor(make_processor, media_dir):
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = make_processor("qwen3_vl", max_pixels=128 * 128)
    sample = _process(proc, chat([{"type": "image", "image": "img0.png"}, {"type": "text", "text": "?"}]), media_dir)
    ref = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=32 * 32,
                                   max_pixels=128 * 128, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    out = ref(images=[Image.open(media_dir / "img0.png")], return_tensors="pt")
    assert sample.image_grid_thw.tolist() == out["image_grid_thw"].tolist() == [[1, 4, 4]]  # 64x48 -> 64x64
    torch.testing.assert_close(sample.pixel_values, out["pixel_values"].float())
    assert int((sample.input_ids == 151655).sum()) == 4  # 16 patches / merge 2x2


def test_content_type_variants_resolve_to_the_same_pixels(make_processor, media_dir):
    proc = make_processor("qwen2_5_vl")
    payload = base64.b64encode((media_dir / "img1.png").read_bytes()).decode()
    jpeg = _process(proc, chat([{"type": "image", "image": "photo.jpg"}]), media_dir)
    assert jpeg.image_grid_thw.tolist() == [[1, 4, 4]]  # 48x64 JPEG -> 56x56 (factor 28) for Qwen2.5-VL
    variants = [{"type": "image", "image": "img1.png"},
                {"type": "image_url", "image_url": {"url": f"file://{media_dir / 'img1.png'}"}},
                {"type": "image_url", "image_url": f"data:image/png;base64,{payload}"},
                {"type": "image", "image": {"bytes": (media_dir / "img1.png").read_bytes()}}]
    pixels = [_process(proc, chat([v, {"type": "text", "text": "?"}]), media_dir).pixel_values for v in variants]
    for p in pixels[1:]:
        assert torch.equal(p, pixels[0])
    legacy = {"messages": [{"role": "user", "content": "<image>Compare <image>"},
                           {"role": "assistant", "content": "Same."}], "images": ["img1.png", "img1.png"]}
    assert torch.equal(_process(proc, legacy, media_dir).pixel_values, torch.cat([pixels[0], pixels[0]]))


def test_mrope_positions_equal_the_model_instance(make_processor, media_dir):
    """Our config-only call must give what a real (tiny) Qwen3-VL model computes for the same batch."""
    from transformers import Qwen3VLConfig, Qwen3VLModel

    sample = _process(make_processor("qwen3_vl"), chat([
        {"type": "image", "image": "img0.png"}, {"type": "video", "video": "clip.mp4"},
        {"type": "text", "text": "Both?"}]), media_dir)
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=151680, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                           deepstack_visual_indexes=[0]))
    model = Qwen3VLModel(config)
    expected, _ = model.get_rope_index(sample.input_ids[None], sample.mm_token_type_ids[None],
                                       image_grid_thw=sample.image_grid_thw, video_grid_thw=sample.video_grid_thw)
    assert torch.equal(sample.position_ids, expected[:, 0])
    # vision tokens share their temporal index per frame; text after them continues past the max
    assert sample.position_ids.shape == (3, len(sample))
    assert int(sample.position_ids[:, -1].min()) > int(sample.position_ids[:, :-1].max())


def test_text_only_positions_are_a_plain_range(make_processor, media_dir):
    sample = _process(make_processor("qwen2_vl"), chat("Hello there"), media_dir)
    assert torch.equal(sample.position_ids, torch.arange(len(sample)).expand(3, -1))
    assert sample.pixel_values is None and sample.video_grid_thw is None


@pytest.mark.parametrize(("record", "reason", "detail"), [
    (chat([{"type": "image", "image": "nope.png"}]), "missing_file", "nope.png"),
    (chat([{"type": "image", "image": "broken.png"}]), "corrupt_image", "cannot decode image"),
    (chat([{"type": "image", "image": "truncated.jpg"}]), "corrupt_image", "truncated.jpg"),
    (chat([{"type": "image", "image": "data:image/png;base64,anVuaw=="}]), "corrupt_image",
     "cannot decode image data:image/png;base64,...: cannot identify image file (in memory)"),
    (chat([{"type": "image", "image": {"bytes": b"junk", "path": "cat.png"}}]), "corrupt_image",  # a datasets Image
     "cannot decode image 'cat.png' (inline bytes): cannot identify image file (in memory)"),
    (chat([{"type": "video", "video": "broken.mp4"}]), "corrupt_video", "cannot decode video"),
    (chat([{"type": "video", "video": "missing.mp4"}]), "missing_file", "missing.mp4"),
    ({"image": "", "conversations": [{"from": "human", "value": "<image>?"}, {"from": "gpt", "value": "x"}]}, "schema",
     "an empty media reference"),
    (chat([{"type": "video", "video": "."}]), "schema", "is a directory: give a file, or a video as the list of its "
     "frame images"),
    (chat([{"type": "image", "image": "../outside.png"}]), "path_escape", "leaves data_folder"),
    (chat([{"type": "image_url", "image_url": {"url": "https://x.org/a.png"}}]), "remote_url", "no network"),
    (chat([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]), "schema", "base64"),
    (chat([{"type": "audio", "audio": "a.wav"}]), "schema", "unknown content type 'audio'"),
    (chat([{"type": "image", "image": ["img0.png", "img1.png"]}]), "schema",
     "a list of 2 references as one image: only a video may be a list (of its frames)"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "no_labels", "no assistant"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "schema", "role 'robot'"),
    ({"conversation": []}, "schema", "'messages'"),
    (chat([{"type": "video", "video": "clip.mp4", "fps": -1}]), "schema", "video option fps"),
    (chat([{"type": "video", "video": "clip.mp4", "video_max_pixels": "big"}]), "schema", "video_max_pixels"),
    ({"messages": [{"role": "user", "content": "<image><image>?"}, {"role": "assistant", "content": "x"}],
      "images": ["img0.png"]}, "placeholder_mismatch", "2 <image> placeholder(s) in the text but 1"),
    (chat("literal <|image_pad|> token"), "placeholder_mismatch", "1 image tokens in the text, 0 expected"),
])
def test_bad_input_raises_a_sample_error_naming_file_and_line(make_processor, media_dir, record, reason, detail):
    (media_dir / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    jpeg = (media_dir / "photo.jpg").read_bytes()
    (media_dir / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    (media_dir / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 this is not a video")
    (media_dir.parent / "outside.png").write_bytes((media_dir / "img0.png").read_bytes())
    with pytest.raises(SampleError) as info:
        _process(make_processor("qwen3_vl"), record, media_dir, location="line 42")
    assert info.value.reason == reason
    assert str(info.value).startswith(f"set.jsonl:line 42: {reason}: ")
    assert detail in str(info.value)
    assert "\n" not in str(info.value)


def test_an_image_over_pillows_pixel_limit_is_a_sample_error(make_processor, media_dir):
    """A 44 KB PNG of 19000x19000 pixels (twice Pillow's MAX_IMAGE_PIXELS): Pillow raises
    DecompressionBombError, which is no OSError; it must be a skippable corrupt_image, not a crash."""
    Image.new("1", (19000, 19000)).save(media_dir / "bomb.png")
    with pytest.raises(SampleError) as info:
        _process(make_processor("qwen3_vl"), chat([{"type": "image", "image": "bomb.png"}]), media_dir)
    assert info.value.reason == "corrupt_image" and "decompression bomb" in str(info.value)


def test_path_escape_allowed_by_flag(tokenizer, media_dir):
    from datakit import SMALL

    from vlforge.data import QwenVLProcessor, VisionSettings

    (media_dir.parent / "outside.png").write_bytes((media_dir / "img0.png").read_bytes())
    proc = QwenVLProcessor(tokenizer, VisionSettings.for_family("qwen3_vl", **SMALL), "qwen3_vl",
                           allow_path_escape=True)
    sample = _process(proc, chat([{"type": "image", "image": "../outside.png"}]), media_dir)
    assert sample.image_grid_thw.tolist() == [[1, 4, 4]]


def test_symlinked_media_inside_data_folder_are_read_where_the_link_points(make_processor, media_dir,
                                                                           tmp_path_factory):
    """LLaVA's `playground/data/coco -> /datasets/coco` and the hub cache's snapshot links: a path that stays in
    data_folder as written is inside it, wherever its links lead; `..` out of it is still an escape."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "x.png").write_bytes((media_dir / "img0.png").read_bytes())
    (media_dir / "coco").symlink_to(elsewhere, target_is_directory=True)
    (media_dir / "linked.png").symlink_to(elsewhere / "x.png")
    proc = make_processor("qwen3_vl")
    for name in ("coco/x.png", "linked.png"):
        sample = _process(proc, chat([{"type": "image", "image": name}]), media_dir)
        assert sample.image_grid_thw.tolist() == [[1, 4, 4]]
    with pytest.raises(SampleError, match="path_escape"):
        _process(proc, chat([{"type": "image", "image": f"coco/../../{elsewhere.name}/x.png"}]), media_dir)


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen2_vl"])
def test_openai_weight_zero_turns_are_context_and_developer_is_the_system_role(make_processor, tokenizer, media_dir,
                                                                               family):
    """OpenAI's fine-tuning format: an assistant message with "weight": 0 is shown, not trained; "developer" is
    its newer name of the system role."""
    turns = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "BAD REPLY", "weight": 0}, {"role": "user", "content": "Again"},
             {"role": "assistant", "content": "Good reply", "weight": 1}]
    proc = make_processor(family)
    sample = _process(proc, {"messages": turns}, media_dir)
    trained = proc.tokenizer.decode(sample.labels[sample.labels != IGNORE_INDEX])
    assert "Good reply" in trained and "BAD" not in trained
    assert "Be brief." in proc.tokenizer.decode(sample.input_ids) and "BAD REPLY" in proc.tokenizer.decode(
        sample.input_ids)
    nulls = [{**turn, "weight": None} for turn in turns[1:]]  # a parquet struct column fills absent keys with null
    assert (_process(proc, {"messages": nulls}, media_dir).labels != IGNORE_INDEX).sum() > \
        (sample.labels != IGNORE_INDEX).sum()
    only = [*turns[:2], {"role": "assistant", "content": "x", "weight": 0}]
    with pytest.raises(SampleError, match="no_labels"):
        _process(proc, {"messages": only}, media_dir)
    with pytest.raises(SampleError, match=r"message 2 has weight 0\.5; expected 0 or 1"):
        _process(proc, {"messages": [*turns[:2], {"role": "assistant", "content": "x", "weight": 0.5}]}, media_dir)


def test_qwen_vl_utils_per_item_keys_are_honoured_or_refused(make_processor, media_dir):
    """Qwen's own message format (qwen-vl-utils): an image's min_pixels / max_pixels and a video's nframes,
    max_pixels, ... apply to that item as the processor's settings would; resized_height and the like are refused
    in one line, never ignored."""
    proc = make_processor("qwen3_vl")
    both = chat([{"type": "image", "image": "img0.png", "max_pixels": 32 * 32}, {"type": "image", "image": "img1.png"}])
    sample = _process(proc, both, media_dir)
    alone = _process(make_processor("qwen3_vl", max_pixels=32 * 32), chat([{"type": "image", "image": "img0.png"}]),
                     media_dir)
    plain = _process(proc, chat([{"type": "image", "image": "img1.png"}]), media_dir)
    assert sample.image_grid_thw.tolist() == alone.image_grid_thw.tolist() + plain.image_grid_thw.tolist()
    assert torch.equal(sample.pixel_values, torch.cat([alone.pixel_values, plain.pixel_values]))
    ours = _process(proc, chat([{"type": "video", "video": "clip.mp4", "frame_num": 8, "video_max_pixels": 32 * 32}]),
                    media_dir)
    qwens = _process(proc, chat([{"type": "video", "video": "clip.mp4", "nframes": 8, "max_pixels": 32 * 32}]),
                     media_dir)
    assert qwens.video_grid_thw.tolist() == ours.video_grid_thw.tolist() == [[4, 2, 2]]
    # qwen-vl-utils' smart_nframes: fps or nframes, not both; nframes within the clip's frames (clip.mp4 has 16)
    for part, detail in (({"type": "video", "video": "clip.mp4", "fps": 1.0, "nframes": 8},
                          "video options fps and nframes / frame_num both given"),
                         ({"type": "video", "video": "clip.mp4", "nframes": 64, "max_frames": 64},
                          "video option nframes / frame_num: 64 frames of a clip of 16")):
        with pytest.raises(SampleError, match=f"schema: {detail}"):
            _process(proc, chat([part]), media_dir)
    assert _process(proc, chat([{"type": "video", "video": "clip.mp4", "nframes": 16, "max_frames": 64}]),
                    media_dir).video_grid_thw.tolist()[0][0] == 8
    for part, key in (({"type": "image", "image": "img0.png", "resized_height": 56}, "resized_height"),
                      ({"type": "video", "video": "clip.mp4", "video_start": 1.0}, "video_start")):
        with pytest.raises(SampleError, match=rf"schema: {part['type']} option {key!r} of qwen-vl-utils is not read"):
            _process(proc, chat([part]), media_dir)


def test_per_video_options_override_the_settings(make_processor, media_dir):
    proc = make_processor("qwen3_vl", fps=2)
    base = proc.process(parse_conversation(chat([{"type": "video", "video": "clip.mp4"}]), "s", "l"), media_dir)
    assert base.video_grid_thw.tolist() == [[2, 4, 4]]  # 2 s at fps 2 -> 4 frames
    record = chat([{"type": "video", "video": "clip.mp4", "frame_num": 8, "video_max_pixels": 32 * 32}])
    sample = proc.process(parse_conversation(record, "s", "l"), media_dir)
    assert sample.video_grid_thw.tolist() == [[4, 2, 2]]  # 8 frames, 32x32 px frames
