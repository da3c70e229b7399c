"""Generate the small bundled example dataset (images, one video, JSONL chats, dataset YAML).

Run (CPU, < 2 s):
    .venv/bin/python examples/data/make_example_data.py            # writes next to this script
    .venv/bin/python examples/data/make_example_data.py --out /tmp/example-data

Outputs: ``images/*.png`` (shapes on coloured backgrounds, 96x64), ``videos/moving_square.mp4``
(16 frames, 64x48, 8 fps, mpeg4), ``train.jsonl`` (chat "messages" records with text, image and video
content), ``llava.json`` (image and text chats in the LLaVA layout), ``dataset.yaml`` (the LMMS Engine style list ``{path, data_folder, data_type}``) and
``data.yaml`` (a data config using it).
Deterministic: the same files every run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageDraw

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 210), "yellow": (230, 200, 40)}
SHAPES = ("circle", "square", "triangle")


def draw(shape: str, fg: str, bg: str, size=(96, 64)) -> Image.Image:
    img = Image.new("RGB", size, COLOURS[bg])
    d = ImageDraw.Draw(img)
    box = (size[0] // 2 - 22, size[1] // 2 - 22, size[0] // 2 + 22, size[1] // 2 + 22)
    if shape == "circle":
        d.ellipse(box, fill=COLOURS[fg])
    elif shape == "square":
        d.rectangle(box, fill=COLOURS[fg])
    else:
        d.polygon([(box[0], box[3]), (box[2], box[3]), ((box[0] + box[2]) // 2, box[1])], fill=COLOURS[fg])
    return img


def write_video(path: Path, frames: int = 16, size=(64, 48), rate: int = 8) -> None:
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        stream.bit_rate = 64_000
        for i in range(frames):
            pixels = np.full((size[1], size[0], 3), COLOURS["blue"], np.uint8)
            x = 2 + i * (size[0] - 16) // frames
            pixels[16:30, x : x + 14] = COLOURS["yellow"]
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def records(images: list[tuple[str, str, str, str]]) -> list[dict]:
    out = []
    for name, shape, fg, bg in images:
        out.append({"messages": [
            {"role": "user", "content": [{"type": "image", "image": f"images/{name}"},
                                         {"type": "text", "text": "What is in this picture?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": f"A {fg} {shape} on a {bg} background."}]},
        ]})
    out.append({"messages": [
        {"role": "user", "content": [{"type": "video", "video": "videos/moving_square.mp4"},
                                     {"type": "text", "text": "Which way does the square move?"}]},
        {"role": "assistant", "content": "A yellow square moves from left to right."},
    ]})
    out.append({"messages": [
        {"role": "system", "content": "Answer in one short sentence."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"images/{images[0][0]}"}},
                                     {"type": "image", "image": f"images/{images[1][0]}"},
                                     {"type": "text", "text": "Do these two pictures show the same shape?"}]},
        {"role": "assistant", "content": "No, they show different shapes."},
    ]})
    out.append({"messages": [{"role": "user", "content": "<image>Name the colour of the shape."},
                             {"role": "assistant", "content": f"It is {images[2][2]}."}],
                "images": [f"images/{images[2][0]}"]})
    for q, a in [("What is two plus three?", "Five."), ("Name a primary colour.", "Red."),
                 ("How many sides does a triangle have?", "Three.")]:
        out.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
    return out


def llava_records(images: list[tuple[str, str, str, str]]) -> list[dict]:
    """The image chats of :func:`records` and one text chat in the LLaVA / ShareGPT layout (``conversations`` of
    ``{from, value}``, the image named in ``image``, ``<image>`` where it goes)."""
    out = [{"id": f"{i:04d}", "image": f"images/{name}", "conversations": [
        {"from": "human", "value": "<image>\nWhat is in this picture?"},
        {"from": "gpt", "value": f"A {fg} {shape} on a {bg} background."}]}
        for i, (name, shape, fg, bg) in enumerate(images)]
    out.append({"id": f"{len(images):04d}", "conversations": [
        {"from": "human", "value": "How many sides does a triangle have?"}, {"from": "gpt", "value": "Three."}]})
    return out


def main(out: Path) -> None:
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    plan = [("red_circle.png", "circle", "red", "blue"), ("green_square.png", "square", "green", "yellow"),
            ("yellow_triangle.png", "triangle", "yellow", "green"), ("blue_circle.png", "circle", "blue", "red")]
    for name, shape, fg, bg in plan:
        draw(shape, fg, bg).save(out / "images" / name, optimize=True)
    write_video(out / "videos" / "moving_square.mp4")
    with open(out / "train.jsonl", "w") as fh:
        for rec in records(plan):
            fh.write(json.dumps(rec) + "\n")
    (out / "llava.json").write_text(json.dumps(llava_records(plan), indent=1) + "\n")
    (out / "dataset.yaml").write_text(
        "# Dataset mixture for vlforge (LMMS Engine layout, plus optional weight / max_samples).\n"
        "datasets:\n"
        "  - path: train.jsonl\n"
        "    data_folder: .\n"
        "    data_type: jsonl\n"
        "    weight: 1.0\n")
    (out / "data.yaml").write_text(
        "# A vlforge data config (LMMS Engine key names); load with vlforge.data.load_config.\n"
        "# Relative paths resolve against the directory passed as base_dir (this folder).\n"
        "datasets: dataset.yaml\n"
        "on_error: skip\n"
        "packing: true\n"
        "packing_length: 2048\n"
        "packing_strategy: first_fit\n"
        "filter_overlong: true\n"
        "video_sampling_strategy: fps\n"
        "fps: 2\n"
        "video_max_frames: 16\n"
        "video_max_pixels: 50176\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    main(parser.parse_args().out)
