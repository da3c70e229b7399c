"""The small real dataset of the parity comparisons (vlforge, a transformers-only reference, LMMS Engine).

Four chats in LMMS Engine's JSONL layout (OpenAI-style parts: ``image_url`` / ``video_url``, every
content a list), with real encoded files: PNG images written by Pillow, one H.264 MP4 written by PyAV.
Covered: a system prompt, several assistant turns, one and two images in a turn, a chat with no system
prompt (where the engines' default system prompts differ) and one video sample. Sizes are multiples of
224 (= lcm(28, 32)) within both families' pixel bounds, so no image or frame is resized; the video has
4 frames at 2 fps, so sampling at 2 fps keeps every frame in every engine. Needs only Pillow, PyAV and
numpy, so the peer's venv can import it too.

Example:
    >>> from pathlib import Path
    >>> import tempfile
    >>> path = write_dataset(Path(tempfile.mkdtemp()))
    >>> path.name, len(path.read_text().splitlines())
    ('parity.jsonl', 4)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VIDEO_FPS = 2
VIDEO_FRAMES = 4
SIDE = 224
# vision settings every engine gets (pixels of one image / one frame, frames per second of video)
MIN_PIXELS = 3136
MAX_PIXELS = SIDE * SIDE * 2
SAMPLE_FPS = 2


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


def _image(name: str) -> dict:
    return {"type": "image_url", "image_url": {"url": f"images/{name}"}}


def _msg(role: str, *parts: dict) -> dict:
    return {"role": role, "content": list(parts)}


RECORDS = [
    {"messages": [  # the case: system prompt, an image, two assistant turns
        _msg("system", _text("You describe pictures in one short sentence.")),
        _msg("user", _image("circle.png"), _text("What is in this picture?")),
        _msg("assistant", _text("A red circle on a blue background.")),
        _msg("user", _text("And its colour?")),
        _msg("assistant", _text("Red.")),
    ]},
    {"messages": [  # no system prompt, two images in one turn
        _msg("user", _text("Compare these two pictures."), _image("square.png"), _image("stripes.png")),
        _msg("assistant", _text("The first shows a green square, the second horizontal stripes.")),
    ]},
    {"messages": [  # the video sample
        _msg("system", _text("You answer questions about videos.")),
        _msg("user", {"type": "video_url", "video_url": {"url": "videos/moving.mp4"}},
             _text("Which way does the square move?")),
        _msg("assistant", _text("It moves from left to right.")),
    ]},
    {"messages": [  # three assistant turns, an image in the second user turn
        _msg("system", _text("Be brief.")),
        _msg("user", _text("Say hello.")),
        _msg("assistant", _text("Hello.")),
        _msg("user", _image("stripes.png"), _text("How many stripes?")),
        _msg("assistant", _text("Four stripes.")),
        _msg("user", _text("Thanks!")),
        _msg("assistant", _text("You are welcome.")),
    ]},
]


def _images(folder: Path) -> None:
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    img = Image.new("RGB", (SIDE, SIDE), (30, 60, 200))
    ImageDraw.Draw(img).ellipse((40, 40, 184, 184), fill=(220, 30, 30))
    img.save(folder / "circle.png")
    img = Image.new("RGB", (SIDE * 2, SIDE), (240, 230, 40))  # 448 x 224
    ImageDraw.Draw(img).rectangle((150, 50, 300, 170), fill=(20, 170, 60))
    img.save(folder / "square.png")
    rows = np.repeat(np.arange(SIDE)[:, None] // (SIDE // 8) % 2, SIDE, axis=1).astype(np.uint8)
    stripes = np.stack([rows * 200 + 20, rows * 90 + 40, 255 - rows * 200], axis=-1).astype(np.uint8)
    Image.fromarray(stripes).save(folder / "stripes.png")


def _video(path: Path) -> None:
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=VIDEO_FPS)
        stream.width = stream.height = SIDE
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18"}
        for i in range(VIDEO_FRAMES):
            frame = np.full((SIDE, SIDE, 3), (40, 40, 120), dtype=np.uint8)
            x = 16 + i * 48
            frame[80:144, x:x + 64] = (230, 210, 30)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_dataset(folder: Path) -> Path:
    """Write ``parity.jsonl``, ``images/`` and ``videos/`` into ``folder``; return the JSONL's path."""
    folder = Path(folder)
    _images(folder / "images")
    _video(folder / "videos" / "moving.mp4")
    path = folder / "parity.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    return path
