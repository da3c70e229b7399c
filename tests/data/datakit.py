"""Helpers for the data tests: real media files (Pillow PNG/JPEG, PyAV MP4) and chat records."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
from PIL import Image

# Small budgets so test media stay tiny: 64x48 images -> a 4x4 patch grid for Qwen3-VL (32 px factor).
SMALL = dict(min_pixels=32 * 32, max_pixels=64 * 64, video_min_pixels=16 * 16, video_max_pixels=64 * 64)


def write_image(path: Path, size=(64, 48), seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path


def write_video(path: Path, frames: int = 16, size=(64, 48), rate: int = 8, codec: str = "mpeg4") -> Path:
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        for i in range(frames):
            pixels = np.zeros((size[1], size[0], 3), np.uint8)
            pixels[..., 0] = (i * 13) % 256
            pixels[: (i % size[1]) + 1, :, 1] = 200
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def chat(user, answer="A small picture.") -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def write_jsonl(path: Path, records) -> Path:
    with open(path, "w") as fh:
        for rec in records:
            fh.write((rec if isinstance(rec, str) else json.dumps(rec)) + "\n")
    return path


def text_records(n: int, start: int = 0) -> list[dict]:
    """Varied-length text-only chats: record i asks about item i."""
    return [chat(f"Question {i}: " + "more words " * (i % 7), f"Answer {i}" + " ok" * (i % 5)) for i in
            range(start, start + n)]

