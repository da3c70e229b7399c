"""`vlforge train` at the device's limit, beside stock ``transformers.Trainer`` and LMMS Engine, as one JSON record.

For each data kind (``text``: chats of heavy-tailed length; ``image``: one image of 448-1280 px per chat at
``--size real``; ``video``: one MP4 per chat) the script generates a dataset and trains on it:

- ``vlforge``: the trainer of ``vlforge train`` itself (:class:`vlforge.train.trainer.Trainer`: its config, data
  pipeline with packing, loss, optimizer), once per lever variant (:data:`VARIANTS`: eager, regional compile, Liger
  kernels, both, selective and full activation checkpointing, compile around selective, bfloat16 optimizer
  states). Its own step (``_draw`` -> ``_step_totals`` -> ``train_step``) runs ``warmup`` steps, then ``steps``
  timed steps, then ``profile`` steps under ``torch.profiler`` (CUDA only: the share of the wall time no kernel
  ran, and the top kernels). No checkpoint or export is written.
- ``transformers.Trainer``: stock Trainer (sdpa, right-padded batches of the same processed samples, bf16 autocast
  on CUDA, its default fused AdamW) for the same number of steps, each batch as many samples as fit a packed row
  when padded to the longest sample of the set (the same budget of computed tokens per step).
- ``lmms-engine``: LMMS Engine 0.1.4's own trainer (``benchmarks/peers/lmms_train.py``, its hf_trainer, fp32, CPU
  shims) where its venv was built (``scripts/peer_env.py``) and the device is a CPU; otherwise a record saying why
  it did not run.

Each run reports ``tokens_per_s`` (real tokens, padding excluded), ``mfu_vlforge`` (vlforge's counting: 6 x text
decoder + lm_head parameters per token, causal attention per sample ``6 x layers x width x sum(s^2)``, and the vision
tower as its own term ``vision_flops``: 6 x tower parameters per patch + full attention per image or frame),
``mfu_lmms`` (LMMS Engine 0.1.4's FlopsCounter convention: ``6 x (layers x (attention + MLP) + 2 x vocab x hidden)``
per token and ``12 x sum(row_len^2) x heads x head_dim x layers``, rows as its attention mask counts them, no
tower), ``peak_memory_bytes`` (CUDA allocator, from the first timed step) and ``gpu_idle_share``. MFU is against the
device's dense bf16 peak (``gpu_suite.PEAK_BF16_TFLOPS``); on a CPU it and the idle share are null with the reason.

Run:
    .venv/bin/python benchmarks/train_gpu.py --size tiny                   # CPU: every path, about a minute
    python benchmarks/train_gpu.py --size real --out benchmarks/records/train_gpu_h200.json   # one GPU
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import logging
import math
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "scripts"))

from gpu_suite import environment, peak_tflops  # noqa: E402

SIZES: dict[str, dict[str, Any]] = {
    # model, packed row tokens, warm-up / timed / profiled steps, image sides (px), video frames / side / fps,
    # processor pixel bounds, DataLoader workers on CUDA
    "tiny": {"model": "tiny:qwen3_vl", "row": 256, "warmup": 1, "steps": 1, "profile": 1, "image": (48, 96),
             "video": (8, 48, 4), "max_pixels": 96 * 96, "workers": 0},
    "real": {"model": "real:qwen3_vl_2b", "row": 8192, "warmup": 2, "steps": 4, "profile": 2, "image": (448, 1280),
             "video": (32, 448, 8), "max_pixels": 1280 * 1280, "workers": 4},
}
VARIANTS: dict[str, dict[str, Any]] = {
    "eager": {},
    "compile": {"model.compile": True},
    "liger": {"use_liger_kernel": True},
    "compile+liger": {"model.compile": True, "use_liger_kernel": True},
    "selective": {"model.activation_checkpointing": "selective"},
    "full": {"model.activation_checkpointing": "full"},
    "compile+selective": {"model.compile": True, "model.activation_checkpointing": "selective"},
    "bf16_states": {"training.optimizer_state_dtype": "bfloat16"},
    # what real:qwen3_vl_8b needs on one 141 GB GPU (vlforge plan): run it with --model real:qwen3_vl_8b
    "selective+bf16_states": {"model.activation_checkpointing": "selective", "training.optimizer_state_dtype": "bfloat16"},
}
DATA_KINDS = ("text", "image", "video")
WORDS = ("red", "blue", "circle", "square", "small", "large", "left", "right", "above", "below", "shape", "colour",
         "the", "picture", "shows", "a", "near", "far", "bright", "dark")


# ---- data ---------------------------------------------------------------------------------------------------------
def _reply(rng: random.Random) -> str:
    words = int(4 + rng.paretovariate(1.3) * 12) % 400
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def make_data(kind: str, folder: Path, tokens: int, size: dict[str, Any], seed: int = 0) -> Path:
    """A chat JSONL of ``kind`` rows holding at least ``tokens`` tokens (estimated), media files beside it."""
    import av
    import numpy as np
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines, total, i = [], 0, 0
    low, high = size["image"]
    frames, side, rate = size["video"]
    while total < tokens:
        reply = _reply(rng)
        content: list[dict[str, Any]] = [{"type": "text", "text": f"Question {i}: what do you see?"}]
        total += 12 + len(reply.split()) * 1.3
        if kind == "image":
            w, h = (rng.randrange(low, high + 1) // 32 * 32 for _ in range(2))
            image = Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3)))
            ImageDraw.Draw(image).ellipse((w // 5, h // 5, 4 * w // 5, 4 * h // 5),
                                          fill=tuple(rng.randrange(256) for _ in range(3)))
            image.save(folder / f"{i}.png")
            content.insert(0, {"type": "image", "image": f"{i}.png"})
            total += (w // 32) * (h // 32)
        elif kind == "video":
            path = folder / f"{i}.mp4"
            with av.open(str(path), "w") as container:
                stream = container.add_stream("mpeg4", rate=rate)
                stream.width = stream.height = side
                stream.pix_fmt = "yuv420p"
                for f in range(frames):
                    pixels = np.full((side, side, 3), (20 + 7 * i % 200, 60, 120), np.uint8)
                    x = f * (side - side // 4) // frames
                    pixels[side // 3: side // 3 + side // 4, x: x + side // 4] = (250, 220, 0)
                    for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                        container.mux(packet)
                for packet in stream.encode():
                    container.mux(packet)
            content.insert(0, {"type": "video", "video": f"{i}.mp4"})
            total += (frames / rate * 2 / 2) * (side // 32) ** 2
        lines.append(json.dumps({"messages": [{"role": "user", "content": content},
                                              {"role": "assistant", "content": reply}]}))
        i += 1
    path = folder / "data.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---- FLOPs ----------------------------------------------------------------------------------------------------------
def _batch_stats(batch: dict[str, Any], merge: int) -> dict[str, Any]:
    """Real tokens, per-sample lengths, the rows' lengths (LMMS's attention-mask sums), labels and vision patches."""
    from vlforge.train.loss import label_count

    if "cu_seqlens" in batch:
        cu = batch["cu_seqlens"].tolist()
        samples = [b - a for a, b in itertools.pairwise(cu)]
        rows = [int(batch["input_ids"].shape[1])]
    else:
        rows = batch["attention_mask"].sum(dim=1).tolist()
        samples = list(rows)
    frames = []  # patches of each attention unit of the tower: an image, or one frame of a video
    for key in ("image_grid_thw", "video_grid_thw"):
        grid = batch.get(key)
        if grid is not None:
            for t, h, w in grid.tolist():
                frames += [h * w] * t
    return {"tokens": sum(rows), "samples": samples, "rows": rows, "labels": int(label_count(batch)),
            "patch_units": frames}


def flops(model_config: Any, vision_params: int, text_params: int, head_params: int,
          stats: list[dict[str, Any]]) -> dict[str, float]:
    """FLOPs of forward + backward over ``stats`` (batches): vlforge's counting (text, vision) and LMMS Engine's."""
    text = model_config.get_text_config()
    heads, layers = text.num_attention_heads, text.num_hidden_layers
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    tokens = sum(s["tokens"] for s in stats)
    square = sum(n * n for s in stats for n in s["samples"])
    text_flops = 6.0 * (text_params + head_params) * tokens + 6.0 * layers * heads * head_dim * square
    vision = getattr(model_config, "vision_config", None)
    patches = sum(sum(s["patch_units"]) for s in stats)
    vision_flops = 0.0
    if vision is not None and patches:
        width = getattr(vision, "embed_dim", None) or vision.hidden_size
        depth = getattr(vision, "depth", None) or vision.num_hidden_layers
        unit_square = sum(p * p for s in stats for p in s["patch_units"])
        vision_flops = 6.0 * vision_params * patches + 12.0 * depth * width * unit_square
    # LMMS Engine 0.1.4 (lmms_engine/models/utils.py, FlopsCounter._estimate_qwen2_flops), its formula in our code
    kv = getattr(text, "num_key_value_heads", heads)
    attn_linear = text.hidden_size * (heads * head_dim + 2 * kv * head_dim + heads * head_dim)
    dense = (3 * text.hidden_size * text.intermediate_size + attn_linear) * layers + 2 * text.vocab_size * text.hidden_size
    row_square = sum(n * n for s in stats for n in s["rows"])
    lmms = 6.0 * dense * tokens + 12.0 * row_square * head_dim * heads * layers
    return {"text": text_flops, "vision": vision_flops, "vlforge": text_flops + vision_flops, "lmms": lmms,
            "tokens": tokens, "patches": patches}


def model_params(model: torch.nn.Module) -> tuple[int, int, int]:
    """(vision tower, text decoder without the embedding table, lm_head) parameters."""
    seen: set[int] = set()

    def count(params: Any) -> int:
        total = 0
        for p in params:
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
        return total

    inner = model.get_decoder()
    table = {id(p) for p in model.get_input_embeddings().parameters()}
    head = sum(p.numel() for p in model.get_output_embeddings().parameters())  # a tied head still multiplies
    visual = next((m for n, m in model.named_modules() if n.split(".")[-1] in ("visual", "vision_tower")), None)
    vision = count(visual.parameters()) if visual is not None else 0
    text = sum(p.numel() for p in inner.parameters() if id(p) not in table and id(p) not in seen)
    return vision, text, head


# ---- measurement helpers ----------------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _union_busy(intervals: list[tuple[float, float]]) -> float:
    busy, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        busy += b - max(a, end)
        end = b
    return busy


def profiled(device: torch.device, steps: Callable[[], None]) -> dict[str, Any]:
    """GPU idle share and the top kernels over ``steps()`` (CUDA); null with the reason elsewhere."""
    if device.type != "cuda":
        steps()
        return {"gpu_idle_share": None, "gpu_idle_reason": f"no CUDA device ({device.type}): no kernel timeline"}
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        begin = time.perf_counter()
        steps()
        sync(device)
        wall = time.perf_counter() - begin
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy = _union_busy([(e.time_range.start, e.time_range.end) for e in kernels]) / 1e6
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=12)
    return {"gpu_idle_share": round(max(0.0, 1 - busy / wall), 4), "profiled_seconds": round(wall, 4),
            "kernel_seconds": round(busy, 4), "top_kernels": table.splitlines()}


def _peak_memory(device: torch.device) -> tuple[int | None, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    return None, f"no per-run allocator peak on {device.type}"


# ---- vlforge ----------------------------------------------------------------------------------------------------------
def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value


def vlforge_config(data: Path, size: dict[str, Any], device: torch.device, out: Path, variant: str,
                   steps: int) -> dict[str, Any]:
    cuda = device.type == "cuda"
    cfg: dict[str, Any] = {
        "data": {"datasets": [{"path": str(data), "data_folder": str(data.parent)}], "shuffle": False},
        "processor": {"min_pixels": 32 * 32, "max_pixels": size["max_pixels"]},
        "packing": {"packing": True, "packing_length": size["row"], "filter_overlong": True},
        "video": {"fps": 2.0, "video_max_frames": size["video"][0], "video_max_pixels": size["video"][1] ** 2},
        "model": {"load_from_pretrained_path": size["model"], "token_audit": False, "memory_plan": False},
        "training": {"max_steps": steps, "learning_rate": 1e-5, "lr_scheduler_type": "constant", "seed": 0,
                     "bf16": cuda, "use_cpu": not cuda},
        "logging": {"logging_steps": steps},
        "checkpointing": {"output_dir": str(out), "resume": "none"},
        "dataloader_num_workers": size["workers"] if cuda else 0,
        "dataloader_pin_memory": cuda,
    }
    for key, value in VARIANTS[variant].items():
        _set(cfg, key, value)
    return cfg


def run_vlforge(data: Path, kind: str, variant: str, size: dict[str, Any], device: torch.device,
                work: Path) -> dict[str, Any]:
    from vlforge.config.schema import TrainConfig
    from vlforge.train.liger import is_liger
    from vlforge.train.trainer import Trainer, global_label_count

    warm, timed = size["warmup"], size["steps"]
    prof = size["profile"] if device.type == "cuda" else 0  # the profile measures kernels: none on a CPU
    cfg = TrainConfig.model_validate(vlforge_config(data, size, device, work / f"out-{kind}-{variant}", variant,
                                                    warm + timed + prof))
    begin = time.perf_counter()
    trainer = Trainer(cfg, progress=False, export=False, base_dir=str(data.parent))
    try:
        trainer.setup()
        setup_seconds = time.perf_counter() - begin
        model = trainer.model
        merge = getattr(getattr(model.config, "vision_config", None), "spatial_merge_size", 2)
        stats: list[list[dict[str, Any]]] = []
        losses: list[float] = []

        def step() -> None:
            batches = trainer._draw()
            if batches is None:
                raise RuntimeError(f"{kind} data ran out after {len(stats)} steps; generate more")
            count = global_label_count(trainer.ctx, batches, trainer._label_count)  # the step's one all-reduce
            _, loss_sum, _ = trainer.train_step(batches, count)
            stop = trainer.guard.settle()  # the step guard's verdicts, read where the loop reads them
            if stop is not None:
                raise stop
            stats.append([_batch_stats(b, merge) for b in batches])
            losses.append(loss_sum / count.clamp(min=1))

        warm_begin = time.perf_counter()
        for _ in range(warm):
            step()
        sync(device)
        warm_seconds = time.perf_counter() - warm_begin
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        begin = time.perf_counter()
        for _ in range(timed):
            step()
        sync(device)
        seconds = time.perf_counter() - begin
        peak, peak_kind = _peak_memory(device)
        profile = profiled(device, lambda: [step() for _ in range(prof)])
        vision, text, head = model_params(model)
        counted = flops(model.config, vision, text, head, [s for batch in stats[warm:warm + timed] for s in batch])
        from vlforge.models.blocks import compiled_graphs

        applied = {"compile": bool(cfg.model.compile),
                   "compiled_graphs_so_far": compiled_graphs() if cfg.model.compile else 0, "liger": any(is_liger(m) for m in model.modules()),
                   "checkpointing": cfg.model.checkpointing(),
            "optimizer_state_dtype": cfg.training.optimizer_state_dtype}
        return _record("vlforge", kind, size["model"], variant, counted, seconds, device, peak, peak_kind,
                       {**profile, "levers_applied": applied, "setup_seconds": round(setup_seconds, 2),
                        "warmup_seconds": round(warm_seconds, 2),
                        "losses": [round(float(v), 6) for v in losses],
                        "rows_per_step": len(stats[warm])})
    finally:
        if trainer.stream is not None:
            trainer.stream.close()
        trainer.ctx.close()


def _record(engine: str, kind: str, model: str, variant: str, counted: dict[str, float], seconds: float,
            device: torch.device, peak: int | None, peak_kind: str, extra: dict[str, Any]) -> dict[str, Any]:
    tflops, reason = peak_tflops(device)
    per_second = 1 / seconds

    def mfu(value: float) -> float | None:
        return round(value * per_second / (tflops * 1e12), 4) if tflops else None

    return {"engine": engine, "data": kind, "model": model, "variant": variant,
            "tokens_per_s": round(counted["tokens"] * per_second, 1), "timed_seconds": round(seconds, 4),
            "tokens": int(counted["tokens"]), "vision_patches": int(counted["patches"]),
            "mfu_vlforge": mfu(counted["vlforge"]), "mfu_lmms": mfu(counted["lmms"]),
            "mfu_reason": None if tflops else reason, "peak_tflops": tflops,
            "flops": {"text": counted["text"], "vision": counted["vision"], "lmms": counted["lmms"]},
            "vision_flops_share": round(counted["vision"] / counted["vlforge"], 4) if counted["vlforge"] else 0.0,
            "peak_memory_bytes": peak, "peak_memory_kind": peak_kind, **extra}


# ---- transformers.Trainer ---------------------------------------------------------------------------------------------
def run_hf_trainer(data: Path, kind: str, size: dict[str, Any], device: torch.device, work: Path) -> dict[str, Any]:
    """Stock Trainer over vlforge's processed samples in right-padded batches of about a packed row's tokens."""
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    from train_throughput import SampleDataset, padding_collator
    from vlforge.data import DataConfig, DataStream, build_processor
    from vlforge.models import load

    cuda = device.type == "cuda"
    loaded = load(size["model"], dtype="float32", attn_implementation="sdpa")
    cfg = DataConfig(datasets=[{"path": str(data), "data_folder": str(data.parent)}], epochs=1, packing=False,
                     batch_size=1, min_pixels=32 * 32, max_pixels=size["max_pixels"], filter_overlong=False,
                     video_max_frames=size["video"][0], video_max_pixels=size["video"][1] ** 2, fps=2.0)
    processor = build_processor(cfg, loaded.tokenizer, loaded.family, image_processor=loaded.processor.image_processor)
    stream = DataStream(cfg, processor)
    samples: list[Any] = []
    collate = stream._collate

    def keep(group: list[Any]) -> dict[str, Any]:
        samples.extend(pending.sample for pending in group)
        return collate(group)

    stream._collate = keep
    for _ in stream:
        pass
    stream.close()
    # the same per-step budget of computed tokens as a packed row: the batch padded to its longest sample fits the row
    batch = max(1, size["row"] // max(len(s) for s in samples))
    warm, timed = size["warmup"], size["steps"]
    needed = batch * (warm + timed)
    if len(samples) < needed:
        raise RuntimeError(f"{kind}: {len(samples)} samples, the Trainer needs {needed}")
    samples = samples[:needed]
    merge = getattr(getattr(loaded.model.config, "vision_config", None), "spatial_merge_size", 2)
    pad = padding_collator(stream.pad_token_id)
    stats = [_batch_stats(pad(samples[i:i + batch]), merge)
             for i in range(batch * warm, needed, batch)]
    marks: dict[str, Any] = {"times": []}

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == warm:
                sync(device)
                if cuda:
                    torch.cuda.reset_peak_memory_stats(device)
                marks["begin"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == warm + timed:
                sync(device)
                marks["end"] = time.perf_counter()

    args = TrainingArguments(
        output_dir=str(work / f"hf-{kind}"), per_device_train_batch_size=batch, max_steps=warm + timed,
        learning_rate=1e-5, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, save_strategy="no",
        report_to=[], use_cpu=not cuda, bf16=cuda, train_sampling_strategy="sequential", remove_unused_columns=False,
        dataloader_pin_memory=cuda, disable_tqdm=True, seed=0, gradient_checkpointing=False)
    trainer = Trainer(model=loaded.model.train(), args=args, train_dataset=SampleDataset(samples),
                      data_collator=pad, callbacks=[Clock()])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    losses = [round(r["loss"], 6) for r in trainer.state.log_history if "loss" in r]
    vision, text, head = model_params(loaded.model)
    counted = flops(loaded.model.config, vision, text, head, stats)
    peak, peak_kind = _peak_memory(device)
    computed = sum(batch * max(s["rows"]) for s in stats)
    return _record("transformers.Trainer", kind, size["model"], f"padded batches of {batch}, sdpa",
                   counted, marks["end"] - marks["begin"], device, peak, peak_kind,
                   {"padding_efficiency": round(counted["tokens"] / computed, 4), "losses": losses,
                    "optim": str(args.optim), "bf16": cuda, "gpu_idle_share": None,
                    "gpu_idle_reason": "not profiled (the Trainer's loop is its own)"})


# ---- LMMS Engine --------------------------------------------------------------------------------------------------------
def run_lmms(data: Path, kind: str, size: dict[str, Any], device: torch.device, work: Path) -> dict[str, Any]:
    from peer_env import peer_python

    base = {"engine": "lmms-engine", "data": kind, "model": size["model"], "variant": "hf_trainer, padded, fp32",
            "tokens_per_s": None, "mfu_vlforge": None, "mfu_lmms": None, "peak_memory_bytes": None}
    python = peer_python()
    if python is None:
        return {**base, "skipped": "LMMS Engine's venv is not built on this host (scripts/peer_env.py build; on a "
                                   "GPU host its wheels must be carried there)"}
    if device.type != "cpu":
        return {**base, "skipped": "benchmarks/peers/lmms_train.py runs LMMS Engine's trainer on the CPU only"}
    from vlforge.models import load

    checkpoint = work / "lmms-checkpoint"
    if not checkpoint.exists():
        loaded = load(size["model"], dtype="float32")
        loaded.model.save_pretrained(checkpoint)
        loaded.processor.save_pretrained(checkpoint)
    family = load(size["model"], dtype="float32", processor=False).family
    steps = min(10, size["warmup"] + size["steps"])
    cmd = [str(python), str(HERE / "peers" / "lmms_train.py"), "--checkpoint", str(checkpoint), "--family", family,
           "--data", str(data), "--steps", str(steps), "--max-pixels", str(size["max_pixels"]),
           "--max-frames", str(size["video"][0])]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        return {**base, "skipped": f"LMMS Engine's trainer failed: {lines[-1].strip()}"}
    out = json.loads(done.stdout)
    return {**base, "tokens_per_s": out.get("tokens_per_s"), "losses": out.get("losses"),
            "mfu_reason": "CPU: no peak figure", "shims": out.get("shims"), "lmms_version": out.get("version")}


# ---- main ----------------------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--model", default=None, help="preset to train (default: the size's)")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda")
    parser.add_argument("--data", default=",".join(DATA_KINDS), help=f"comma list of {', '.join(DATA_KINDS)}")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma list of {', '.join(VARIANTS)} (each data kind)")
    parser.add_argument("--variants-media", default=None,
                        help="variants for image and video data (default: --variants); saves device time")
    parser.add_argument("--peers", default="trainer,lmms", help="comma list of trainer, lmms (or none)")
    parser.add_argument("--peer-data", default=None, help="data kinds the peers run on (default: --data)")
    parser.add_argument("--out", type=Path, default=None, help="also write the record to this file")
    parser.add_argument("--budget-seconds", type=float, default=None,
                        help="stop starting new runs after this many seconds (the record says which were left)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    size = dict(SIZES[args.size])
    if args.model:
        size["model"] = args.model
    kinds = [k for k in args.data.split(",") if k]
    variants = [v for v in args.variants.split(",") if v]
    media = [v for v in (args.variants_media or args.variants).split(",") if v]
    peers = [] if args.peers == "none" else [p for p in args.peers.split(",") if p]
    peer_kinds = [k for k in (args.peer_data or args.data).split(",") if k]
    for name, known, given in (("--data", DATA_KINDS, kinds + peer_kinds), ("--variants", VARIANTS, variants + media),
                               ("--peers", ("trainer", "lmms"), peers)):
        if unknown := sorted(set(given) - set(known)):
            parser.error(f"{name}: unknown {unknown}; choose from {', '.join(known)}")
    started = time.perf_counter()
    record: dict[str, Any] = {"benchmark": "train_gpu", "size": args.size, "model": size["model"],
                              "device": str(device), "environment": environment(device),
                              "settings": {k: v for k, v in size.items() if k != "model"},
                              "conventions": {
                                  "mfu_vlforge": "6 x (text decoder without embedding + lm_head) params per token + "
                                                 "6 x layers x heads x head_dim x sum(sample_len^2) (causal) + vision "
                                                 "tower: 6 x tower params per patch + 12 x depth x width x "
                                                 "sum(patches_per_image_or_frame^2)",
                                  "mfu_lmms": "LMMS Engine 0.1.4 FlopsCounter: 6 x (layers x (3 H I + H (q+k+v+o)) "
                                              "+ 2 V H) per token + 12 x sum(row_len^2) x head_dim x heads x layers"},
                              "runs": [], "not_run": []}
    with tempfile.TemporaryDirectory(prefix="vlforge-train-gpu-") as tmp:
        work = Path(tmp)
        need = int(size["row"] * (size["warmup"] + size["steps"] + size["profile"]) * 1.6)
        data = {kind: make_data(kind, work / kind, need, size) for kind in kinds}
        # the comparisons first (eager and the peers on every kind), then the other variants: a budget cut keeps them
        first: list[tuple[str, Callable[[], dict[str, Any]]]] = []
        later: list[tuple[str, Callable[[], dict[str, Any]]]] = []
        for kind in kinds:
            for v in (variants if kind == "text" else media):
                job = (f"vlforge/{kind}/{v}", lambda v=v, k=kind: run_vlforge(data[k], k, v, size, device, work))
                (first if v == "eager" else later).append(job)
            if "trainer" in peers and kind in peer_kinds:
                first.append((f"transformers.Trainer/{kind}",
                              lambda k=kind: run_hf_trainer(data[k], k, size, device, work)))
            if "lmms" in peers and kind in peer_kinds:
                first.append((f"lmms-engine/{kind}", lambda k=kind: run_lmms(data[k], k, size, device, work)))
        for name, job in first + later:
            kind = name.split("/")[1]
            if args.budget_seconds and time.perf_counter() - started > args.budget_seconds:
                record["not_run"].append({"run": name, "reason": "--budget-seconds spent"})
                continue
            begin = time.perf_counter()
            try:
                entry = job()
            except Exception as error:  # one run's failure must not lose the others' measurements
                logging.exception("run %s failed", name)
                entry = {"engine": name.split("/")[0], "data": kind, "model": size["model"],
                         "variant": name.split("/")[-1], "error": f"{type(error).__name__}: {error}"}
            entry["run_seconds"] = round(time.perf_counter() - begin, 2)
            record["runs"].append(entry)
            if args.out:  # after every run: a run stopped from outside keeps what was measured
                _write(args.out, {**record, "partial": True})
            if "compile" in name:
                with contextlib.suppress(Exception):
                    torch._dynamo.reset()  # the next compiled run starts from the same state
    record["ratios"] = ratios(record["runs"])
    record["total_seconds"] = round(time.perf_counter() - started, 2)
    record["utc_end"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    print(json.dumps(record, indent=2))
    if args.out:
        _write(args.out, record)
    if any("error" in r for r in record["runs"]):
        sys.exit("train_gpu: run(s) failed: " + ", ".join(f"{r['engine']}/{r['data']}/{r['variant']}"
                                                          for r in record["runs"] if "error" in r))


def _write(path: Path, record: dict[str, Any]) -> None:
    from vlforge.outputs import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")


def ratios(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per data kind: the best vlforge variant's tokens/s over the Trainer's and each variant over eager."""
    out: dict[str, Any] = {}
    for kind in DATA_KINDS:
        mine = [r for r in runs if r.get("engine") == "vlforge" and r["data"] == kind and r.get("tokens_per_s")]
        hf = next((r for r in runs if r.get("engine") == "transformers.Trainer" and r["data"] == kind
                   and r.get("tokens_per_s")), None)
        if not mine:
            continue
        eager = next((r for r in mine if r["variant"] == "eager"), None)
        best = max(mine, key=lambda r: r["tokens_per_s"])
        entry: dict[str, Any] = {"best_variant": best["variant"]}
        if hf:
            entry["best_vs_trainer"] = round(best["tokens_per_s"] / hf["tokens_per_s"], 3)
        if eager:
            entry["vs_eager"] = {r["variant"]: round(r["tokens_per_s"] / eager["tokens_per_s"], 3) for r in mine}
        out[kind] = entry
    return out


if __name__ == "__main__":
    main()
