"""Peak memory per rank of one long sequence: SP=1 (one process) vs Ulysses SP=2 (two gloo processes, CPU).

Each run builds the same random model of ``--family`` (``qwen3_vl``, ``qwen2_5_vl``, ``qwen2_vl`` or
``glm4v``; text: ``--hidden`` wide, ``--layers`` layers, 8 heads, 4 k/v heads, vocabulary 2048; a
1-block vision tower) in fp32, then does one forward and backward of the trainer's loss on a single
text sequence of ``--length`` tokens packed as one sample, its first quarter a prompt without labels
(so SP=1 runs transformers' own SDPA path and SP=2 vlforge's Ulysses attention). Reported per rank:
the peak resident memory of the forward+backward above the resident memory just before it
(``resource.getrusage`` ``ru_maxrss`` after minus ``ru_maxrss`` before; the process peak so far is
the model and the inputs), the loss (the two runs must agree) and the wall time. Every number is
measured in this run.

glibc's malloc keeps freed blocks of up to its (dynamic) mmap threshold in the heap, so the resident
peak depends on the order of allocations as well as on the live tensors; with
``MALLOC_MMAP_THRESHOLD_=65536`` in the environment every large tensor is its own mapping and the
peak follows the live tensors (``malloc_mmap_threshold`` in the JSON says which was measured).

Run:
    .venv/bin/python benchmarks/sp_memory.py                    # about 20 s on 2 cores
    .venv/bin/python benchmarks/sp_memory.py --family qwen2_5_vl --length 8192 --hidden 512
    MALLOC_MMAP_THRESHOLD_=65536 .venv/bin/python benchmarks/sp_memory.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


FAMILIES = ("qwen3_vl", "qwen2_5_vl", "qwen2_vl", "glm4v")


def _model(family: str, hidden: int, layers: int):
    import torch
    import transformers

    torch.manual_seed(0)
    text = {"hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": hidden // 8, "vocab_size": 2048,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": hidden}
    half = hidden // 16  # the Qwen2 families' mrope sections cover half a head (Qwen3-VL's: a quarter, as GLM-4V's)
    if family in ("qwen2_5_vl", "qwen2_vl"):
        text["rope_parameters"]["mrope_section"] = [half // 4, 3 * half // 8, half - half // 4 - 3 * half // 8]
    if family == "qwen3_vl":
        vision["deepstack_visual_indexes"] = [0]
        names = ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration")
    elif family == "qwen2_5_vl":
        vision["fullatt_block_indexes"] = [0]
        names = ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration")
    elif family == "qwen2_vl":
        vision = {"depth": 1, "embed_dim": 32, "hidden_size": hidden, "mlp_ratio": 2, "num_heads": 2}
        names = ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration")
    else:
        text["rope_parameters"] = {**text["rope_parameters"], "partial_rotary_factor": 0.5}
        names = ("Glm4vConfig", "Glm4vForConditionalGeneration")
    config_class, model_class = (getattr(transformers, name) for name in names)
    config = config_class(text_config=text, vision_config=vision)
    config._attn_implementation = "sdpa"
    config.text_config._attn_implementation = "sdpa"
    model = model_class(config)
    model.train()
    return model


def _batch(length: int):
    import torch

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(10, 2000, (1, length), generator=generator)
    labels = ids.clone()
    labels[:, : length // 4] = -100  # a prompt without labels
    positions = torch.arange(length).view(1, 1, -1).expand(4, 1, -1).clone()
    return {"input_ids": ids, "labels": labels, "position_ids": positions,
            "cu_seqlens": torch.tensor([0, length], dtype=torch.int32)}


def worker(args: argparse.Namespace) -> None:
    import torch

    from vlforge.dist import init_distributed
    from vlforge.train.loss import label_count, token_loss_sum
    from vlforge.train.sp import setup_sequence_parallel, shard_label_count, sp_token_loss_sum

    torch.set_num_threads(1)
    ctx = init_distributed()
    model = _model(args.family, args.hidden, args.layers)
    batch = _batch(args.length)
    state = setup_sequence_parallel(model, args.family, ctx.world_size, ctx) if ctx.world_size > 1 else None
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if state is None:
        total, count = token_loss_sum(model, batch, ctx.device), label_count(batch).float()
    else:
        total, count = sp_token_loss_sum(model, batch, ctx.device, None, state), shard_label_count(batch, state).float()
    (total / args.length).backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sums = ctx.all_reduce_sum(torch.stack([total.detach(), count]))
    record = {"sp": ctx.world_size, "rank": ctx.rank, "peak_rss_delta_mib": round((peak - before) / 1024, 1),
              "rss_before_mib": round(before / 1024, 1), "seconds": round(seconds, 3), "loss": float(sums[0] / sums[1])}
    (Path(args.out) / f"rank-{ctx.rank}.json").write_text(json.dumps(record), encoding="utf-8")
    ctx.close()


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(args: argparse.Namespace, nproc: int) -> list[dict]:
    out = tempfile.mkdtemp(prefix=f"sp-memory-{nproc}-")
    flags = ["--worker", "--family", args.family, "--length", str(args.length), "--hidden", str(args.hidden), "--layers", str(args.layers),
             "--out", out]
    if nproc == 1:
        command = [sys.executable, __file__, *flags]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
                   str(_port()), __file__, *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    records = [json.loads((Path(out) / f"rank-{rank}.json").read_text(encoding="utf-8")) for rank in range(nproc)]
    shutil.rmtree(out)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=FAMILIES, default="qwen3_vl")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    one, two = _launch(args, 1), _launch(args, 2)
    result = {"family": args.family, "length": args.length, "hidden": args.hidden, "layers": args.layers,
              "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"), "sp1": one, "sp2": two,
              "peak_ratio_sp2_over_sp1": round(max(r["peak_rss_delta_mib"] for r in two)
                                               / max(one[0]["peak_rss_delta_mib"], 1e-9), 3),
              "loss_rel_diff": abs(two[0]["loss"] - one[0]["loss"]) / abs(one[0]["loss"])}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
