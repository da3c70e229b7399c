"""Run LMMS Engine's own trainer (``hf_trainer``) on the CPU for a few steps and print JSON.

Executed by the peer venv's python (``scripts/peer_env.py build``), never by vlforge's. It writes the
run's config in LMMS Engine's layout (``trainer_type``, ``dataset_config``, ``model_config``,
``trainer_args``) and launches LMMS Engine's CLI entry point (``lmms_engine.launch.cli``, the hydra
main behind ``python -m lmms_engine.launch.cli config_yaml=...``) in this process, single rank, with
``trainer_args.use_cpu: true`` (which the CLI maps to the gloo backend) and fp32. One epoch of the
dataset is one step (batch size = the number of records), as in ``benchmarks/parity.py``'s padded run.

Measured with the trainer's own machinery: the loss of each step from its ``log_history``
(``logging_steps: 1``), the tokens of each step from ``include_num_input_tokens_seen: non_padding``
(the attention-mask sum, vlforge's count for a padded batch), the time of each step between two
``on_step_end`` callbacks (step 1 from ``on_train_begin``): data loading, forward, backward, optimiser.

CPU shims (applied in this process, none in LMMS Engine's files; each listed in the JSON's ``shims``
and in docs/train.md "Parity with LMMS Engine"; paths under ``lmms_engine/``):

- ``init_device_mesh("cuda", ...)`` of its rank grid becomes ``"cpu"``
  (``parallel/process_group_manager.py:62``, called by the CLI for every trainer).
- without CUDA, ``torch.cuda.get_device_name`` answers ``"cpu"``: the Trainer's compute tracker asks
  it on step 1 (``train/hf/trainer.py:344``, ``utils/train_utils.py:169``); and
  ``torch.cuda.synchronize`` is a no-op: the runner calls it before the final save (``train/runner.py:225``).
- ``TrainingArguments.only_save_mm_adapter = False``: the runner reads it after training
  (``train/runner.py:226``) and 0.1.4's ``TrainingArguments`` has no such field (not CPU-specific).
- Qwen3-VL: the collated batch gets ``mm_token_type_ids`` (1 at image, 2 at video pad tokens), which
  transformers 5.8's Qwen3-VL requires with images and LMMS Engine's ``VisionCollator`` does not produce.
- the checkpoint copy of ``lmms_runner.stock_checkpoint`` when its processor config names a
  vlforge-only video processor.

The Trainer puts its MFU tensor on ``device=local_rank`` (CUDA) at every 10th step
(``train/hf/trainer.py:355``), so at most 10 steps run here. The ``fsdp2_trainer`` is not used: it
has no fp32 path (parameters in fp16 unless bf16, ``train/fsdp2/fsdp2_trainer.py:170``; forward
under ``torch.autocast("cuda")``, line 245).

Example:
    ~/.cache/vlforge/peers/lmms-engine-0.1.4/bin/python benchmarks/peers/lmms_train.py \\
        --checkpoint /tmp/tiny-q25 --family qwen2_5_vl --data /tmp/parity/parity.jsonl --steps 4
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lmms_runner import DATASET_TYPE, sample_records, stock_checkpoint

MAX_STEPS = 10  # LMMS's Trainer.compute_loss puts its MFU tensor on CUDA at global_step 10


def run_config(checkpoint: Path, family: str, data: Path, args: argparse.Namespace, output_dir: Path) -> dict:
    """The run in LMMS Engine's config layout (what ``config_yaml=`` of its CLI reads)."""
    records = sum(1 for line in data.read_text().splitlines() if line.strip())
    return {
        "trainer_type": "hf_trainer",
        "dataset_config": {
            "dataset_type": DATASET_TYPE[family], "dataset_format": "yaml", "shuffle": False,
            "datasets": [{"path": str(data), "data_folder": str(data.parent), "data_type": "jsonl"}],
            "processor_config": {
                "processor_name": str(checkpoint), "processor_type": family,
                "extra_kwargs": {"image_min_pixels": args.min_pixels, "image_max_pixels": args.max_pixels,
                                 "video_min_pixels": args.min_pixels,
                                 "video_max_pixels": args.max_pixels * args.max_frames}},
            "packing": False, "fps": args.fps, "video_max_pixels": args.max_pixels,
            "video_min_pixels": args.min_pixels, "video_max_frames": args.max_frames,
            "video_sampling_strategy": "fps", "video_backend": "qwen_vl_utils",
        },
        "model_config": {"load_from_pretrained_path": str(checkpoint), "attn_implementation": "sdpa"},
        "trainer_args": {
            "output_dir": str(output_dir), "use_cpu": True, "bf16": False, "fp16": False,
            "per_device_train_batch_size": records, "gradient_accumulation_steps": 1,
            "num_train_epochs": args.steps, "learning_rate": args.learning_rate, "lr_scheduler_type": "constant",
            "warmup_steps": 0, "weight_decay": 0.0, "max_grad_norm": 1.0, "seed": 0,
            "logging_steps": 1, "save_strategy": "no", "report_to": "none", "disable_tqdm": True,
            "dataloader_num_workers": 0, "dataloader_pin_memory": False,
            "include_num_input_tokens_seen": "non_padding", "use_liger_kernel": False, "use_rmpad": False,
            "fsdp2": False, "gradient_checkpointing": False,
        },
    }


