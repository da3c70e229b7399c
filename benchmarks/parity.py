"""First-step loss, supervised tokens and training tokens/s: vlforge, a transformers-only reference, LMMS Engine.

Same tiny checkpoints (``tiny:qwen2_5_vl``, ``tiny:qwen3_vl``, written by ``vlforge tiny``), same data
(``benchmarks/peers/parity_data.py``: four chats with a system prompt, several assistant turns, PNG
images and one H.264 MP4), fp32 on the CPU. One record per engine and case, as JSON on stdout:

- ``vlforge``: ``vlforge train`` (``data.label_mode: assistant``, the default), one epoch per step (a
  padded batch of the four samples, or with ``packing`` one packed row of exactly them), ``--steps``
  steps; ``loss`` is step 1's (before any update), ``tokens_per_s`` the mean of the later steps.
- ``transformers``: the reference of ``benchmarks/peers/hf_reference.py`` (chat template, processor,
  token rule, model logits); ``loss`` is the token-weighted mean over the four samples.
- ``vlforge-lmms``: ``vlforge train`` with ``data.label_mode: lmms``.
- ``lmms-engine``: LMMS Engine 0.1.4's own dataset and processor in its venv
  (``scripts/peer_env.py``), the loss from the checkpoint's model in that venv's transformers; and its
  own trainer (``hf_trainer`` through its CLI entry point, CPU shims in
  ``benchmarks/peers/lmms_train.py``, see docs/train.md) for ``--steps`` steps of the same padded batch:
  ``tokens_per_s`` the mean of the later steps (non-padding tokens, as vlforge counts them), ``trainer``
  its step-1 loss and the shims. When the trainer cannot run, ``tokens_per_s`` is null and
  ``tokens_per_s_error`` says why.

Every record also carries ``label_tokens`` (labels set; LMMS labels position 0, never predicted) and the
LMMS records a ``masking`` diff against vlforge's default: each token that one supervises and the other
does not, aligned on the token sequences, and the tokens only one template has.

Run:
    .venv/bin/python benchmarks/parity.py                 # about 3 minutes on 2 cores (with the peer and its trainer)
    .venv/bin/python benchmarks/parity.py --steps 3 --families qwen3_vl --no-peer
"""

from __future__ import annotations

import argparse
import collections
import difflib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(0, str(HERE.parent / "scripts"))

import hf_reference  # noqa: E402
from parity_data import MAX_PIXELS, MIN_PIXELS, SAMPLE_FPS, write_dataset  # noqa: E402
from peer_env import peer_python  # noqa: E402

FAMILIES = ("qwen2_5_vl", "qwen3_vl")


def vlforge_train(work: Path, checkpoint: Path, data: Path, *, packing: bool, label_mode: str, steps: int,
                  row_length: int) -> dict:
    """``vlforge train`` for ``steps`` epochs (one step each); step 1's loss and the later steps' tokens/s."""
    name = f"{checkpoint.name}-{'packed' if packing else 'padded'}-{label_mode}"
    cfg = {
        "data": {"dataset_path": str(data), "label_mode": label_mode},
        "processor": {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS},
        "video": {"fps": SAMPLE_FPS, "video_min_pixels": MIN_PIXELS, "video_max_pixels": MAX_PIXELS},
        "packing": {"packing": packing, "packing_length": row_length},
        "model": {"load_from_pretrained_path": str(checkpoint)},
        "training": {"num_train_epochs": steps, "learning_rate": 1e-5, "per_device_train_batch_size":
                     1 if packing else 4, "seed": 0, "lr_scheduler_type": "constant"},
        "logging": {"logging_steps": 1},
        "checkpointing": {"output_dir": str(work / name), "save_steps": 10_000, "resume": "none"},
    }
    config = work / f"{name}.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    vlforge = Path(sys.executable).parent / "vlforge"
    done = subprocess.run([str(vlforge), "train", str(config), "--no-token-audit"], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    if done.returncode != 0:
        raise SystemExit(f"parity: vlforge train failed ({config}): {done.stderr.strip().splitlines()[-1]}")
    records = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "loss" in r]
    later = [r["tokens_per_s"] for r in records[1:]] or [records[0]["tokens_per_s"]]
    return {"loss": records[0]["loss"], "supervised_tokens": records[0]["label_tokens"],
            "tokens_per_s": round(sum(later) / len(later), 1), "steps": len(records)}


def vlforge_samples(checkpoint: Path, data: Path, family: str, label_mode: str) -> list[tuple[list, list]]:
    """vlforge's (input_ids, labels) per record, straight from its processor."""
    from transformers import AutoTokenizer

    from vlforge.data import build_processor
    from vlforge.data.config import DataConfig
    from vlforge.data.schema import parse_conversation

    cfg = DataConfig(datasets=[], label_mode=label_mode, fps=SAMPLE_FPS, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS,
                     video_min_pixels=MIN_PIXELS, video_max_pixels=MAX_PIXELS)
    proc = build_processor(cfg, AutoTokenizer.from_pretrained(checkpoint), family)
    out = []
    for i, line in enumerate(data.read_text().splitlines()):
        sample = proc.process(parse_conversation(json.loads(line), data.name, f"line {i + 1}"), data.parent)
        out.append((sample.input_ids.tolist(), sample.labels.tolist()))
    return out


