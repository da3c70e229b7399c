"""Run LMMS Engine's own data processor (and the first-step loss on its samples) and print JSON.

Executed by the peer venv's python (``scripts/peer_env.py build``), never by vlforge's: it imports
``lmms_engine`` and the peer's transformers, nothing of vlforge. For every record of a JSONL dataset it
builds the sample with LMMS Engine's dataset class (``vision`` for Qwen2.5-VL, ``qwen3_vl`` for
Qwen3-VL: its video loading, its processor, its labels), then runs the checkpoint's model (fp32, CPU)
and sums the cross-entropy over the shifted labels, as the Hugging Face loss does.

CPU shim (written down in docs/train.md "Parity with LMMS Engine"): the checkpoint is copied and its
``processor_config.json`` video processor renamed to the stock class when it names a vlforge-only one
(older vlforge tiny checkpoints); the loss forward adds ``mm_token_type_ids`` (1 at image, 2 at video
pad tokens), which transformers 5.8's Qwen3-VL requires and LMMS Engine's samples do not carry.
Nothing of LMMS Engine is patched.

Example:
    ~/.cache/vlforge/peers/lmms-engine-0.1.4/bin/python benchmarks/peers/lmms_runner.py \\
        --checkpoint /tmp/tiny-q25 --family qwen2_5_vl --data /tmp/parity/parity.jsonl --loss
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

STOCK_VIDEO = {"qwen2_5_vl": "Qwen2VLVideoProcessor", "qwen3_vl": "Qwen3VLVideoProcessor"}
DATASET_TYPE = {"qwen2_5_vl": "vision", "qwen3_vl": "qwen3_vl"}


def stock_checkpoint(checkpoint: Path, family: str, into: Path) -> tuple[Path, list[str]]:
    """A copy of ``checkpoint`` whose processor config names only stock transformers classes."""
    shims: list[str] = []
    config = json.loads((checkpoint / "processor_config.json").read_text())
    video = config.get("video_processor", {})
    name = video.get("video_processor_type")
    if name and name != STOCK_VIDEO[family]:
        target = into / "checkpoint"
        shutil.copytree(checkpoint, target)
        video["video_processor_type"] = STOCK_VIDEO[family]
        (target / "processor_config.json").write_text(json.dumps(config, indent=2))
        shims.append(f"processor_config.json video_processor_type {name} -> {STOCK_VIDEO[family]}")
        return target, shims
    return checkpoint, shims


def build_dataset(checkpoint: Path, family: str, data: Path, args: argparse.Namespace):
    import lmms_engine.datasets  # noqa: F401  (registers the dataset and processor classes)
    from lmms_engine.datasets.config import DatasetConfig
    from lmms_engine.mapping_func import DATASET_MAPPING

    config = DatasetConfig(
        dataset_type=DATASET_TYPE[family], dataset_format="yaml", shuffle=False,
        datasets=[{"path": str(data), "data_folder": str(data.parent), "data_type": "jsonl"}],
        processor_config={"processor_name": str(checkpoint), "processor_type": family,
                          "extra_kwargs": {"image_min_pixels": args.min_pixels, "image_max_pixels": args.max_pixels,
                                           "video_min_pixels": args.min_pixels,
                                           # the video processor's bound is over all frames of a clip
                                           "video_max_pixels": args.max_pixels * args.max_frames}},
        packing=False, fps=args.fps, video_max_pixels=args.max_pixels, video_min_pixels=args.min_pixels,
        video_max_frames=args.max_frames, video_sampling_strategy="fps", video_backend="qwen_vl_utils",
    )
    dataset = DATASET_MAPPING[DATASET_TYPE[family]](config)
    dataset.build()
    return dataset


def sample_loss(model, sample: dict) -> tuple[float, int]:
    """Sum of the shifted token cross-entropies (fp32) and how many labels were predicted."""
    import torch
    from torch.nn import functional as F

    keys = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
    inputs = {k: sample[k] for k in keys if sample.get(k) is not None}
    ids = sample["input_ids"][None]
    if sample.get("mm_token_type_ids") is None:  # transformers 5.8's Qwen3-VL wants it; LMMS's samples lack it
        config = model.config
        types = torch.zeros_like(ids, dtype=torch.int)
        types[ids == config.image_token_id] = 1
        types[ids == config.video_token_id] = 2
        inputs["mm_token_type_ids"] = types
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **inputs).logits[0]
    labels = sample["labels"][1:]
    keep = labels != -100
    loss = F.cross_entropy(logits[:-1][keep].float(), labels[keep], reduction="sum")
    return float(loss), int(keep.sum())


def sample_records(checkpoint: Path, family: str, data: Path, args: argparse.Namespace, *, loss: bool) -> dict:
    """``{"process_seconds", "samples"}``: each record's processed sample (ids, labels, grids, pixel sums) and, with
    ``loss``, its loss sum at the checkpoint's weights (``checkpoint``: a :func:`stock_checkpoint` directory)."""
    import torch

    torch.manual_seed(0)
    start = time.perf_counter()
    dataset = build_dataset(checkpoint, family, data, args)
    samples = [dataset[i] for i in range(len(dataset))]
    seconds = round(time.perf_counter() - start, 3)
    model = None
    if loss:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
    records = []
    for sample in samples:
        record = {"input_ids": sample["input_ids"].tolist(), "labels": sample["labels"].tolist()}
        for key in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts"):
            if sample.get(key) is not None:
                record[key] = sample[key].tolist()
        for key in ("pixel_values", "pixel_values_videos"):
            if sample.get(key) is not None:
                record[key + "_sum"] = float(sample[key].double().sum())
                record[key + "_shape"] = list(sample[key].shape)
        if model is not None:
            start = time.perf_counter()
            record["loss_sum"], record["predicted"] = sample_loss(model, sample)
            record["forward_seconds"] = round(time.perf_counter() - start, 4)
        records.append(record)
    return {"process_seconds": seconds, "samples": records}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--family", choices=sorted(DATASET_TYPE), required=True)
    parser.add_argument("--data", type=Path, required=True, help="JSONL in LMMS Engine's layout")
    parser.add_argument("--fps", type=int, default=2)
    parser.add_argument("--min-pixels", type=int, default=3136)
    parser.add_argument("--max-pixels", type=int, default=224 * 224 * 2)
    parser.add_argument("--max-frames", type=int, default=16)
    parser.add_argument("--loss", action="store_true", help="also run the model: per-sample loss sums")
    args = parser.parse_args()
    result = sys.stdout
    sys.stdout = sys.stderr  # LMMS Engine and deepspeed print to stdout; only the JSON goes there

    import lmms_engine
    import torch
    import transformers

    out: dict = {"engine": "lmms-engine", "version": getattr(lmms_engine, "__version__", None),
                 "transformers": transformers.__version__, "torch": torch.__version__, "family": args.family}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint, out["shims"] = stock_checkpoint(args.checkpoint, args.family, Path(tmp))
        out.update(sample_records(checkpoint, args.family, args.data, args, loss=args.loss))
    json.dump(out, result)
    result.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
