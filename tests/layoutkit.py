"""The same four conversations in three layouts users hold, for the CLI tests of train and extract: messages JSONL,
LLaVA JSON (beside their PNG files) and LLaVA-OneVision-style parquet with the PNG bytes inside (alone in its folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

QUESTIONS = [("red", (200, 40, 40)), ("green", (40, 170, 60)), ("blue", (40, 70, 210))]


def write_layout_datasets(root: Path) -> dict[str, Path]:
    """Three conversations about an image and one text-only: ``{"messages", "llava", "parquet"}`` -> file."""
    files, alone = root / "files", root / "parquet-only"
    files.mkdir(parents=True)
    alone.mkdir()
    native, llava, rows = [], [], []
    for i, (name, colour) in enumerate(QUESTIONS):
        Image.new("RGB", (56, 56), colour).save(files / f"{name}.png")
        question, answer = f"Which colour is picture {i}?", f"It is {name}."
        native.append({"messages": [
            {"role": "user", "content": [{"type": "image", "image": f"{name}.png"}, {"type": "text", "text": question}]},
            {"role": "assistant", "content": answer}]})
        turns = [{"from": "human", "value": f"<image>{question}"}, {"from": "gpt", "value": answer}]
        llava.append({"id": str(i), "image": f"{name}.png", "conversations": turns})
        rows.append({"id": str(i), "image": {"bytes": (files / f"{name}.png").read_bytes(), "path": f"{name}.png"},
                     "conversations": turns})
    native.append({"messages": [{"role": "user", "content": "Name a shape."}, {"role": "assistant", "content": "A circle."}]})
    text = [{"from": "human", "value": "Name a shape."}, {"from": "gpt", "value": "A circle."}]
    llava.append({"id": "3", "conversations": text})
    rows.append({"id": "3", "image": None, "conversations": text})
    (files / "messages.jsonl").write_text("".join(json.dumps(r) + "\n" for r in native))
    (files / "llava.json").write_text(json.dumps(llava))
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("id", pa.string()), ("image", image),
                        ("conversations", pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())])))])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), alone / "onevision.parquet")
    return {"messages": files / "messages.jsonl", "llava": files / "llava.json", "parquet": alone / "onevision.parquet"}