def masking_diff(tokenizer, ours: list[tuple[list, list]], theirs: list[tuple[list, list]]) -> dict:
    """Tokens supervised by only one side (aligned on the sequences) and tokens only one template has."""
    only_theirs, only_ours, template_theirs, template_ours = (collections.Counter() for _ in range(4))
    for (ids_a, lab_a), (ids_b, lab_b) in zip(ours, theirs, strict=True):
        matcher = difflib.SequenceMatcher(a=ids_a, b=ids_b, autojunk=False)
        for op, a0, a1, b0, b1 in matcher.get_opcodes():
            if op == "equal":
                for i, j in zip(range(a0, a1), range(b0, b1), strict=True):
                    name = tokenizer.convert_ids_to_tokens(ids_a[i])
                    if (lab_a[i] != -100) != (lab_b[j] != -100):
                        (only_ours if lab_a[i] != -100 else only_theirs)[name] += 1
                continue
            for j in range(b0, b1):
                template_theirs[tokenizer.convert_ids_to_tokens(ids_b[j])] += 1
            for i in range(a0, a1):
                template_ours[tokenizer.convert_ids_to_tokens(ids_a[i])] += 1
    return {"supervised_only_by_lmms": dict(only_theirs), "supervised_only_by_vlforge": dict(only_ours),
            "tokens_only_in_lmms_template": dict(template_theirs),
            "tokens_only_in_vlforge_template": dict(template_ours)}


def run_peer(python: Path, checkpoint: Path, family: str, data: Path) -> dict:
    cmd = [str(python), str(HERE / "peers" / "lmms_runner.py"), "--checkpoint", str(checkpoint), "--family", family,
           "--data", str(data), "--fps", str(SAMPLE_FPS), "--min-pixels", str(MIN_PIXELS), "--max-pixels",
           str(MAX_PIXELS), "--loss"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"parity: LMMS Engine runner failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout)


def run_peer_train(python: Path, checkpoint: Path, family: str, data: Path, steps: int) -> dict:
    """LMMS Engine's own trainer for ``steps`` steps (``benchmarks/peers/lmms_train.py``); ``error`` if it failed."""
    cmd = [str(python), str(HERE / "peers" / "lmms_train.py"), "--checkpoint", str(checkpoint), "--family", family,
           "--data", str(data), "--steps", str(steps), "--learning-rate", "1e-5", "--fps", str(SAMPLE_FPS),
           "--min-pixels", str(MIN_PIXELS), "--max-pixels", str(MAX_PIXELS)]
    done = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        return {"error": f"LMMS Engine's trainer failed: {lines[-1].strip()}"}
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--steps", type=int, default=4, help="training steps per vlforge run (>= 2)")
    parser.add_argument("--no-peer", action="store_true", help="skip LMMS Engine even when its venv is built")
    args = parser.parse_args()
    peer = None if args.no_peer else peer_python()
    out: dict = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                             "python": platform.python_version()},
                 "peer": None if peer is None else json.loads((peer.parent.parent / "vlforge-peer.json").read_text()),
                 "records": []}
    with tempfile.TemporaryDirectory(prefix="vlforge-parity-") as tmp:
        work = Path(tmp)
        data = write_dataset(work / "data")
        for family in args.families:
            checkpoint = work / f"tiny-{family}"
            subprocess.run([str(Path(sys.executable).parent / "vlforge"), "tiny", family, str(checkpoint)],
                           check=True, capture_output=True)
            ref = hf_reference.reference(checkpoint, data, family)
            ref_count = sum(r["predicted"] for r in ref)
            out["records"].append({"engine": "transformers", "family": family, "packing": None,
                                   "loss": sum(r["loss_sum"] for r in ref) / ref_count,
                                   "supervised_tokens": ref_count, "tokens_per_s": None,
                                   "label_tokens": sum(sum(x != -100 for x in r["labels"]) for r in ref)})
            row_length = sum(len(r["input_ids"]) for r in ref)
            for packing in (False, True):
                record = vlforge_train(work, checkpoint, data, packing=packing, label_mode="assistant",
                                       steps=args.steps, row_length=row_length)
                out["records"].append({"engine": "vlforge", "family": family, "packing": packing, **record,
                                       "label_tokens": ref_count})
            ours = vlforge_samples(checkpoint, data, family, "assistant")
            lmms_mode = vlforge_samples(checkpoint, data, family, "lmms")
            record = vlforge_train(work, checkpoint, data, packing=False, label_mode="lmms", steps=args.steps,
                                   row_length=row_length)
            out["records"].append({"engine": "vlforge-lmms", "family": family, "packing": False, **record,
                                   "label_tokens": sum(sum(x != -100 for x in lab) for _, lab in lmms_mode)})
            if peer is None:
                continue
            from transformers import AutoTokenizer

            result = run_peer(peer, checkpoint, family, data)
            theirs = [(s["input_ids"], s["labels"]) for s in result["samples"]]
            count = sum(s["predicted"] for s in result["samples"])
            trained = run_peer_train(peer, checkpoint, family, data, args.steps)
            speed = ({"tokens_per_s": None, "tokens_per_s_error": trained["error"]} if "error" in trained else
                     {"tokens_per_s": trained["tokens_per_s"],
                      "trainer": {k: trained[k] for k in ("trainer", "loss", "losses", "steps", "step_tokens",
                                                          "step_seconds", "dtype", "device", "shims")}})
            out["records"].append({
                "engine": "lmms-engine", "family": family, "packing": False,
                "loss": sum(s["loss_sum"] for s in result["samples"]) / count, "supervised_tokens": count,
                **speed, "label_tokens": sum(sum(x != -100 for x in lab) for _, lab in theirs),
                "versions": {k: result[k] for k in ("transformers", "torch")}, "shims": result["shims"],
                "lmms_mode_equal": theirs == lmms_mode,
                "masking": masking_diff(AutoTokenizer.from_pretrained(checkpoint), ours, theirs)})
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