def apply_shims(family: str) -> list[str]:
    """The CPU shims (see the module docstring); returns their one-line descriptions."""
    import lmms_engine.parallel.process_group_manager as pgm
    import torch

    mesh = pgm.init_device_mesh
    pgm.init_device_mesh = lambda device_type, *a, **k: mesh("cpu" if device_type == "cuda" else device_type, *a, **k)
    shims = ["process_group_manager.init_device_mesh('cuda', ...) -> 'cpu' (LMMS's rank grid pins CUDA)"]
    if not torch.cuda.is_available():
        torch.cuda.get_device_name = lambda device=None: "cpu"
        torch.cuda.synchronize = lambda device=None: None
        shims += ["torch.cuda.get_device_name -> 'cpu' (LMMS Trainer's compute tracker asks it on step 1)",
                  "torch.cuda.synchronize -> no-op (LMMS TrainRunner calls it before the final save)"]
    from lmms_engine.train.config import TrainingArguments

    if not hasattr(TrainingArguments, "only_save_mm_adapter"):
        TrainingArguments.only_save_mm_adapter = False
        shims.append("TrainingArguments.only_save_mm_adapter = False (TrainRunner reads it after training; "
                     "0.1.4's TrainingArguments lacks it)")
    if family == "qwen3_vl":
        from lmms_engine.datasets.collator import vision_collator

        collate = vision_collator.VisionCollator.__call__

        def with_token_types(self, instances):
            batch = collate(self, instances)
            ids = batch["input_ids"]
            token_id = self.processor.tokenizer.convert_tokens_to_ids
            types = torch.zeros_like(ids, dtype=torch.int)
            types[ids == token_id("<|image_pad|>")] = 1
            types[ids == token_id("<|video_pad|>")] = 2
            batch["mm_token_type_ids"] = types
            return batch

        vision_collator.VisionCollator.__call__ = with_token_types
        shims.append("VisionCollator adds mm_token_type_ids (transformers 5.8's Qwen3-VL requires it)")
    return shims


def instrument(clock: dict) -> None:
    """Add a step clock to the Trainer LMMS Engine's runner builds (measurement only)."""
    from lmms_engine.train.runner import TrainRunner
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock["marks"] = [(time.perf_counter(), state.num_input_tokens_seen)]

        def on_step_end(self, args, state, control, **kwargs):
            clock["marks"].append((time.perf_counter(), state.num_input_tokens_seen))

    build = TrainRunner._build_trainer

    def build_with_clock(self):
        trainer = build(self)
        trainer.add_callback(StepClock())
        clock["trainer"] = trainer
        return trainer

    TrainRunner._build_trainer = build_with_clock


