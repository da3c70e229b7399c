"""Training throughput of vlforge (packed rows) vs a plain padded-batch loop, same tiny model and data.

Three variants train the tiny random Qwen3-VL (fp32, CPU) on the same variable-length multimodal
samples, each from its own fresh copy of the same weights, same learning rate. The samples are
generated (deterministic): three in four carry an image of 64 to 320 px, replies run from 3 to about
300 words with a heavy tail, as in real SFT sets (the 10 records of ``examples/data/`` are too few
and too alike in length to show padding):

- ``hf_padded``: the baseline. transformers' ``Trainer`` needs ``accelerate``, which is not installed
  here (checked at run time and reported), so the baseline is the loop ``Trainer`` runs: right-padded
  batches of ``--batch-size`` samples, ``model(**batch, labels=labels).loss`` (HF's own shifted loss
  over the full vocabulary), ``backward``, AdamW.
- ``vlforge_padded``: vlforge's step (token-mean loss, logits only at label positions, fused AdamW) on
  the same padded batches: isolates the loss path.
- ``vlforge_packed``: vlforge's step on packed rows of ``--packing-length`` tokens (no padding). The
  default row length holds about as many samples as a padded batch, so both make about the same
  number of optimiser steps (``steps`` in the output) and the comparison is per token, not per step.

Batches are built before timing (data processing is not timed); each variant runs one untimed warm-up
step first, then the variants' steps are interleaved round-robin so load from other processes on a
shared machine hits all of them alike. ``tokens_per_s`` counts real (non-pad) tokens; ``padding_efficiency`` = real / computed
tokens. Every number is measured in this run.

Run:
    .venv/bin/python benchmarks/train_throughput.py                 # about two minutes on 2 cores
    .venv/bin/python benchmarks/train_throughput.py --samples 96 --batch-size 8
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import importlib.util
import json
import logging
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

WORDS = ("red", "blue", "circle", "square", "small", "large", "left", "right", "above", "below", "shape", "colour")


def make_dataset(folder: Path, n: int, seed: int = 0) -> Path:
    """``n`` chats with heavy-tailed lengths: images of 4 sizes (or none) and replies of 3 to ~300 words."""
    import random

    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        words = int(3 + rng.paretovariate(1.2) * 8) % 300
        reply = " ".join(rng.choice(WORDS) for _ in range(words)) + "."
        content: list[dict[str, Any]] = [{"type": "text", "text": "Describe the picture in detail."}]
        if rng.random() < 0.75:
            side = rng.choice((64, 128, 224, 320))
            image = Image.new("RGB", (side, side), tuple(rng.randrange(256) for _ in range(3)))
            ImageDraw.Draw(image).ellipse((side // 4, side // 4, 3 * side // 4, 3 * side // 4), fill=(255, 255, 0))
            image.save(folder / "images" / f"{i}.png")
            content.insert(0, {"type": "image", "image": f"images/{i}.png"})
        lines.append(json.dumps({"messages": [{"role": "user", "content": content},
                                              {"role": "assistant", "content": reply}]}))
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder / "train.jsonl"


def build_batches(data: Path, packing: bool, packing_length: int, args: argparse.Namespace,
                  loaded: Any) -> list[dict[str, Any]]:
    from vlforge.data import DataConfig, DataStream, build_processor

    cfg = DataConfig(datasets=[{"path": str(data)}], epochs=1, packing=packing, packing_length=packing_length,
                     batch_size=args.batch_size, max_pixels=args.max_pixels, filter_overlong=False)
    proc = build_processor(cfg, loaded.tokenizer, loaded.family, image_processor=loaded.processor.image_processor)
    return list(DataStream(cfg, proc))


def real_and_computed(batch: dict[str, Any]) -> tuple[int, int]:
    if "cu_seqlens" in batch:
        return batch["input_ids"].shape[1], batch["input_ids"].shape[1]
    return int(batch["attention_mask"].sum()), batch["input_ids"].numel()


def hf_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, Any]) -> float:
    from vlforge.train.loss import model_inputs

    inputs = model_inputs(batch, "cpu")
    loss = model(**inputs, labels=batch["labels"]).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def vlforge_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, Any]) -> float:
    from vlforge.train.loss import label_count, token_loss_sum

    count = label_count(batch).clamp(min=1)
    loss_sum = token_loss_sum(model, batch, "cpu")
    (loss_sum / count).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss_sum.detach() / count)


def measure(variants: dict[str, tuple[list[dict[str, Any]], Any, bool]], base: torch.nn.Module,
            lr: float) -> dict[str, dict[str, Any]]:
    """Train every variant on its own copy of ``base``, steps interleaved round-robin (fair on shared cores)."""
    runs = {}
    for name, (batches, step, fused) in variants.items():
        model = copy.deepcopy(base).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=fused) if fused else torch.optim.AdamW(
            model.parameters(), lr=lr)
        step(model, optimizer, batches[0])  # warm-up, untimed
        runs[name] = {"model": model, "optimizer": optimizer, "seconds": 0.0, "losses": [], "real": 0, "computed": 0}
    longest = max(len(batches) for batches, _, _ in variants.values())
    for index in range(longest):
        for name, (batches, step, _) in variants.items():
            if index >= len(batches):
                continue
            run = runs[name]
            start = time.perf_counter()
            run["losses"].append(step(run["model"], run["optimizer"], batches[index]))
            run["seconds"] += time.perf_counter() - start
            real, computed = real_and_computed(batches[index])
            run["real"] += real
            run["computed"] += computed
    results = {}
    for name, run in runs.items():
        logging.info("%s: %.1f s, %d steps", name, run["seconds"], len(run["losses"]))
        results[name] = {
            "steps": len(run["losses"]), "seconds": round(run["seconds"], 3), "real_tokens": run["real"],
            "computed_tokens": run["computed"], "tokens_per_s": round(run["real"] / run["seconds"], 1),
            "padding_efficiency": round(run["real"] / run["computed"], 4), "first_loss": round(run["losses"][0], 4),
            "last_loss": round(run["losses"][-1], 4)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny:qwen3_vl")
    parser.add_argument("--samples", type=int, default=48, help="Generated chat records.")
    parser.add_argument("--batch-size", type=int, default=4, help="Samples per padded batch.")
    parser.add_argument("--packing-length", type=int, default=None,
                        help="Tokens per packed row (default: the real tokens of an average padded batch, at least "
                             "the longest sample, so both take about as many optimiser steps).")
    parser.add_argument("--max-pixels", type=int, default=50176)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    from vlforge.models import load

    loaded = load(args.model, dtype="float32", attn_implementation="sdpa")
    base = loaded.model
    with tempfile.TemporaryDirectory() as tmp:
        data = make_dataset(Path(tmp), args.samples)
        padded = build_batches(data, False, 4096, args, loaded)
        longest = max(int(b["attention_mask"].sum(dim=1).max()) for b in padded)
        mean_real = sum(int(b["attention_mask"].sum()) for b in padded) / len(padded)
        packing_length = args.packing_length or max(longest, round(mean_real))
        packed = build_batches(data, True, packing_length, args, loaded)
    accelerate = importlib.util.find_spec("accelerate") is not None
    results = measure({"hf_padded": (padded, hf_step, False), "vlforge_padded": (padded, vlforge_step, True),
                       "vlforge_packed": (packed, vlforge_step, True)}, base, args.lr)
    baseline = results["hf_padded"]["tokens_per_s"]
    report = {
        "benchmark": "train_throughput",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "model": args.model,
        "data": {"records": "generated: 75% with an image of 64-320 px, replies of 3-300 words (heavy tail)",
                 "samples": sum(len(b["sample_ids"]) for b in packed)},
        "baseline": ("plain padded-batch loop with the HF model and its own loss: transformers.Trainer needs "
                     "accelerate, which is " + ("installed but not used" if accelerate else "not installed here")),
        "settings": {"batch_size": args.batch_size, "packing_length": packing_length, "lr": args.lr},
        "results": results,
        "speedup_vs_hf_padded": {k: round(v["tokens_per_s"] / baseline, 3) for k, v in results.items()},
        "speedup_from_packing_alone": round(results["vlforge_packed"]["tokens_per_s"]
                                            / results["vlforge_padded"]["tokens_per_s"], 3),
        "target": {"vlforge_packed_vs_hf_padded": 1.3},
    }
    report["target"]["met"] = report["speedup_vs_hf_padded"]["vlforge_packed"] >= 1.3
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
