"""Inputs: synthetic frames follow the processor's rules exactly; video decodes with PyAV; images use the processor."""

from __future__ import annotations

import av
import numpy as np
import pytest
import torch
from PIL import Image

from vlforge.errors import DataError, VlforgeError
from vlforge.media.resize import smart_resize
from vlforge.models.input_checks import check_sources, parse_synthetic
from vlforge.models.inputs import frames_to_patches, make_spec, vision_rules


def test_one_synthetic_frame_equals_the_processor_image_path(loaded_tiny):
    loaded = loaded_tiny("qwen2_vl")
    frame = np.random.default_rng(1).integers(0, 256, (70, 150, 3), dtype=np.uint8)
    expected = loaded.processor.image_processor(images=[Image.fromarray(frame)], return_tensors="pt")
    pixels, grid = frames_to_patches([frame], vision_rules(loaded.model, loaded.processor))
    assert grid == expected["image_grid_thw"][0].tolist()
    torch.testing.assert_close(pixels, expected["pixel_values"], atol=1e-5, rtol=0)


def test_synthetic_clip_is_patched_in_time(loaded_tiny):
    loaded = loaded_tiny("qwen3_vl")
    batch = make_spec(loaded, synthetic="3x64x96").build(2)
    vision = loaded.model.config.vision_config
    t, h, w = batch["image_grid_thw"][0].tolist()
    assert t == 2  # 3 frames padded to 4, two per temporal patch
    assert batch["image_grid_thw"].tolist() == [[t, h, w]] * 2
    assert batch["pixel_values"].shape == (2 * t * h * w, 3 * vision.temporal_patch_size * vision.patch_size ** 2)
    image_tokens = int((batch["input_ids"][0] == loaded.model.config.image_token_id).sum())
    assert image_tokens == t * h * w // vision.spatial_merge_size ** 2
    assert torch.equal(batch["mm_token_type_ids"].bool(), batch["input_ids"] == loaded.model.config.image_token_id)
    with torch.no_grad():
        logits = loaded.model(**batch, use_cache=False).logits
    assert logits.shape[:2] == batch["input_ids"].shape


def test_image_files_use_the_processor(loaded_tiny, tmp_path):
    loaded = loaded_tiny("qwen3_vl")
    paths = []
    for i, size in enumerate([(64, 48), (40, 80)]):
        path = tmp_path / f"im{i}.png"
        Image.fromarray(np.full((*size, 3), 40 * i, dtype=np.uint8)).save(path)
        paths.append(path)
    spec = make_spec(loaded, images=paths)
    batch = spec.build(1)
    assert spec.kind == "image" and "2 image(s)" in spec.description
    assert batch["image_grid_thw"].shape == (2, 3)
    merge = loaded.model.config.vision_config.spatial_merge_size
    tokens = int(batch["image_grid_thw"].prod(-1).sum()) // merge ** 2
    assert int((batch["input_ids"] == loaded.model.config.image_token_id).sum()) == tokens
    with pytest.raises(DataError, match=r"missing\.png: image file not found"):
        make_spec(loaded, images=[tmp_path / "missing.png"])


def _write_video(path, frames: int) -> None:
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(frames):
            image = np.full((48, 64, 3), 10 * i, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def test_video_is_decoded_and_sampled_uniformly(loaded_tiny, tmp_path):
    path = tmp_path / "clip.mp4"
    _write_video(path, 20)
    spec = make_spec(loaded_tiny("qwen3_vl"), video=path, video_frames=4)
    batch = spec.build(1)
    assert spec.kind == "video" and "4x48x64" in spec.description
    assert batch["image_grid_thw"][0, 0] == 2
    (tmp_path / "bad.mp4").write_bytes(b"not a video")
    with pytest.raises(DataError, match=r"bad\.mp4: cannot decode video"):
        make_spec(loaded_tiny("qwen3_vl"), video=tmp_path / "bad.mp4")


def test_parsing_and_resize_rule():
    assert parse_synthetic("8x720x1280") == (8, 720, 1280)
    for bad in ("8x720", "0x10x10", "axbxc"):
        with pytest.raises(VlforgeError, match="FRAMESxHEIGHTxWIDTH"):
            parse_synthetic(bad)
    h, w = smart_resize(720, 1280, factor=28, min_pixels=3136, max_pixels=1003520)
    assert (h % 28, w % 28) == (0, 0) and h * w <= 1003520
    h, w = smart_resize(4000, 4000, factor=28, min_pixels=3136, max_pixels=1003520)
    assert h * w <= 1003520 and h == w
    assert smart_resize(10, 10, factor=28, min_pixels=3136, max_pixels=1003520) == (56, 56)
    with pytest.raises(VlforgeError, match="give one input source, not --synthetic and --video"):
        check_sources("1x2x2", None, "v.mp4")


def test_input_files_are_checked_before_any_model_loads(tmp_path):
    from PIL import Image

    good = tmp_path / "ok.png"
    Image.new("RGB", (32, 32), (9, 9, 9)).save(good)
    data = good.read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    _write_video(tmp_path / "clip.mp4", 4)
    (tmp_path / "empty.mp4").write_bytes(b"")
    check_sources(None, [good], None)
    check_sources(None, None, tmp_path / "clip.mp4")
    for images, video, message in [
        ([tmp_path / "gone.png"], None, r"--image .*gone\.png: image file not found"),
        ([tmp_path], None, r"--image .*: is a directory, not an image file"),
        ([good, tmp_path / "cut.png"], None, r"--image .*cut\.png: cannot read image"),
        (None, tmp_path / "gone.mp4", r"--video .*gone\.mp4: video file not found"),
        (None, tmp_path, r"--video .*: is a directory, not a video file"),
        (None, tmp_path / "empty.mp4", r"--video .*empty\.mp4: cannot decode video"),
    ]:
        with pytest.raises(DataError, match=message):
            check_sources(None, images, video)
