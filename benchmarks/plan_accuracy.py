"""How close `vlforge plan` comes to the memory a training step really takes, per rank, on this machine.

For each configuration the script writes a random-init Qwen3-VL checkpoint of the given text size (the real
Qwen3 tokenizer and vocabulary, a small vision tower) and a text dataset, asks `vlforge.plan` for its peak
estimate, then runs real `vlforge.train` steps (one process, or two under torchrun for SP=2) and measures:
peak resident memory during the steps (Linux ``VmHWM`` after resetting it with ``/proc/self/clear_refs``
once the model and optimizer are built; glibc's ``MALLOC_MMAP_THRESHOLD_`` fixed at 64 KB so freed tensors
leave the resident set instead of staying as heap fragmentation) minus the process baseline (resident memory after importing torch,
transformers and vlforge and loading the tokenizer once). On CUDA the allocator's peak
(``torch.cuda.max_memory_allocated``) is used instead. Prints one JSON document: one record per
configuration with ``estimated_bytes``, ``measured_bytes`` and their ratio. Every number is measured here.

Run:
    .venv/bin/python benchmarks/plan_accuracy.py                 # 7 configurations, ~10 minutes on 2 cores
    .venv/bin/python benchmarks/plan_accuracy.py --only small-packed
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

SIZES = {
    "small": {"hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 1024, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 32},
    "medium": {"hidden_size": 1024, "num_hidden_layers": 12, "intermediate_size": 4096, "num_attention_heads": 16,
               "num_key_value_heads": 8, "head_dim": 64},
}

CONFIGS: dict[str, dict[str, Any]] = {
    "small-packed": {"size": "small", "packing": {"packing": True, "packing_length": 2048}},
    "small-packed-gc": {"size": "small", "packing": {"packing": True, "packing_length": 2048},
                        "model": {"gradient_checkpointing": True}},
    "small-padded": {"size": "small", "packing": {"packing": False, "max_length": 1024},
                     "training": {"per_device_train_batch_size": 2}},
    "small-lora": {"size": "small", "packing": {"packing": True, "packing_length": 2048},
                   "model": {"lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj",
                                                                               "o_proj"]}}},
    "small-packed-sp2": {"size": "small", "packing": {"packing": True, "packing_length": 2048}, "nproc": 2,
                         "sp_ulysses_degree": 2},
    "medium-packed-gc": {"size": "medium", "packing": {"packing": True, "packing_length": 1024},
                         "model": {"gradient_checkpointing": True}},
    "medium-packed": {"size": "medium", "packing": {"packing": True, "packing_length": 1024}},
}

MMAP_THRESHOLD = 65536

WORDS = ["alpha", "beta", "gamma", "delta", "pixel", "frame", "model", "token", "video", "scene"]


def write_model(path: Path, size: str) -> Path:
    """A random Qwen3-VL with the text dimensions of ``size`` (tiny vision tower), tokenizer and processor."""
    import torch
    from transformers import AutoModelForImageTextToText

    from vlforge.models.load import resolve
    from vlforge.models.tiny import build_config, build_tokenizer

    if (path / "config.json").is_file():
        return path
    config = build_config("qwen3_vl", build_tokenizer("qwen3_vl"))[0]
    for key, value in SIZES[size].items():
        setattr(config.text_config, key, value)
    config.vision_config.out_hidden_size = SIZES[size]["hidden_size"]
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    source = resolve("tiny:qwen3_vl")
    for item in source.iterdir():
        if item.suffix in (".json", ".jinja", ".txt") and item.name not in ("config.json", "model.safetensors.index.json",
                                                                            "generation_config.json"):
            shutil.copy(item, tmp / item.name)
    tmp.rename(path)
    return path


def write_data(path: Path, records: int = 64, words: int = 220) -> Path:
    """Text chats of about 500 tokens, about half of them in the assistant reply."""
    with open(path, "w") as fh:
        for i in range(records):
            question = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(words))
            answer = " ".join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(words))
            fh.write(json.dumps({"messages": [{"role": "user", "content": question},
                                              {"role": "assistant", "content": answer}]}) + "\n")
    return path


def train_config(name: str, model: Path, data: Path, out: Path) -> dict[str, Any]:
    spec = CONFIGS[name]
    cfg: dict[str, Any] = {
        "data": {"dataset_path": str(data)},
        "packing": {"packing": False},
        "model": {"load_from_pretrained_path": str(model), "token_audit": False},
        "training": {"max_steps": 3, "learning_rate": 1e-4, "seed": 0, "use_cpu": True,
                     "lr_scheduler_type": "constant"},
        "logging": {"logging_steps": 1},
        "checkpointing": {"output_dir": str(out), "save_strategy": "no", "resume": "none"},
    }
    for section in ("packing", "model", "training"):
        cfg[section].update(spec.get(section, {}))
    if "sp_ulysses_degree" in spec:
        cfg["sp_ulysses_degree"] = spec["sp_ulysses_degree"]
    return cfg


# -- the measuring worker (one per rank) ------------------------------------------------------------------
def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def worker(config: Path, result: Path) -> None:
    """Run the steps of ``config`` and write this rank's measured peak (bytes above the baseline)."""
    import torch
    from transformers import AutoTokenizer

    import vlforge.train  # noqa: F401 - part of the baseline
    from vlforge.config.load import load_config
    from vlforge.train.trainer import Trainer

    cfg = load_config(config)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.load_from_pretrained_path)
    del tokenizer
    baseline = _status("VmRSS")
    trainer = Trainer(cfg, progress=False, export=False)
    trainer.setup()
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS (drops load-time transients)
    cuda = trainer.ctx.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    outcome = trainer.train()
    peak = torch.cuda.max_memory_allocated() if cuda else _status("VmHWM") - baseline
    rank = trainer.ctx.rank
    (result.parent / f"{result.name}.rank{rank}").write_text(json.dumps(
        {"measured_bytes": peak, "baseline_bytes": baseline, "steps": outcome.steps,
         "device": str(trainer.ctx.device)}))
    trainer.ctx.close()


