"""Training throughput of vlforge (packed rows) vs transformers' ``Trainer`` (padded batches), same tiny model and data.

Four variants train the tiny random Qwen3-VL (fp32, CPU) on the same variable-length multimodal
samples, each from its own fresh copy of the same weights, same learning rate. The samples are
generated (deterministic): three in four carry an image of 64 to 320 px, replies run from 3 to about
300 words with a heavy tail, as in real SFT sets (the 10 records of ``examples/data/`` are too few
and too alike in length to show padding):

- ``hf_trainer``: the baseline. A stock ``transformers.Trainer`` (CPU, ``report_to=[]``, sequential
  sampler, constant lr, no clipping, its default optimiser) over a torch ``Dataset`` of the same
  processed samples with a right-padding collator: the same padded batches of ``--batch-size``
  samples, the model's own loss. Its time per step is taken between ``on_step_begin`` and
  ``on_step_end`` (forward, backward, optimiser and scheduler step; not the collation).
- ``plain_padded_loop``: the same padded batches in a hand-written loop (``model(**batch,
  labels=labels).loss``, ``backward``, AdamW): the Trainer minus its bookkeeping.
- ``vlforge_padded``: vlforge's step (token-mean loss, logits only at label positions, fused AdamW) on
  the same padded batches: isolates the loss path.
- ``vlforge_packed``: vlforge's step on packed rows of ``--packing-length`` tokens (no padding). The
  default row length holds about as many samples as a padded batch, so both make about the same
  number of optimiser steps (``steps`` in the output) and the comparison is per token, not per step.

Batches are built before timing (data processing is not timed); each variant runs one untimed warm-up
step first. The Trainer drives the loop, and after each of its steps a callback runs one step of every
other variant, so load from other processes on a shared machine hits all of them alike.
``tokens_per_s`` counts real (non-pad) tokens; ``padding_efficiency`` = real / computed tokens. Every
number is measured in this run.

Run:
    .venv/bin/python benchmarks/train_throughput.py                 # about three minutes on 2 cores
    .venv/bin/python benchmarks/train_throughput.py --samples 96 --batch-size 8
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import logging
import os
import platform
import sys
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
                  loaded: Any) -> tuple[list[dict[str, Any]], list[list[Any]], int]:
    """(collated batches, the processed samples of each batch, pad token id) of one pass over ``data``."""
    from vlforge.data import DataConfig, DataStream, build_processor

    cfg = DataConfig(datasets=[{"path": str(data)}], epochs=1, packing=packing, packing_length=packing_length,
                     batch_size=args.batch_size, max_pixels=args.max_pixels, filter_overlong=False)
    proc = build_processor(cfg, loaded.tokenizer, loaded.family, image_processor=loaded.processor.image_processor)
    stream = DataStream(cfg, proc)
    groups: list[list[Any]] = []
    collate = stream._collate

    def keep(group: list[Any]) -> dict[str, Any]:
        groups.append([pending.sample for pending in group])
        return collate(group)

    stream._collate = keep
    return list(stream), groups, stream.pad_token_id


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


class SampleDataset(torch.utils.data.Dataset):
    """The processed samples, one item each, for ``transformers.Trainer``."""

    def __init__(self, samples: list[Any]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Any:
        return self.samples[index]


def padding_collator(pad_token_id: int):
    """Right-pad samples into the forward's keyword arguments plus ``labels`` (what Trainer feeds the model)."""
    from vlforge.data.packing import collate_padded
    from vlforge.train.loss import model_inputs

    def collate(samples: list[Any]) -> dict[str, Any]:
        batch = collate_padded(samples, pad_token_id)
        return {**model_inputs(batch, "cpu"), "labels": batch["labels"]}

    return collate


def _new_run(base: torch.nn.Module, lr: float, fused: bool) -> dict[str, Any]:
    model = copy.deepcopy(base).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=fused) if fused else torch.optim.AdamW(
        model.parameters(), lr=lr)
    return {"model": model, "optimizer": optimizer, "seconds": 0.0, "losses": [], "real": 0, "computed": 0}


def _timed(run: dict[str, Any], step: Any, batch: dict[str, Any]) -> None:
    start = time.perf_counter()
    run["losses"].append(step(run["model"], run["optimizer"], batch))
    run["seconds"] += time.perf_counter() - start
    real, computed = real_and_computed(batch)
    run["real"] += real
    run["computed"] += computed


