"""Helpers for the extract tests: deterministic images, chat records, JSONL files and data configs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image


def write_images(folder: Path, n: int, size: int = 64, seed: int = 0) -> list[str]:
    """``n`` random RGB PNGs (deterministic) under ``folder/images``; returns their relative paths."""
    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(n):
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / "images" / f"img{i:03d}.png")
        names.append(f"images/img{i:03d}.png")
    return names


def image_record(path: str, text: str = "Describe the picture.", **extra) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image", "image": path}, {"type": "text", "text": text}]},
                         {"role": "assistant", "content": "A picture."}], **extra}


def text_record(text: str, answer: str = "Fine.") -> dict:
    return {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]}


def write_jsonl(path: Path, records: list) -> Path:
    """Records are dicts (JSON-encoded) or raw strings written as they are (for malformed lines)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def write_config(folder: Path, dataset: str, **extra) -> Path:
    """A data config YAML over ``dataset`` with small images (64x64 px stay 64x64: 4 merged tokens each)."""
    lines = [f"datasets: [{{path: {dataset}}}]", "max_pixels: 16384", *(f"{k}: {v}" for k, v in extra.items())]
    path = folder / f"{Path(dataset).stem}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def cache_files(root: Path) -> dict[str, bytes]:
    """Every file of a cache directory by relative path -> its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
