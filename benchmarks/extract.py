"""Benchmark ``vlforge extract`` against a plain per-sample loop on the same tiny model and images.

The plain loop is what the seed write-up ran before vlforge: for every sample, the Hugging Face
processor, one forward of the stock (Conv3d) model with ``output_hidden_states``, the mean of the last
hidden state, and ``torch.save`` into its own ``.pt`` file. A second variant of it skips the
``lm_head`` (calls the backbone ``model.model``), to show how much of the gap is batching + the patched
conv + shards rather than the skipped vocabulary projection. vlforge runs ``run_extract`` (guard, patch,
hashing, batched forwards, DataLoader workers, shard files, manifest) on its own fresh copy of the model;
model loading is outside every timing. Each variant first runs once on 4 samples (warm-up, untimed).
The script generates its images (``--images``, default 64, ``--size`` px, deterministic) in a temp dir.
Every number printed is measured here; nothing is estimated.

Run:
    .venv/bin/python benchmarks/extract.py                       # 64 images, batch 16, 1 worker
    .venv/bin/python benchmarks/extract.py --images 128 --batch-size 32 --threads 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw


def make_images(folder: Path, n: int, size: int) -> Path:
    """``n`` deterministic pictures (a coloured shape on a noisy background) and a chat JSONL over them."""
    rng = np.random.default_rng(0)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        background = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        image = Image.fromarray(background)
        draw = ImageDraw.Draw(image)
        box = sorted(rng.integers(0, size, 2).tolist()), sorted(rng.integers(0, size, 2).tolist())
        draw.ellipse([box[0][0], box[1][0], box[0][1] + 1, box[1][1] + 1], fill=tuple(rng.integers(0, 256, 3).tolist()))
        image.save(folder / "images" / f"{i:04d}.png")
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": [{"type": "image", "image": f"images/{i:04d}.png"},
                                         {"type": "text", "text": f"Describe picture {i}."}]},
            {"role": "assistant", "content": "A shape on a noisy background."}]}))
    data = folder / "bench.jsonl"
    data.write_text("\n".join(lines) + "\n")
    return data


def plain_loop(loaded, data: Path, out: Path, limit: int | None, backbone: bool) -> int:
    """The per-sample script: HF processor, one forward, mean of the last hidden state, torch.save."""
    out.mkdir(parents=True, exist_ok=True)
    processor, model = loaded.processor, loaded.model
    records = [json.loads(line) for line in data.read_text().splitlines()][:limit]
    for i, record in enumerate(records):
        user = record["messages"][0]["content"]
        image = Image.open(data.parent / user[0]["image"]).convert("RGB")
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": user[1]["text"]}]},
                    {"role": "assistant", "content": [{"type": "text", "text": record["messages"][1]["content"]}]}]
        text = processor.apply_chat_template(messages, tokenize=False)
        inputs = processor(text=[text], images=[image], return_tensors="pt")
        with torch.no_grad():
            if backbone:
                hidden = model.model(**inputs, use_cache=False).last_hidden_state
            else:
                hidden = model(**inputs, output_hidden_states=True, use_cache=False).hidden_states[-1]
        torch.save({"hidden_mean": hidden[0].mean(0)}, out / f"{i:05d}.pt")
    return len(records)


def timed(fn) -> tuple[float, int]:
    start = time.perf_counter()
    n = fn()
    return time.perf_counter() - start, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny:qwen3_vl")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--size", type=int, default=448, help="image side in px (448: 196 merged tokens each)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads for every variant")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)

    from vlforge.extract import open_cache, run_extract
    from vlforge.models import load

    root = Path(tempfile.mkdtemp(prefix="vlforge-bench-extract-"))
    data = make_images(root, args.images, args.size)
    warm = make_images(root / "warm", 4, args.size)

    results: dict[str, dict[str, float]] = {}
    for name, backbone in (("plain_loop", False), ("plain_loop_backbone", True)):
        stock = load(args.model)
        plain_loop(stock, warm, root / f"{name}-warm", None, backbone)
        seconds, n = timed(lambda stock=stock, backbone=backbone, name=name:
                           plain_loop(stock, data, root / name, None, backbone))
        results[name] = {"samples": n, "seconds": round(seconds, 3), "samples_per_s": round(n / seconds, 3)}

    fresh = load(args.model)
    options = {"model": args.model, "features": ["hidden_mean"], "batch_size": args.batch_size,
               "shard_size": args.images, "num_workers": args.num_workers, "loaded": fresh}
    run_extract(data=str(warm), out=root / "vlforge-warm", **options)
    seconds, n = timed(lambda: run_extract(data=str(data), out=root / "vlforge", **options).rows_written)
    results["vlforge_extract"] = {"samples": n, "seconds": round(seconds, 3), "samples_per_s": round(n / seconds, 3)}

    # the two agree on what they computed (same hidden_mean up to batching / patch round-off)
    cache = open_cache(root / "vlforge")
    diffs = [float((cache[i]["hidden_mean"][0] - torch.load(root / "plain_loop" / f"{i:05d}.pt",
                                                              weights_only=True)["hidden_mean"]).abs().max())
             for i in range(0, len(cache), max(1, len(cache) // 8))]
    vl = results["vlforge_extract"]["samples_per_s"]
    report = {
        "benchmark": "extract",
        "model": args.model,
        "images": args.images, "image_size": args.size, "batch_size": args.batch_size,
        "num_workers": args.num_workers, "features": ["hidden_mean"],
        "results": results,
        "speedup_vs_plain_loop": round(vl / results["plain_loop"]["samples_per_s"], 3),
        "speedup_vs_plain_loop_backbone": round(vl / results["plain_loop_backbone"]["samples_per_s"], 3),
        "max_abs_diff_hidden_mean_vs_plain": max(diffs),
        "machine": {"torch": torch.__version__, "python": platform.python_version(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(),
                    "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
                    "utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