def measure(variants: dict[str, tuple[list[dict[str, Any]], Any, bool]], base: torch.nn.Module, lr: float,
            hf: tuple[list[dict[str, Any]], list[list[Any]], int], batch_size: int,
            workdir: Path) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Train ``transformers.Trainer`` on the padded samples; after each of its steps, one step of each variant."""
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    runs = {}
    for name, (batches, step, fused) in variants.items():
        runs[name] = _new_run(base, lr, fused)
        step(runs[name]["model"], runs[name]["optimizer"], batches[0])  # warm-up, untimed
    batches, groups, pad_token_id = hf
    if any(len(group) != batch_size for group in groups[:-1]) or len(groups[0]) != batch_size:
        raise RuntimeError("padded batches are not consecutive groups of --batch-size samples")
    samples = [sample for group in [groups[0], *groups] for sample in group]  # first batch twice: warm-up
    hf_run = {"seconds": 0.0, "losses": [], "real": 0, "computed": 0}
    position = {"next": 0}

    def others(index: int) -> None:
        for name, (variant_batches, step, _) in variants.items():
            if index < len(variant_batches):
                _timed(runs[name], step, variant_batches[index])

    class Interleave(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            seconds = time.perf_counter() - self.start
            if state.global_step == 1:
                return  # warm-up step on the first batch, untimed
            index = state.global_step - 2
            hf_run["seconds"] += seconds
            real, computed = real_and_computed(batches[index])
            hf_run["real"] += real
            hf_run["computed"] += computed
            others(index)
            position["next"] = index + 1

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs and state.global_step > 1:
                hf_run["losses"].append(float(logs["loss"]))

    model = copy.deepcopy(base).train()
    args = TrainingArguments(
        output_dir=str(workdir / "hf_trainer"), per_device_train_batch_size=batch_size,
        max_steps=len(batches) + 1, learning_rate=lr, weight_decay=0.01, lr_scheduler_type="constant",
        warmup_steps=0, max_grad_norm=0.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        train_sampling_strategy="sequential", remove_unused_columns=False, dataloader_pin_memory=False,
        disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=SampleDataset(samples),
                      data_collator=padding_collator(pad_token_id), callbacks=[Interleave()])
    trainer.remove_callback(PrinterCallback)  # it prints every log dict on stdout, which must stay JSON only
    trainer.train()
    longest = max(len(b) for b, _, _ in variants.values())
    for index in range(position["next"], longest):
        others(index)
    trainer_info = {"transformers": __import__("transformers").__version__, "optim": str(args.optim),
                    "device": str(args.device), "torchvision_imported": "torchvision" in sys.modules}
    results = {}
    for name, run in {"hf_trainer": hf_run, **runs}.items():
        logging.info("%s: %.1f s, %d steps", name, run["seconds"], len(run["losses"]))
        results[name] = {
            "steps": len(run["losses"]), "seconds": round(run["seconds"], 3), "real_tokens": run["real"],
            "computed_tokens": run["computed"], "tokens_per_s": round(run["real"] / run["seconds"], 1),
            "padding_efficiency": round(run["real"] / run["computed"], 4), "first_loss": round(run["losses"][0], 4),
            "last_loss": round(run["losses"][-1], 4)}
    return results, trainer_info


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
    from vlforge.models.families import supports
    from vlforge.models.linear_attention import use_for_packed_rows

    loaded = load(args.model, dtype="float32", attn_implementation="sdpa")
    base = loaded.model
    if supports(loaded.family, "linear_attention"):  # as vlforge train: packed rows restart each sample's state
        use_for_packed_rows(base)  # (batches without boundaries, every variant but vlforge_packed, run stock)
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        data = make_dataset(Path(tmp), args.samples)
        padded, groups, pad_token_id = build_batches(data, False, 4096, args, loaded)
        longest = max(int(b["attention_mask"].sum(dim=1).max()) for b in padded)
        mean_real = sum(int(b["attention_mask"].sum()) for b in padded) / len(padded)
        packing_length = args.packing_length or max(longest, round(mean_real))
        packed, _, _ = build_batches(data, True, packing_length, args, loaded)
        results, trainer_info = measure(
            {"plain_padded_loop": (padded, hf_step, False), "vlforge_padded": (padded, vlforge_step, True),
             "vlforge_packed": (packed, vlforge_step, True)}, base, args.lr, (padded, groups, pad_token_id),
            args.batch_size, Path(tmp))
    baseline = results["hf_trainer"]["tokens_per_s"]
    report = {
        "benchmark": "train_throughput",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "cpus": os.cpu_count(), "load_avg_1_5_15_before": load_before,
                    "load_avg_1_5_15_after": [round(x, 2) for x in os.getloadavg()]},
        "model": args.model,
        "data": {"records": "generated: 75% with an image of 64-320 px, replies of 3-300 words (heavy tail)",
                 "samples": sum(len(b["sample_ids"]) for b in packed)},
        "baseline": "transformers.Trainer on the same samples, right-padded batches, no packing",
        "hf_trainer": trainer_info,
        "settings": {"batch_size": args.batch_size, "packing_length": packing_length, "lr": args.lr},
        "results": results,
        "speedup_vs_hf_trainer": {k: round(v["tokens_per_s"] / baseline, 3) for k, v in results.items()},
        "speedup_from_packing_alone": round(results["vlforge_packed"]["tokens_per_s"]
                                            / results["vlforge_padded"]["tokens_per_s"], 3),
        "target": {"vlforge_packed_vs_hf_trainer": 1.3},
    }
    report["target"]["met"] = report["speedup_vs_hf_trainer"]["vlforge_packed"] >= 1.3
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