# -- the driver ---------------------------------------------------------------------------------------------
def data_shape(cfg: Any, base: str) -> tuple[int, float]:
    """Mean sample length and label share of the data (what the plan's --seq-len / --label-share take)."""
    from vlforge.config.data import data_config
    from vlforge.train.data_setup import open_stream, processor_for

    class Loaded:  # the tokenizer and processor of the checkpoint, as the trainer gets them
        def __init__(self, path: str) -> None:
            from transformers import AutoProcessor

            self.processor = AutoProcessor.from_pretrained(path)
            self.tokenizer = self.processor.tokenizer
            self.family = "qwen3_vl"

    dc = data_config(cfg)
    stream = open_stream(dc.model_copy(update={"packing": False, "epochs": 1, "batch_size": 1}),
                         processor_for(cfg, Loaded(cfg.model.load_from_pretrained_path), dc),
                         rank=0, world_size=1, base_dir=base)
    lengths, labels = [], []
    for batch in stream:
        lengths.append(int(batch["input_ids"].shape[1]))
        labels.append(int((batch["labels"] != -100).sum()))
    stream.close()
    return round(sum(lengths) / len(lengths)), sum(labels) / sum(lengths)


def measure(name: str, work: Path) -> dict[str, Any]:
    import yaml
    from transformers import AutoConfig

    from vlforge.config.load import load_config
    from vlforge.memory.estimate import estimate_memory

    spec = CONFIGS[name]
    model = write_model(work / f"model-{spec['size']}", spec["size"])
    data = work / "data.jsonl"
    if not data.exists():
        write_data(data)
    raw = train_config(name, model, data, work / f"out-{name}")
    config = work / f"{name}.yaml"
    config.write_text(yaml.safe_dump(raw))
    cfg = load_config(config)
    length, share = data_shape(cfg, str(work))
    nproc = spec.get("nproc", 1)
    estimate = estimate_memory(cfg, AutoConfig.from_pretrained(model), world=nproc, sample_length=length,
                               label_share=share, visual_share=0.0)  # text-only data
    result = work / f"{name}.result"
    me = [sys.executable, str(Path(__file__).resolve()), "--worker", str(config), str(result)]
    if nproc > 1:
        me = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), *me[1:]]
    # glibc keeps freed heap blocks below its (dynamic, up to 32 MB) mmap threshold: RSS would then measure heap
    # fragmentation, not live tensors; a fixed 64 KB threshold returns every freed tensor to the system
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1" if nproc > 1 else "2",
           "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    proc = subprocess.run(me, env=env, cwd=work, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        return {"name": name, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    ranks = [json.loads((work / f"{name}.result.rank{r}").read_text()) for r in range(nproc)]
    measured = max(r["measured_bytes"] for r in ranks)
    return {"name": name, "size": spec["size"], "parameters": estimate.parameters,
            "trainable_parameters": estimate.trainable, "processes": nproc,
            "sp_degree": raw.get("sp_ulysses_degree", 1),
            "gradient_checkpointing": bool(raw["model"].get("gradient_checkpointing")),
            "packing": raw["packing"]["packing"], "lora": "lora" in raw["model"], "sample_tokens": length,
            "label_share": round(share, 3), "estimated_bytes": estimate.peak_bytes, "measured_bytes": measured,
            "ratio": round(estimate.peak_bytes / measured, 3), "parts": estimate.parts,
            "measured_per_rank": [r["measured_bytes"] for r in ranks], "device": ranks[0]["device"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(CONFIGS))
    parser.add_argument("--worker", nargs=2, metavar=("CONFIG", "RESULT"), help=argparse.SUPPRESS)
    parser.add_argument("--keep", type=Path, help="work directory to keep (models are reused from it)")
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), Path(args.worker[1]))
        return
    import torch

    work = args.keep or Path(tempfile.mkdtemp(prefix="vlforge-plan-accuracy-"))
    work.mkdir(parents=True, exist_ok=True)
    records = [measure(name, work) for name in (args.only or list(CONFIGS))]
    ok = [r for r in records if "ratio" in r]
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "logical_cpus": os.cpu_count(),
                       "torch": torch.__version__, "utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
                       "load_average_1m": round(os.getloadavg()[0], 2)},
           "malloc_mmap_threshold": MMAP_THRESHOLD, "records": records,
           "within_20_percent": sum(1 for r in ok if 0.8 <= r["ratio"] <= 1.2), "measured": len(ok)}
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
