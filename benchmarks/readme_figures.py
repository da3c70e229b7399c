"""Refresh the measured figures that README.md and docs/ quote, from one measured run.

Every figure lives in a marked region of a Markdown file and is generated, never typed by hand:

    <!-- figures:NAME:start -->
    ...rendered from the measurement NAME...
    <!-- figures:NAME:end -->

NAME is one measurement; the same measurement can feed regions in several files (README.md gets a
short table, the command's page the full one):

- ``patch_embed``: ``benchmarks/patch_embed.py --repeats 9`` (README.md, docs/patch.md)
- ``train_throughput``: ``benchmarks/train_throughput.py`` (README.md, docs/train.md)
- ``train_throughput_qwen3_5``: the same with ``--model tiny:qwen3_5`` (packed rows through Gated DeltaNet;
  docs/train.md)
- ``extract``: ``benchmarks/extract.py`` (README.md, docs/extract.md)
- ``tiny_train``: the tiny training example of docs/train.md, ``vlforge train
  examples/qwen3_vl_tiny.yaml``, timed from start to exit (wall seconds, first and last logged loss)

Three regions come from committed records instead (``RECORDS``), measured where this script does not measure:
``gpu_suite`` and ``train_gpu`` (a lent GPU: ``scripts/gpu_check.sh``) and ``video_peers``
(``benchmarks/video_decode.py --sweep --peers``, which needs the qwen-vl-utils peer venv of ``scripts/peer_env.py``;
docs/data.md). A record not committed yet (``OPTIONAL_RECORDS``) renders as a sentence saying so.

Measuring runs each one in its own process, one after the other, and records the machine with it (CPU
model from /proc/cpuinfo, logical CPUs, torch version and threads, Python, UTC start and end, 1-minute
load average before and after). Run it on a quiet machine: the figures are what it measured, whatever
else was running, and the rendered text says how loaded the machine was. Nothing is estimated.

Run (from the repository root; measuring everything takes about 10 minutes on 2 cores):
    .venv/bin/python benchmarks/readme_figures.py --write-json figures.json
    .venv/bin/python benchmarks/readme_figures.py --only tiny_train --write-json figures.json   # merged into it
    .venv/bin/python benchmarks/readme_figures.py --from-json figures.json            # render only, no measuring
    .venv/bin/python benchmarks/readme_figures.py --from-json figures.json --check    # exit 1 if a region differs

Exit codes: 0 done (or, with ``--check``, every region matches), 1 ``--check`` found a difference,
2 an error (a missing region marker, a measurement missing from the JSON, a benchmark that failed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCHEMA = "vlforge.readme_figures/1"
PATCH_EMBED_REPEATS = 9


class FiguresError(Exception):
    """A one-line problem with the regions, the JSON or a measurement (exit code 2)."""


# --------------------------------------------------------------------------- measuring


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_facts() -> dict[str, Any]:
    """Facts of the machine that do not change during a run (the load average is taken per run)."""
    import torch

    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _vlforge_cli() -> str:
    beside = Path(sys.executable).with_name("vlforge")
    return str(beside) if beside.exists() else "vlforge"


def _commands(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """Measurement name -> (argv run from the repository root, the command as the docs quote it)."""
    python = sys.executable
    return {
        "patch_embed": (
            [python, "benchmarks/patch_embed.py", "--repeats", str(PATCH_EMBED_REPEATS)],
            f".venv/bin/python benchmarks/patch_embed.py --repeats {PATCH_EMBED_REPEATS}",
        ),
        "train_throughput": (
            [python, "benchmarks/train_throughput.py"],
            ".venv/bin/python benchmarks/train_throughput.py",
        ),
        "train_throughput_qwen3_5": (
            [python, "benchmarks/train_throughput.py", "--model", "tiny:qwen3_5"],
            ".venv/bin/python benchmarks/train_throughput.py --model tiny:qwen3_5",
        ),
        "extract": ([python, "benchmarks/extract.py"], ".venv/bin/python benchmarks/extract.py"),
        "tiny_train": (
            [_vlforge_cli(), "train", "examples/qwen3_vl_tiny.yaml",
             f"checkpointing.output_dir={tmp / 'tiny-run'}", "--json"],
            "vlforge train examples/qwen3_vl_tiny.yaml checkpointing.output_dir=/tmp/tiny-run --json",
        ),
    }


MEASUREMENTS = ("patch_embed", "train_throughput", "train_throughput_qwen3_5", "extract", "tiny_train")


def _utc() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _load() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def measure(name: str, tmp: Path) -> dict[str, Any]:
    """Run one measurement in its own process; its JSON (stdout) plus how, when and where it ran."""
    argv, shown = _commands(tmp)[name]
    print(f"readme_figures: measuring {name}: {shown}", file=sys.stderr, flush=True)
    entry: dict[str, Any] = {"command": shown, "machine": machine_facts(), "utc_start": _utc(),
                             "load_average_before": _load()}
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, text=True, check=False)
    entry["wall_s"] = round(time.perf_counter() - start, 2)
    entry["utc_end"] = _utc()
    entry["load_average_after"] = _load()
    if proc.returncode != 0:
        raise FiguresError(f"{name}: `{shown}` exited {proc.returncode} (its stderr is above)")
    try:
        entry["result"] = json.loads(proc.stdout)
    except json.JSONDecodeError as error:
        raise FiguresError(f"{name}: `{shown}` did not print JSON on stdout ({error})") from None
    return entry


# --------------------------------------------------------------------------- rendering helpers


def _when(entry: dict[str, Any]) -> str:
    stamp = dt.datetime.fromisoformat(entry["utc_start"]).astimezone(dt.timezone.utc)
    return stamp.strftime("%Y-%m-%d %H:%M UTC")


def _load_phrase(entry: dict[str, Any]) -> str:
    """'quiet: 1-minute load average 0.4 before the run, 1.9 after' (shared above half a load per CPU)."""
    before, after = entry.get("load_average_before"), entry.get("load_average_after")
    if not before:
        return "load average not available"
    cpus = entry["machine"].get("logical_cpus") or 1
    state = "quiet" if before[0] <= 0.5 * cpus else "**shared with other jobs**"
    tail = f", {after[0]:g} after" if after else ""
    return f"{state}: 1-minute load average {before[0]:g} before the run{tail}"


def _count(n: Any, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def machine_phrase(entry: dict[str, Any], threads: int | None) -> str:
    """'Intel Xeon (2 logical CPUs, 2 torch threads), torch 2.13.0+cpu, 2026-11-21 12:40 UTC, quiet: ...'."""
    machine = entry["machine"]
    threads = threads if threads is not None else machine.get("torch_threads")
    return (f"{machine['cpu_model']} ({_count(machine['logical_cpus'], 'logical CPU')}, "
            f"{_count(threads, 'torch thread')}), torch {machine['torch']}, {_when(entry)}, {_load_phrase(entry)}")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _ms(value: float) -> str:
    return f"{value:.1f}"


def _bold(text: str, on: bool) -> str:
    return f"**{text}**" if on else text


# --------------------------------------------------------------------------- renderers

_PASS = {"forward": "forward", "forward_backward": "forward+backward"}


def _patch_rows(result: dict[str, Any]):
    for dtype, case in result["results"].items():
        for mode in ("forward", "forward_backward"):
            yield dtype, mode, case[mode]


def _patch_targets(result: dict[str, Any]) -> str:
    """The fp32-forward targets and whether this run met them (empty when the result has none)."""
    targets = result.get("targets")
    if not targets:
        return ""
    speedup, over = targets["fp32_forward_speedup_vs_conv3d"], targets["fp32_forward_patched_over_linear"]
    met_speed = "met" if targets["fp32_forward_at_least_4x_faster_than_conv3d"] else "**not met**"
    met_over = "met" if targets["fp32_forward_within_10pct_of_linear"] else "**not met**"
    return (f"\n\nTargets on this CPU: fp32 forward patched is {speedup:.1f}x faster than Conv3d (target >= 4x: "
            f"{met_speed}) and {over:.3f}x the bare `F.linear` time (target <= 1.10: {met_over}).")


def render_patch_embed_readme(entry: dict[str, Any]) -> str:
    result = entry["result"]
    rows = []
    for dtype, mode, case in _patch_rows(result):
        key = dtype == "fp32" and mode == "forward"
        rows.append([f"{dtype} {_PASS[mode]}", _ms(case["conv3d"]["median_ms"]), _ms(case["patched"]["median_ms"]),
                     _ms(case["linear"]["median_ms"]), _bold(f"{case['speedup_patched_vs_conv3d']:.1f}x", key),
                     _bold(f"{case['patched_over_linear']:.2f}", key)])
    threads = result.get("machine", {}).get("torch_threads")
    return (f"Median of {result['repeats']} runs after {result['warmup']} warm-ups, measured on "
            f"{machine_phrase(entry, threads)}; `{entry['command']}`:\n\n"
            + _table(["case", "Conv3d ms", "patched ms", "bare `F.linear` ms", "Conv3d / patched",
                      "patched / linear"], rows)
            + _patch_targets(result))


def render_patch_embed_detail(entry: dict[str, Any]) -> str:
    result = entry["result"]
    rows = []
    for dtype, mode, case in _patch_rows(result):
        cells = [f"{case[v]['median_ms']:.1f} ({case[v]['min_ms']:.1f})" for v in ("conv3d", "patched", "linear")]
        rows.append([dtype, _PASS[mode], *cells, f"{case['speedup_patched_vs_conv3d']:.2f}x",
                     f"{case['patched_over_linear']:.3f}"])
    threads = result.get("machine", {}).get("torch_threads")
    text = (f"Measured on {machine_phrase(entry, threads)}; Python {entry['machine']['python']}, "
            f"`{entry['command']}` (warm-up {result['warmup']}):\n\n"
            + _table(["dtype", "pass", "Conv3d median (min) ms", "patched median (min) ms",
                      "`F.linear` median (min) ms", "Conv3d / patched", "patched / linear"], rows))
    text += _patch_targets(result)
    diffs = ", ".join(f"{dtype} {case['max_abs_diff_vs_conv3d']['patched']:.2g}"
                      for dtype, case in result["results"].items())
    return text + f" Max abs difference of the patched output from the Conv3d output: {diffs}."


_THROUGHPUT_LABELS = {
    "hf_trainer": "`transformers.Trainer`, padded batches of {batch_size}",
    "plain_padded_loop": "plain padded loop (same batches, HF loss, unfused AdamW)",
    "vlforge_padded": "vlforge, same padded batches",
    "vlforge_packed": "vlforge, packed rows of {packing_length} tokens",
}


def _throughput_facts(entry: dict[str, Any]) -> tuple[dict[str, Any], str, float]:
    result = entry["result"]
    threads = result.get("machine", {}).get("threads")
    packing = result["speedup_from_packing_alone"]
    return result, machine_phrase(entry, threads), packing


def render_train_throughput_readme(entry: dict[str, Any]) -> str:
    result, machine, packing = _throughput_facts(entry)
    settings = result["settings"]
    rows = []
    for name in ("hf_trainer", "vlforge_padded", "vlforge_packed"):
        run = result["results"][name]
        speedup = result["speedup_vs_hf_trainer"][name]
        rows.append([_THROUGHPUT_LABELS[name].format(**settings), f"{run['padding_efficiency']:.2f}",
                     f"{run['tokens_per_s']:.1f}", _bold(f"{speedup:.2f}x", name == "vlforge_packed")])
    target = result.get("target", {}).get("vlforge_packed_vs_hf_trainer", 1.3)
    side = "below" if packing < target else "at or above"
    return (f"Measured on {machine}; `{entry['command']}`:\n\n"
            + _table(["variant", "padding efficiency", "tokens/s", "vs `Trainer`"], rows)
            + f"\n\nPacking alone (vlforge packed vs vlforge padded) gave {packing:.2f}x in that run, {side} the "
              f"{target:g}x the trainer issue aimed at for packing by itself.")


def render_train_throughput_detail(entry: dict[str, Any]) -> str:
    result, machine, packing = _throughput_facts(entry)
    settings = result["settings"]
    target = result.get("target", {}).get("vlforge_packed_vs_hf_trainer", 1.3)
    rows = []
    for name in ("hf_trainer", "plain_padded_loop", "vlforge_padded", "vlforge_packed"):
        run = result["results"][name]
        speedup = f"{result['speedup_vs_hf_trainer'][name]:.2f}x"
        if name == "vlforge_packed":
            met = "met" if result["speedup_vs_hf_trainer"][name] >= target else "**not met**"
            speedup = f"**{speedup}** (target {target:g}x: {met})"
        rows.append([_THROUGHPUT_LABELS[name].format(**settings), str(run["steps"]),
                     f"{run['padding_efficiency']:.2f}", f"{run['tokens_per_s']:.1f}", speedup])
    trainer = result.get("hf_trainer", {})
    same = ["hf_trainer", "plain_padded_loop", "vlforge_padded"]
    first = [result["results"][n]["first_loss"] for n in same]
    last = [result["results"][n]["last_loss"] for n in same]
    agree = max(first) - min(first) <= 1e-3 and max(last) - min(last) <= 1e-2
    verdict = "log the same losses on the same batches" if agree else "log **different** losses on the same batches"
    return (f"Measured on {machine}; transformers {trainer.get('transformers', '?')} "
            f"(`Trainer` optimizer `{trainer.get('optim', '?')}`); `{entry['command']}`:\n\n"
            + _table(["variant", "steps", "padding efficiency", "tokens/s", "vs `Trainer`"], rows)
            + f"\n\nPacking alone (vlforge packed vs vlforge padded) gives {packing:.2f}x in this run. `Trainer`, the "
              f"plain loop and vlforge's padded step {verdict} (first {' / '.join(f'{x:.4f}' for x in first)}, "
              f"last {' / '.join(f'{x:.4f}' for x in last)}).")


def _extract_facts(entry: dict[str, Any]) -> tuple[dict[str, Any], str, str]:
    result = entry["result"]
    threads = result.get("machine", {}).get("torch_threads")
    setup = (f"{result['images']} generated {result['image_size']}x{result['image_size']} images, "
             f"`hidden_mean`, batch {result['batch_size']}, {_count(result['num_workers'], 'worker')}")
    return result, machine_phrase(entry, threads), setup


def render_extract_readme(entry: dict[str, Any]) -> str:
    result, machine, setup = _extract_facts(entry)
    runs = result["results"]
    return (f"`vlforge extract` ran at {runs['vlforge_extract']['samples_per_s']:.1f} samples/s: "
            f"**{result['speedup_vs_plain_loop']:.1f}x** the seed's per-sample loop "
            f"({runs['plain_loop']['samples_per_s']:.1f}), {result['speedup_vs_plain_loop_backbone']:.2f}x that loop "
            f"without the `lm_head`. {setup}; measured on {machine}; `{entry['command']}`.")


def render_extract_detail(entry: dict[str, Any]) -> str:
    result, machine, setup = _extract_facts(entry)
    runs = result["results"]
    rows = [
        ["plain per-sample loop (full model forward)", f"{runs['plain_loop']['samples_per_s']:.1f}"],
        ["plain per-sample loop, backbone only (`model.model`, no `lm_head`)",
         f"{runs['plain_loop_backbone']['samples_per_s']:.1f}"],
        [f"`vlforge extract` (batch {result['batch_size']}, {_count(result['num_workers'], 'worker')})",
         f"{runs['vlforge_extract']['samples_per_s']:.1f}"],
    ]
    return (f"{setup}; measured on {machine}; `{entry['command']}`:\n\n"
            + _table(["variant", "samples/s"], rows)
            + f"\n\n`vlforge extract` runs at {result['speedup_vs_plain_loop']:.2f}x the seed-style loop and "
              f"{result['speedup_vs_plain_loop_backbone']:.2f}x the loop without the `lm_head`; the largest "
              f"difference between their `hidden_mean` features is "
              f"{result['max_abs_diff_hidden_mean_vs_plain']:.2g}.")


def render_tiny_train(entry: dict[str, Any]) -> str:
    result = entry["result"]
    losses, steps = result["losses"], result["steps"]
    if not losses:
        raise FiguresError("tiny_train: the run logged no loss")
    interval = (_count(steps // len(losses), "step") if steps % len(losses) == 0 else "logging interval")
    cpus = _count(entry["machine"]["logical_cpus"], "logical CPU")
    return (f"Example on CPU ({entry['wall_s']:.0f} s from start to exit on {cpus}; loss {losses[0]:.2f} -> "
            f"{losses[-1]:.2f} over {steps} steps, the means of the first and of the last {interval}; measured on "
            f"{machine_phrase(entry, None)}):")


def render_gpu_suite(entry: dict[str, Any], *, dtypes: tuple[str, ...] = ("fp32", "bf16")) -> str:
    """The GPU suite's record (run by scripts/gpu_check.sh on a lent GPU, committed under benchmarks/records/);
    the patch-embedding rows of ``dtypes``."""
    env, train, tower = entry["environment"], entry["training"], entry["vision_tower"]
    when = entry["utc_end"].replace("T", " ")[:16]
    head = (f"Measured on one {env['gpu']} ({env['gpu_memory_bytes'] / 2**30:.0f} GiB), torch {env['torch']}, CUDA "
            f"{env['cuda']}, runtime cuDNN {env['cudnn_runtime']}, {when} UTC; `scripts/gpu_check.sh` "
            f"(`benchmarks/gpu_suite.py --size {entry['size']}`), record `{entry['record']}`:")
    rows = []
    for key, op in entry["patch_op"].items():
        if key.rsplit("/", 1)[-1] not in dtypes:
            continue
        for mode in ("forward", "forward_backward"):
            e = op[mode]
            rows.append([f"{key.replace('/', ' ')} {mode.replace('_', '+')}", f"{e['conv3d_ms']:.3f}",
                         f"{e['patched_ms']:.3f}", f"{e['linear_ms']:.3f}", f"{e['conv3d_over_patched']:.2f}x"])
    windows = next(iter(entry["patch_op"].values()))["windows"]
    patch = _table([f"patch embedding, {windows} windows", "Conv3d ms", "patched ms", "F.linear ms", "Conv3d / patched"],
                   rows)
    fwd, bwd = tower["forward"], tower["forward_backward"]
    lines = [
        f"- vision tower `{tower['preset']}` {tower['dtype']}, one {tower['image_px']} px image: stock / patched "
        f"{fwd['stock_ms']:.1f} / {fwd['patched_ms']:.1f} ms forward, {bwd['stock_ms']:.1f} / {bwd['patched_ms']:.1f} ms "
        f"forward+backward (the patch embedding is a small share of the tower on this GPU)",
        f"- training `{train['preset']}`, FSDP2 on one GPU, {train['precision']}, gradient checkpointing, "
        f"{train['packed_row_tokens']}-token packed rows of {train['samples_per_row']} samples through "
        f"`{train['attention']}`: **{train['tokens_per_s']:,.0f} tokens/s**, MFU {train['mfu'] * 100:.1f}% of "
        f"{train['peak_bf16_tflops']:g} TFLOP/s, peak {train['peak_memory_bytes'] / 2**30:.1f} GiB allocated",
        f"- extraction `{entry['extraction']['model']}` {entry['extraction']['dtype']}: "
        f"{entry['extraction']['samples_per_s']:.1f} samples/s ({entry['extraction']['images']} images of "
        f"{entry['extraction']['image_px']} px)",
    ]
    return head + "\n\n" + patch + "\n\n" + "\n".join(lines)


def render_video_peers(entry: dict[str, Any]) -> str:
    """``benchmarks/video_decode.py --sweep --peers`` (vlforge's seek reader vs qwen-vl-utils' backends),
    committed under benchmarks/records/ (the peer venv is built by scripts/peer_env.py, not in CI)."""
    info, rows = entry["machine"], entry["rows"]
    backends = list(rows[0]["peers"])
    ran = [b for b in backends if any("seconds" in row["peers"][b] for row in rows)]
    loads = [row["load_before"] for row in rows] + [info["load_after"]]
    peer = info.get("peer") or {}
    versions = peer.get("versions") or {}
    head = (f"Measured {info['utc_start'][:10]} on {info['cpu']} ({info['logical_cpus']} logical CPUs, shared: 1-minute "
            f"load {min(loads):.1f} to {max(loads):.1f} during the run), best of {entry['repeat']}; vlforge: PyAV "
            f"{info['pyav']} (libavcodec {info['ffmpeg']['libavcodec']}); peer venv: qwen-vl-utils "
            f"{versions.get('qwen-vl-utils', '?')}, torch {versions.get('torch', '?')}, "
            + ", ".join(f"{b} {versions[b]}" for b in ("decord", "torchcodec", "torchvision") if b in versions)
            + f"; record `{entry['record']}`. Cells: seconds (frames decoded per kept frame); "
            "`=` frames identical to vlforge's, `≠` not.")

    def cell(e: dict) -> str:
        if "seconds" not in e:
            return "-"
        per = f"{e['decoded_per_kept']:.1f}" if e.get("decoded_per_kept") is not None else "?"
        same = "=" if e.get("frames_identical") and e.get("indices_equal") else "≠"
        return f"{e['seconds']:.2f} ({per}) {same}"

    table = []
    for row in rows:
        ratio = row["vlforge_vs_fastest_peer"]
        table.append([f"{row['size'][0]}x{row['size'][1]}", str(row["gop"]), str(row["bframes"]), f"{row['sample_fps']:g}",
                      f"{row['frames_kept']:,}", f"{row['seek_seconds']:.2f} ({row['decoded_per_kept_seek']:.1f})",
                      *[cell(row["peers"][b]) for b in ran],
                      "-" if ratio is None else _bold(f"{ratio:.2f}x", not row["vlforge_at_least_as_fast"])])
    body = _table(["size", "GOP", "B-frames", "sample fps", "kept", "vlforge seek", *ran,
                   "fastest peer / vlforge"], table)
    wins = sum(bool(row["vlforge_at_least_as_fast"]) for row in rows)
    exact = all(row["peers"][b].get("frames_identical") and row["peers"][b].get("indices_equal")
                for row in rows for b in ran if "seconds" in row["peers"][b])
    lines = [f"- vlforge at least as fast as the fastest peer reader on **{wins} of {len(rows)}** rows"
             + ("" if wins == len(rows) else " (bold: the rows where a peer was faster)")
             + f"; every peer frame {'identical' if exact else 'NOT identical'} to vlforge's (same indices, same "
             "RGB bytes before any resize)"]
    for b in backends:
        reasons = {row["peers"][b].get("skipped") or row["peers"][b].get("error") for row in rows} - {None}
        if reasons:
            lines.append(f"- `{b}`: not run ({'; '.join(sorted(reasons))})")
    return head + "\n\n" + body + "\n\n" + "\n".join(lines)


TARGETS = {"text": 0.35, "image": 0.30}
"""MFU targets of issue 36 (vlforge's counting) for `vlforge train` on real:qwen3_vl_2b; and 1.5x the Trainer."""


def render_train_gpu(entry: dict[str, Any]) -> str:
    """``benchmarks/train_gpu.py --size real`` on a lent GPU (``scripts/gpu_check.sh``), or the missing record."""
    if entry.get("missing"):
        return (f"No GPU record yet: no GPU figure of `vlforge train` is quoted until `scripts/gpu_check.sh` writes "
                f"`{entry['record']}` on a lent GPU; the suite runs the same script at `--size tiny` on the CPU.")
    env = entry["environment"]
    when = entry["utc_end"].replace("T", " ")[:16]
    head = (f"Measured on one {env.get('gpu', env.get('device'))}, torch {env['torch']}, CUDA {env.get('cuda')}, "
            f"{when} UTC; `benchmarks/train_gpu.py --size {entry['size']}` (record `{entry['record']}`). MFU: "
            "vlforge's counting (causal attention per sample, the vision tower included) / LMMS Engine 0.1.4's "
            "(2 x vocab x hidden, attention over whole rows, no tower), both of the dense bf16 peak:")

    def pct(value: Any) -> str:
        return "-" if value is None else f"{value * 100:.1f}%"

    rows = []
    for run in entry["runs"]:
        if "error" in run or run.get("skipped"):
            reason = run.get("error") or run.get("skipped")
            rows.append([run["data"], run["engine"], str(run.get("variant", "")), "not run: " + reason[:80], "", "",
                         "", "", ""])
            continue
        peak = run.get("peak_memory_bytes")
        idle = run.get("gpu_idle_share")
        rows.append([run["data"], run["engine"], str(run["variant"]), f"{run['tokens_per_s']:,.0f}",
                     pct(run.get("mfu_vlforge")), pct(run.get("mfu_lmms")), pct(run.get("vision_flops_share")),
                     "-" if peak is None else f"{peak / 2**30:.1f}", pct(idle)])
    table = _table(["data", "engine", "variant", "tokens/s", "MFU vlforge", "MFU LMMS", "vision FLOPs",
                    "peak GiB", "GPU idle"], rows)
    lines = []
    for kind, ratio in entry.get("ratios", {}).items():
        best = next(r for r in entry["runs"] if r.get("engine") == "vlforge" and r["data"] == kind
                    and r.get("variant") == ratio["best_variant"])
        target = TARGETS.get(kind)
        parts = [f"best vlforge variant `{ratio['best_variant']}`, MFU {pct(best.get('mfu_vlforge'))}"]
        if target is not None and best.get("mfu_vlforge") is not None:
            parts.append(f"target {target * 100:.0f}%: {'met' if best['mfu_vlforge'] >= target else 'NOT met'}")
        if "best_vs_trainer" in ratio:
            parts.append(f"{ratio['best_vs_trainer']:.2f}x `transformers.Trainer` (target 1.5x: "
                         f"{'met' if ratio['best_vs_trainer'] >= 1.5 else 'NOT met'})")
        lines.append(f"- {kind}: " + ", ".join(parts))
    for item in entry.get("not_run", []):
        lines.append(f"- not run: {item['run']} ({item['reason']})")
    return head + "\n\n" + table + ("\n\n" + "\n".join(lines) if lines else "")


@dataclass(frozen=True)
class Region:
    """A marked region ``<!-- figures:NAME:start/end -->`` of ``file`` rendered from measurement ``name``."""

    file: str
    name: str
    render: Callable[[dict[str, Any]], str]


REGIONS: tuple[Region, ...] = (
    Region("README.md", "patch_embed", render_patch_embed_readme),
    Region("docs/patch.md", "patch_embed", render_patch_embed_detail),
    Region("README.md", "train_throughput", render_train_throughput_readme),
    Region("docs/train.md", "train_throughput", render_train_throughput_detail),
    Region("docs/train.md", "train_throughput_qwen3_5", render_train_throughput_detail),
    Region("README.md", "extract", render_extract_readme),
    Region("docs/extract.md", "extract", render_extract_detail),
    Region("docs/train.md", "tiny_train", render_tiny_train),
    Region("README.md", "gpu_suite", lambda entry: render_gpu_suite(entry, dtypes=("bf16",))),
    Region("docs/patch.md", "gpu_suite", render_gpu_suite),
    Region("README.md", "train_gpu", render_train_gpu),
    Region("docs/train.md", "train_gpu", render_train_gpu),
    Region("docs/data.md", "video_peers", render_video_peers),
)
RECORDS: dict[str, str] = {"gpu_suite": "benchmarks/records/gpu_suite_h200.json",
                           "train_gpu": "benchmarks/records/train_gpu_h200.json",
                           "video_peers": "benchmarks/records/video_peers.json"}
OPTIONAL_RECORDS = frozenset({"train_gpu"})
"""Records a GPU session writes later: until then their region says there is none."""
"""Measurements this script does not take (a GPU; a peer venv of several GB): rendered from the committed
record file."""


def read_record(name: str) -> dict[str, Any]:
    path = REPO / RECORDS[name]
    if name in OPTIONAL_RECORDS and not path.exists():
        return {"missing": True, "record": RECORDS[name]}
    try:
        return {**json.loads(path.read_text(encoding="utf-8")), "record": RECORDS[name]}
    except (OSError, json.JSONDecodeError) as error:
        raise FiguresError(f"{path}: cannot read the record of {name!r} ({error})") from None


# --------------------------------------------------------------------------- regions


def _marker(name: str, end: str) -> str:
    return f"<!-- figures:{name}:{end} -->"


def find_region(text: str, name: str, where: str = "text") -> tuple[int, int]:
    """Character span of the lines strictly between the start and end marker lines of region ``name``."""
    spans = {}
    for end in ("start", "end"):
        hits = [m for m in re.finditer(rf"^[ \t]*{re.escape(_marker(name, end))}[ \t]*$", text, re.MULTILINE)]
        if not hits:
            raise FiguresError(f"{where}: no `{_marker(name, end)}` line; the figures of {name!r} go between "
                               f"`{_marker(name, 'start')}` and `{_marker(name, 'end')}`, each on its own line")
        if len(hits) > 1:
            raise FiguresError(f"{where}: `{_marker(name, end)}` appears {len(hits)} times; keep exactly one")
        spans[end] = hits[0]
    start, stop = spans["start"], spans["end"]
    if stop.start() < start.end():
        raise FiguresError(f"{where}: `{_marker(name, 'end')}` comes before `{_marker(name, 'start')}`")
    return start.end() + 1, stop.start()


def replace_region(text: str, name: str, body: str, where: str = "text") -> str:
    """``text`` with region ``name``'s content replaced by ``body``; every other byte kept."""
    begin, end = find_region(text, name, where)
    return text[:begin] + body.strip("\n") + "\n" + text[end:]


def region_body(text: str, name: str, where: str = "text") -> str:
    begin, end = find_region(text, name, where)
    return text[begin:end]


def render_all(data: dict[str, Any], only: list[str] | None = None) -> list[tuple[Region, str]]:
    """(region, rendered body) for every region whose measurement is selected and present in ``data``."""
    if data.get("schema") != SCHEMA:
        raise FiguresError(f"the JSON is not a {SCHEMA} record (schema: {data.get('schema')!r})")
    figures = data.get("figures", {})
    wanted = list(only) if only else [name for name in MEASUREMENTS if name in figures]
    missing = [name for name in wanted if name not in figures]
    if missing:
        raise FiguresError(f"the JSON has no measurement {', '.join(missing)} (it has: "
                           f"{', '.join(figures) or 'none'})")
    if not wanted:
        raise FiguresError("the JSON holds no measurement")
    out = []
    for region in REGIONS:
        if region.name in RECORDS and not only:
            out.append((region, region.render(read_record(region.name))))
        elif region.name in wanted:
            try:
                out.append((region, region.render(figures[region.name])))
            except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
                raise FiguresError(f"{region.name}: cannot render {region.file} from the JSON "
                                   f"({type(error).__name__}: {error})") from None
    return out


def update_files(root: Path, rendered: list[tuple[Region, str]], check: bool) -> list[str]:
    """Write the regions (or, with ``check``, compare them); returns a diff per region that differs."""
    texts: dict[str, str] = {}
    originals: dict[str, str] = {}
    diffs = []
    for region, body in rendered:
        if region.file not in texts:
            path = root / region.file
            if not path.is_file():
                raise FiguresError(f"{path}: no such file")
            texts[region.file] = originals[region.file] = path.read_text(encoding="utf-8")
        where = region.file
        current = region_body(texts[region.file], region.name, where)
        texts[region.file] = replace_region(texts[region.file], region.name, body, where)
        new = region_body(texts[region.file], region.name, where)
        if new != current:
            diffs.append("".join(difflib.unified_diff(
                current.splitlines(keepends=True), new.splitlines(keepends=True),
                f"{region.file} ({region.name}, now)", f"{region.file} ({region.name}, rendered)")))
    if not check:
        for file, text in texts.items():
            if text != originals[file]:
                path = root / file
                tmp = path.with_name(f".{path.name}.figures-tmp")
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, path)
    return diffs


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=MEASUREMENTS, metavar="NAME",
                        help=f"measure / render only this measurement (repeatable): {', '.join(MEASUREMENTS)}")
    parser.add_argument("--from-json", type=Path, metavar="FILE",
                        help="render the regions from this JSON (written by --write-json) instead of measuring")
    parser.add_argument("--write-json", type=Path, metavar="FILE",
                        help="write the measured JSON here (with --only, merged into FILE's other measurements)")
    parser.add_argument("--check", action="store_true",
                        help="with --from-json: change nothing, exit 1 when a region differs from its rendering")
    parser.add_argument("--root", type=Path, default=REPO,
                        help="repository root holding README.md and docs/ (default: this script's repository)")
    args = parser.parse_args(argv)
    if args.check and args.from_json is None:
        parser.error("--check compares with a JSON record: give --from-json FILE")
    if args.from_json is not None and args.write_json is not None:
        parser.error("--from-json renders without measuring; --write-json has nothing new to write")
    try:
        if args.from_json is not None:
            try:
                data = json.loads(args.from_json.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as error:
                raise FiguresError(f"{args.from_json}: cannot read the JSON ({error})") from None
        else:
            data = {"schema": SCHEMA, "figures": {}}
            if args.write_json is not None and args.write_json.is_file() and args.only:
                data = json.loads(args.write_json.read_text(encoding="utf-8"))
            with tempfile.TemporaryDirectory(prefix="vlforge-figures-") as tmp:
                for name in args.only or MEASUREMENTS:
                    data["figures"][name] = measure(name, Path(tmp))
                    if args.write_json is not None:  # after each one: a later failure keeps the earlier runs
                        args.write_json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        diffs = update_files(args.root, render_all(data, args.only), check=args.check)
    except FiguresError as error:
        print(f"readme_figures: {error}", file=sys.stderr)
        return 2
    if args.check:
        for diff in diffs:
            sys.stdout.write(diff)
        print(f"readme_figures: {len(diffs)} region(s) differ from the JSON" if diffs
              else "readme_figures: every region matches the JSON", file=sys.stderr)
        return 1 if diffs else 0
    print(f"readme_figures: {len(diffs)} region(s) updated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
