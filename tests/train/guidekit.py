"""A small parquet dataset shaped like LMMS Engine users' data, for running the guide YAMLs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image


def _png(path: Path, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(path)
    return path.read_bytes()


def write_parquet_dataset(folder: Path, rows: int = 6) -> Path:
    """A parquet file as LMMS Engine users have them: ``messages`` as a JSON string, images as files
    next to it (OpenAI-style parts) or as PNG bytes in an ``images`` column (``<image>`` placeholders),
    a system prompt and two assistant turns."""
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(rows):
        png = _png(folder / f"picture{i}.png", seed=i)
        system = {"role": "system", "content": "You describe pictures in one short sentence."}
        if i % 2:
            first = {"role": "user", "content": [{"type": "image", "image": f"picture{i}.png"},
                                                  {"type": "text", "text": f"What is in picture {i}?"}]}
            images = None
        else:
            first = {"role": "user", "content": f"<image>What is in picture {i}?"}
            images = [png]
        messages = [system, first, {"role": "assistant", "content": f"Coloured noise, sample {i}."},
                    {"role": "user", "content": "And its size?"},
                    {"role": "assistant", "content": "Sixty-four by forty-eight pixels."}]
        records.append({"messages": json.dumps(messages), "images": images})
    path = folder / "train.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)
    return path