def launch(config_path: Path, hydra_dir: Path) -> None:
    """LMMS Engine's CLI main, as ``python -m lmms_engine.launch.cli config_yaml=...`` runs it (one rank)."""
    import runpy
    import socket

    with socket.socket() as sock:  # a free port: the CLI's default 29500 may be taken by another run
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      HYDRA_FULL_ERROR="1")  # a failure ends with the exception's own line
    argv = sys.argv
    sys.argv = ["lmms_engine.launch.cli", f"config_yaml={config_path}", f"hydra.run.dir={hydra_dir}",
                "hydra.output_subdir=null"]
    try:  # as __main__: hydra then finds the config folder next to cli.py, as with ``python -m``
        runpy.run_module("lmms_engine.launch.cli", run_name="__main__", alter_sys=True)
    finally:
        sys.argv = argv


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--family", choices=sorted(DATASET_TYPE), required=True)
    parser.add_argument("--data", type=Path, required=True, help="JSONL in LMMS Engine's layout")
    parser.add_argument("--steps", type=int, default=4, help=f"optimiser steps, one epoch each (1..{MAX_STEPS})")
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--fps", type=int, default=2)
    parser.add_argument("--min-pixels", type=int, default=3136)
    parser.add_argument("--max-pixels", type=int, default=224 * 224 * 2)
    parser.add_argument("--max-frames", type=int, default=16)
    parser.add_argument("--samples", action="store_true",
                        help="also print lmms_runner.py --loss's samples (processed before training, same process)")
    args = parser.parse_args()
    if not 1 <= args.steps <= MAX_STEPS:
        parser.error(f"--steps must be within 1..{MAX_STEPS} (LMMS's Trainer needs CUDA at step {MAX_STEPS + 1})")
    result = sys.stdout
    sys.stdout = sys.stderr  # LMMS Engine and deepspeed print to stdout; only the JSON goes there

    import importlib.metadata

    import torch
    import transformers
    import yaml

    out: dict = {"engine": "lmms-engine", "trainer": "hf_trainer",
                 "version": importlib.metadata.version("lmms-engine"), "transformers": transformers.__version__,
                 "torch": torch.__version__, "family": args.family, "threads": torch.get_num_threads()}
    clock: dict = {}
    with tempfile.TemporaryDirectory(prefix="lmms-train-") as tmp:
        work = Path(tmp)
        checkpoint, out["shims"] = stock_checkpoint(args.checkpoint, args.family, work)
        if args.samples:  # before the shims: what lmms_runner.py --loss prints, from this process
            out["runner"] = sample_records(checkpoint, args.family, args.data, args, loss=True)
        out["shims"] += apply_shims(args.family)
        instrument(clock)
        config_path = work / "lmms_config.yaml"
        config_path.write_text(yaml.safe_dump(run_config(checkpoint, args.family, args.data, args, work / "out")))
        launch(config_path, work / "hydra")
        trainer = clock["trainer"]
        model = trainer.model
        out["device"] = str(trainer.args.device)
        out["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
        losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    marks = clock["marks"]
    steps = [{"seconds": round(t1 - t0, 4), "tokens": int(n1 - n0)}
             for (t0, n0), (t1, n1) in itertools.pairwise(marks)]
    rates = [s["tokens"] / s["seconds"] for s in steps]
    later = rates[1:] or rates
    out.update({"steps": len(steps), "losses": losses, "loss": losses[0] if losses else None,
                "step_tokens": [s["tokens"] for s in steps], "step_seconds": [s["seconds"] for s in steps],
                "tokens_per_s": round(sum(later) / len(later), 1)})
    json.dump(out, result)
    result.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
