"""Fixtures for the data tests: the real Qwen3 tokenizer, small vision settings and real media files."""

from __future__ import annotations

from pathlib import Path

import pytest
from datakit import SMALL, write_image, write_video
from PIL import Image

from vlforge.data import QwenVLProcessor, VisionSettings


@pytest.fixture(scope="session")
def tokenizer():
    from vlforge.models.tokenizer import qwen3_tokenizer

    return qwen3_tokenizer()


@pytest.fixture(scope="session")
def make_processor(tokenizer):
    def make(family: str = "qwen3_vl", **overrides) -> QwenVLProcessor:
        return QwenVLProcessor(tokenizer, VisionSettings.for_family(family, **{**SMALL, **overrides}), family)

    return make


@pytest.fixture
def media_dir(tmp_path: Path) -> Path:
    """A folder with img0..img2.png, photo.jpg and clip.mp4 (16 frames, 64x48, 8 fps)."""
    for i in range(3):
        write_image(tmp_path / f"img{i}.png", seed=i)
    Image.open(tmp_path / "img0.png").save(tmp_path / "photo.jpg", quality=90)
    write_video(tmp_path / "clip.mp4")
    return tmp_path
