"""Data at scale, measured in one run: streaming memory, seeking video decode, start-up to the first step.

* ``stream``: ``--samples`` generated chat records (text of varied length, one in four with a small PNG)
  streamed with shuffling through Qwen3-VL processing and packing; samples/s and peak RSS after the
  first tenth and at the end (``rss_growth`` = peak at the end / peak at one tenth; flat means <= 1.10).
* ``video``: a generated ``--video-minutes`` clip at 30 fps sampled at 1 fps, decoded by seeking vs
  sequentially (``benchmarks/video_decode.py``; ``seek_speedup`` target >= 10).
* ``startup``: ``python -m vlforge.train`` on a config over the same records with ``num_train_epochs``
  (no ``max_steps``), timed from launch until step 1 is in ``metrics.jsonl`` (target < 30 s), with the
  schedule line it logged. The run is stopped after its first step.

Every number printed is measured here. Prints one JSON document.

Run:
    .venv/bin/python benchmarks/data_scale.py                     # 100,000 samples, 20-minute video
    .venv/bin/python benchmarks/data_scale.py --samples 20000 --skip video
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
IMAGES = 32


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def make_dataset(folder: Path, samples: int) -> Path:
    """``samples`` chat records in one JSONL (1 in 4 with one of ``IMAGES`` 64x48 PNGs), deterministic."""
    rng = np.random.default_rng(0)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    for i in range(IMAGES):
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(folder / "images" / f"{i}.png")
    words = ["alpha", "beta", "gamma", "delta", "pixel", "frame", "model", "token", "video", "scene"]
    path = folder / "train.jsonl"
    with open(path, "w") as fh:
        for i in range(samples):
            text = " ".join(words[(i * 7 + k) % len(words)] for k in range(5 + (i * 37) % 120))
            user: object = f"Question {i}: {text}"
            if i % 4 == 0:
                user = [{"type": "image", "image": f"images/{i % IMAGES}.png"}, {"type": "text", "text": user}]
            answer = "Answer " + " ".join(words[(i + k) % len(words)] for k in range(3 + (i * 11) % 40))
            fh.write(json.dumps({"messages": [{"role": "user", "content": user},
                                              {"role": "assistant", "content": answer}]}) + "\n")
    return path


def measure_stream(data: Path, samples: int) -> dict:
    from vlforge.data import DataConfig, DataStream, QwenVLProcessor, VisionSettings
    from vlforge.models.tokenizer import qwen3_tokenizer

    settings = VisionSettings.for_family("qwen3_vl", min_pixels=32 * 32, max_pixels=64 * 64)
    processor = QwenVLProcessor(qwen3_tokenizer(), settings, "qwen3_vl")
    cfg = DataConfig(filter_overlong=True, datasets=[{"path": str(data)}], packing=True, packing_length=4096, shuffle=True)
    stream = DataStream(cfg, processor)
    tenth, seen, rss_tenth, t_tenth = samples // 10, 0, None, None
    start = time.perf_counter()
    for batch in stream:
        seen += len(batch["sample_ids"])
        if rss_tenth is None and seen >= tenth:
            rss_tenth, t_tenth = peak_rss_mb(), time.perf_counter() - start
    seconds = time.perf_counter() - start
    report = stream.report()
    return {"samples": seen, "seconds": round(seconds, 2), "samples_per_s": round(seen / seconds, 1),
            "peak_rss_mb_at_tenth": round(rss_tenth, 1), "seconds_at_tenth": round(t_tenth, 2),
            "peak_rss_mb_at_end": round(peak_rss_mb(), 1), "rss_growth": round(peak_rss_mb() / rss_tenth, 3),
            "packing_efficiency": round(report["packing"]["efficiency"], 3), "shuffle_buffer": cfg.shuffle_buffer,
            "skipped": report["skipped_total"]}


def measure_startup(data: Path, work: Path) -> dict:
    """Launch a real training run over ``data`` (epochs, no max_steps) and time it to its first step."""
    import yaml

    from vlforge.models.tiny import write_tiny

    model = work / "tiny-qwen3-vl"
    if not model.exists():
        write_tiny("qwen3_vl", model)
    out = work / "run"
    cfg = {
        "data": {"dataset_path": str(data), "shuffle": True},
        "processor": {"max_pixels": 4096, "min_pixels": 1024},
        "packing": {"packing": True, "packing_length": 1024},
        "model": {"load_from_pretrained_path": str(model)},
        "training": {"num_train_epochs": 1, "learning_rate": 1e-4, "seed": 0, "use_cpu": True},
        "logging": {"logging_steps": 1},
        "checkpointing": {"output_dir": str(out), "save_steps": 100000, "resume": "none"},
    }
    config = work / "startup.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "XDG_CACHE_HOME": str(work / "cache")}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "vlforge.train", str(config)], env=env, cwd=work,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics, seconds = out / "metrics.jsonl", None
    try:
        while proc.poll() is None and time.perf_counter() - start < 600:
            if metrics.is_file() and any('"step": 1' in line for line in metrics.read_text().splitlines()):
                seconds = time.perf_counter() - start
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        stderr = proc.communicate()[1]
    schedule = [line.split("schedule: ", 1)[1] for line in stderr.splitlines() if "schedule: " in line]
    result: dict = {"seconds_to_first_step": None if seconds is None else round(seconds, 2), "schedule": schedule}
    if seconds is None:
        result["error"] = stderr.strip().splitlines()[-1] if stderr.strip() else "no first step within 600 s"
    return result


def machine() -> dict:
    import torch

    load = os.getloadavg()[0]
    return {"cpu": platform.processor() or platform.machine(), "logical_cpus": os.cpu_count(),
            "torch": torch.__version__, "python": platform.python_version(), "load_average_1m": round(load, 2),
            "utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--video-minutes", type=float, default=20.0)
    parser.add_argument("--skip", action="append", default=[], choices=["stream", "video", "startup"])
    args = parser.parse_args()
    out: dict = {"machine": machine(), "samples": args.samples}
    with tempfile.TemporaryDirectory(prefix="vlforge-data-scale-") as tmp:
        work = Path(tmp)
        data = make_dataset(work, args.samples)
        if "startup" not in args.skip:  # first: the child measures start-up on an idle machine
            out["startup"] = measure_startup(data, work)
        if "stream" not in args.skip:
            out["stream"] = measure_stream(data, args.samples)
        if "video" not in args.skip:
            sys.path.insert(0, str(Path(__file__).parent))
            from video_decode import measure

            out["video"] = measure(minutes=args.video_minutes, fps=30, sample_fps=1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
