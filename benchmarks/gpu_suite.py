"""One GPU check suite: environment, patch op, vision tower, a training step benchmark and extraction, as JSON.

Sections (every one measured on this machine; nothing is estimated except MFU's FLOP count, by formula):

- ``environment``: torch, CUDA, runtime cuDNN, GPU name, memory and clocks (``nvidia-smi`` when present).
- ``patch_op``: the patch embedding at the Qwen2.5-VL (3x2x14x14 -> 1280) and Qwen3-VL (3x2x16x16 -> 1024) window
  shapes, fp32 and bf16, forward and forward+backward: stock ``Conv3d`` vs ``vlforge.patch`` vs a bare ``F.linear``
  (runs interleaved round-robin; median ms and the ratios).
- ``vision_tower``: the Qwen3-VL vision tower stock vs patched (``--size tiny``: tiny:qwen3_vl's tower on a 448 px
  image; ``--size real``: real:qwen3_vl_2b's tower on a 1024 px image), forward and forward+backward.
- ``training``: FSDP2 (world size 1, in-process gloo/nccl group), bf16 mixed precision where the device supports
  it, gradient checkpointing, AdamW, packed text rows (8192 tokens of 4 samples at real size on
  real:qwen3_vl_2b, 512 at tiny) through vlforge's per-sample attention; tokens/s, peak memory and MFU =
  achieved FLOP/s over the device's peak bf16 dense FLOP/s (table :data:`PEAK_BF16_TFLOPS`, null with a reason
  when the device is not in it or is a CPU). FLOPs per token = 6 x parameters of the text decoder and lm_head
  (embedding lookups excluded; text-only rows leave the vision tower idle) + 12 x layers x attention width x mean
  causal context; recomputation by checkpointing is not counted (MFU, not HFU).
- ``extraction``: ``run_extract`` samples/s on generated images (benchmarks/extract.py's ``make_images``).
- ``patch_trace``: ``torch.profiler`` over the Qwen3-VL patch embedding (bf16 where the device has it), patched vs a
  bare ``F.linear``, forward+backward: per variant the aten ops dispatched, the host time and (CUDA) the kernels
  and their device time, so the gap between the two is attributed to the host or to kernels; with ``--trace-dir``
  the chrome traces are written there.

Timing uses CUDA events on CUDA (behind ``torch.cuda.is_available()``) and ``time.perf_counter`` on CPU.
``--size tiny`` on a CPU runs every code path in well under two minutes; ``--size real`` is meant for one GPU.

Run:
    .venv/bin/python benchmarks/gpu_suite.py --size tiny                       # CPU check of every path
    .venv/bin/python benchmarks/gpu_suite.py --size real --markdown suite.md   # on a GPU
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vlforge
from extract import make_images
from patch_embed import machine_facts, time_interleaved
from vlforge.patches.timing import synchronize

#: Peak dense bf16 tensor-core TFLOP/s (vendor datasheets, without sparsity), matched in this order against
#: ``torch.cuda.get_device_name()``.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200", 989.4), ("A100", 312.0),
    ("L40S", 362.05), ("4090", 165.2),
)
SIZES = {
    # patch windows per op call, vision image side (px), tower preset, training preset / row / samples per row,
    # extraction model / images / side, timed repeats
    "tiny": {"windows": 64, "image": 448, "tower": "tiny:qwen3_vl", "train": "tiny:qwen3_vl", "row": 512,
             "samples": 4, "steps": 3, "extract_model": "tiny:qwen3_vl", "extract_images": 8, "extract_side": 224,
             "repeats": 3},
    "real": {"windows": 6080, "image": 1024, "tower": "real:qwen3_vl_2b", "train": "real:qwen3_vl_2b", "row": 8192,
             "samples": 4, "steps": 8, "extract_model": "real:qwen3_vl_2b", "extract_images": 64,
             "extract_side": 448, "repeats": 7},
}
PATCH_SHAPES = {"qwen2_5_vl": ((2, 14, 14), 1280), "qwen3_vl": ((2, 16, 16), 1024)}


def time_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds of one call: CUDA events on CUDA, the wall clock elsewhere."""
    if device.type == "cuda" and torch.cuda.is_available():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    begin = time.perf_counter()
    fn()
    return (time.perf_counter() - begin) * 1e3


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, device: torch.device, warmup: int = 1
                ) -> dict[str, float]:
    """Median ms per variant, run round-robin as benchmarks/patch_embed.py does, timed with :func:`time_ms`."""
    runs = time_interleaved(fns, warmup, repeats, device, timer=lambda fn: time_ms(fn, device))
    return {name: round(statistics.median(values), 4) for name, values in runs.items()}


def environment(device: torch.device) -> dict[str, Any]:
    facts = machine_facts(device)
    facts["cuda_available"] = torch.cuda.is_available()
    facts["cuda"] = torch.version.cuda
    facts["cudnn_runtime"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    facts["vlforge"] = getattr(vlforge, "__version__", None)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(gpu=props.name, gpu_memory_bytes=props.total_memory, capability=f"{props.major}.{props.minor}",
                     bf16_supported=torch.cuda.is_bf16_supported())
        facts["clocks"] = gpu_clocks()
    else:
        facts["clocks"] = {"value": None, "reason": "no CUDA device"}
    return facts


def gpu_clocks() -> dict[str, Any]:
    """SM/memory clocks (current and max, MHz) from nvidia-smi; null with the reason when it is unavailable."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"value": None, "reason": "nvidia-smi not found"}
    fields = "clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit"
    try:
        out = subprocess.run([smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=20, check=True).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as error:
        return {"value": None, "reason": f"nvidia-smi failed: {error}"}
    return dict(zip(fields.split(","), (v.strip() for v in out.split(",")), strict=False))


def _patch_variants(kernel: tuple[int, int, int], out_channels: int, windows: int, dtype: torch.dtype,
                    device: torch.device) -> tuple[dict[str, Callable[[torch.Tensor], torch.Tensor]], torch.Tensor,
                                                   dict[str, tuple[nn.Parameter, ...]]]:
    torch.manual_seed(0)
    conv = nn.Conv3d(3, out_channels, kernel, stride=kernel, bias=True).to(device=device, dtype=dtype)
    patched = copy.deepcopy(conv)
    vlforge.patch(patched)
    weight = nn.Parameter(conv.weight.detach().reshape(out_channels, -1).clone())
    bias = nn.Parameter(conv.bias.detach().clone())
    x = torch.randn(windows, 3, *kernel, device=device, dtype=dtype)

    def linear(inp: torch.Tensor) -> torch.Tensor:
        return F.linear(inp.reshape(inp.shape[0], -1), weight, bias)

    fns = {"conv3d": lambda inp: conv(inp).reshape(windows, -1), "patched": lambda inp: patched(inp).reshape(windows, -1),
           "linear": linear}
    params = {"conv3d": tuple(conv.parameters()), "patched": tuple(patched.parameters()), "linear": (weight, bias)}
    return fns, x, params


def _modes(fns: dict[str, Callable[[], torch.Tensor]], params: dict[str, tuple[nn.Parameter, ...]],
           repeats: int, device: torch.device) -> dict[str, Any]:
    """forward (no_grad) and forward+backward medians of each variant, with conv3d/patched and patched/linear."""
    result: dict[str, Any] = {}
    for mode in ("forward", "forward_backward"):
        steps = {}
        for name, fn in fns.items():
            def step(fn=fn, name=name, mode=mode) -> None:
                if mode == "forward":
                    with torch.no_grad():
                        fn()
                    return
                fn().float().sum().backward()
                for p in params[name]:
                    p.grad = None
            steps[name] = step
        medians = interleaved(steps, repeats, device)
        entry: dict[str, Any] = {f"{name}_ms": ms for name, ms in medians.items()}
        if "conv3d" in medians:
            entry["conv3d_over_patched"] = round(medians["conv3d"] / medians["patched"], 3)
        if "linear" in medians:
            entry["patched_over_linear"] = round(medians["patched"] / medians["linear"], 3)
        if "stock" in medians:
            entry["stock_over_patched"] = round(medians["stock"] / medians["patched"], 3)
        result[mode] = entry
    return result


def patch_op(size: dict[str, Any], device: torch.device) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for family, (kernel, channels) in PATCH_SHAPES.items():
        for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            fns, x, params = _patch_variants(kernel, channels, size["windows"], dtype, device)
            with torch.no_grad():
                ref = fns["conv3d"](x).float()
                diff = max(float((fns[n](x).float() - ref).abs().max()) for n in ("patched", "linear"))
            timed = _modes({n: (lambda f=f, x=x: f(x)) for n, f in fns.items()}, params, size["repeats"], device)
            out[f"{family}/{dtype_name}"] = {"windows": size["windows"], "window": [3, *kernel],
                                            "out_channels": channels, "max_abs_diff_vs_conv3d": diff, **timed}
    return out


def _tower(ref: str, dtype: torch.dtype, device: torch.device) -> nn.Module:
    from vlforge.models.presets import meta_model, preset_config

    config = preset_config(ref)
    tower_class = type(meta_model(ref).model.visual)
    torch.manual_seed(0)
    with torch.device(device):
        return tower_class._from_config(config.vision_config, dtype=dtype)


def vision_tower(size: dict[str, Any], device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    from vlforge.patches.registry import patched_modules

    stock = _tower(size["tower"], dtype, device)
    patched = copy.deepcopy(stock)
    vlforge.patch(patched)
    if patched_modules(stock) or not patched_modules(patched):
        raise RuntimeError("the stock tower is patched or the patched one is not")
    cfg = stock.config
    side = size["image"] // cfg.patch_size
    grid = torch.tensor([[1, side, side]], device=device)
    # one image = temporal_patch_size copies of a frame, cut into (3 x t x p x p) windows
    pixels = torch.randn(side * side, 3 * cfg.temporal_patch_size * cfg.patch_size ** 2, device=device, dtype=dtype)
    with torch.no_grad():
        a = stock(pixels, grid_thw=grid)
        b = patched(pixels, grid_thw=grid)
    a = a.pooler_output if hasattr(a, "pooler_output") else a[0]
    b = b.pooler_output if hasattr(b, "pooler_output") else b[0]
    diff = float((a.float() - b.float()).abs().max())

    def run(model: nn.Module) -> torch.Tensor:
        out = model(pixels, grid_thw=grid)
        return out.pooler_output if hasattr(out, "pooler_output") else out[0]

    fns = {"stock": lambda: run(stock), "patched": lambda: run(patched)}
    params = {"stock": tuple(stock.parameters()), "patched": tuple(patched.parameters())}
    return {"preset": size["tower"], "dtype": str(dtype).removeprefix("torch."), "image_px": size["image"],
            "patches": side * side, "max_abs_diff_stock_vs_patched": diff,
            **_modes(fns, params, max(3, size["repeats"] // 2), device)}


def peak_tflops(device: torch.device) -> tuple[float | None, str]:
    if device.type != "cuda":
        return None, f"no peak figure for device type {device.type!r} (MFU is for GPUs)"
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16_TFLOPS:
        if key in name:
            return value, f"{key} bf16 dense peak"
    return None, f"{name!r} is not in the peak table ({', '.join(k for k, _ in PEAK_BF16_TFLOPS)})"


def flops_per_token(model: nn.Module, lengths: list[int]) -> float:
    """6 x (text decoder parameters without the embedding table + lm_head) + 12 x layers x attention width x mean
    causal context. The rows carry no images, so the vision tower's parameters do no work and are not counted."""
    text = model.config.get_text_config()
    decoder = model.get_decoder()
    table = {id(p) for p in decoder.get_input_embeddings().parameters()}
    params = sum(p.numel() for p in decoder.parameters() if id(p) not in table)
    params += sum(p.numel() for p in model.get_output_embeddings().parameters())  # a tied head still multiplies
    width = text.num_attention_heads * getattr(text, "head_dim", text.hidden_size // text.num_attention_heads)
    context = sum(n * n for n in lengths) / (2 * sum(lengths))  # mean number of keys a causal query sees
    return 6.0 * params + 12.0 * text.num_hidden_layers * width * context


def training(size: dict[str, Any], device: torch.device) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from vlforge.models import load
    from vlforge.models.varlen import use_for_text
    from vlforge.train.loss import token_loss_sum

    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    store_dir = tempfile.mkdtemp(prefix="vlforge-suite-pg-")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.FileStore(os.path.join(store_dir, "store"), 1), rank=0, world_size=1)
    try:
        model = load(size["train"], dtype="float32", device=device, processor=False).model.train()
        use_for_text(model)
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                      reduce_dtype=torch.float32 if bf16 else None)
        mesh = init_device_mesh(device.type, (1,))
        layers = [m for n, m in model.named_modules() if type(m).__name__.endswith("DecoderLayer")]
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
        row, samples = size["row"], size["samples"]
        lengths = [row // samples] * (samples - 1) + [row - (row // samples) * (samples - 1)]
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, 151000, (1, row), generator=generator)
        positions = torch.cat([torch.arange(n) for n in lengths]).view(1, 1, row).expand(4, 1, row).clone()
        batch = {"input_ids": ids, "labels": ids.clone(), "position_ids": positions, "cu_seqlens": cu,
                 "max_seqlen": max(lengths)}

        def step() -> float:
            loss = token_loss_sum(model, batch, device) / row
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return float(loss.detach())

        losses = [step()]  # warm-up (allocations, kernel selection)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        for _ in range(size["steps"] - 1):
            holder: list[float] = []
            times.append(time_ms(lambda holder=holder: holder.append(step()), device))
            losses.append(holder[0])
        seconds = statistics.median(times) / 1e3
        tokens_per_s = row / seconds
        per_token = flops_per_token(model, lengths)
        peak, reason = peak_tflops(device)
        mfu = tokens_per_s * per_token / (peak * 1e12) if peak else None
        peak_memory = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
                       else _host_peak_bytes())
        return {"preset": size["train"], "precision": "bf16 params, fp32 reduce" if bf16 else "fp32",
                "fsdp2_world_size": 1, "gradient_checkpointing": True, "packed_row_tokens": row,
                "samples_per_row": samples, "attention": "vlforge_varlen", "timed_steps": len(times),
                "step_seconds_median": round(seconds, 4), "tokens_per_s": round(tokens_per_s, 2),
                "flops_per_token": per_token, "peak_bf16_tflops": peak, "peak_source": reason,
                "mfu": round(mfu, 4) if mfu is not None else None,
                "mfu_reason": None if mfu is not None else reason,
                "peak_memory_bytes": int(peak_memory),
                "peak_memory_kind": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "host VmHWM",
                "losses": [round(v, 4) for v in losses]}
    finally:
        dist.destroy_process_group()
        shutil.rmtree(store_dir, ignore_errors=True)


def _host_peak_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def extraction(size: dict[str, Any], device: torch.device) -> dict[str, Any]:
    from vlforge.extract import run_extract
    from vlforge.models import load

    root = Path(tempfile.mkdtemp(prefix="vlforge-suite-extract-"))
    try:
        data = make_images(root, size["extract_images"], size["extract_side"])
        warm = make_images(root / "warm", 2, size["extract_side"])
        dtype = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
        loaded = load(size["extract_model"], dtype=dtype, device=device)
        options = {"model": size["extract_model"], "features": ["hidden_mean"], "batch_size": 8, "dtype": dtype,
                   "shard_size": size["extract_images"], "loaded": loaded, "device": str(device),
                   "token_audit": False}
        run_extract(data=str(warm), out=root / "warm-out", **options)
        synchronize(device)
        begin = time.perf_counter()
        rows = run_extract(data=str(data), out=root / "out", **options).rows_written
        synchronize(device)
        seconds = time.perf_counter() - begin
        return {"model": size["extract_model"], "dtype": dtype, "images": rows, "image_px": size["extract_side"],
                "batch_size": 8, "seconds": round(seconds, 3), "samples_per_s": round(rows / seconds, 3)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def patch_trace(size: dict[str, Any], device: torch.device, trace_dir: Path | None) -> dict[str, Any]:
    """Profile patched vs ``F.linear`` forward+backward at the Qwen3-VL window shape (see the module docstring)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    kernel, channels = PATCH_SHAPES["qwen3_vl"]
    fns, x, params = _patch_variants(kernel, channels, size["windows"], dtype, device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    out: dict[str, Any] = {"windows": size["windows"], "dtype": str(dtype).removeprefix("torch."), "calls": 20}
    for name in ("patched", "linear"):
        def step(name=name) -> None:
            fns[name](x).float().sum().backward()
            for p in params[name]:
                p.grad = None
        for _ in range(5):
            step()
        synchronize(device)
        with profile(activities=activities) as prof:
            for _ in range(out["calls"]):
                step()
            synchronize(device)
        events = prof.events()
        aten = [e for e in events if e.name.startswith("aten::") and e.device_type == DeviceType.CPU]
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        by_kernel: dict[str, float] = {}
        for e in kernels:
            by_kernel[e.name] = by_kernel.get(e.name, 0.0) + e.time_range.elapsed_us()
        out[name] = {"aten_ops_per_call": round(len(aten) / out["calls"], 1),
                     "host_us_per_call": round(sum(e.self_cpu_time_total for e in aten) / out["calls"], 2),
                     "kernels_per_call": round(len(kernels) / out["calls"], 1),
                     "kernel_us_per_call": round(sum(by_kernel.values()) / out["calls"], 2),
                     "top_kernels_us_per_call": {k[:80]: round(v / out["calls"], 2) for k, v in
                                                 sorted(by_kernel.items(), key=lambda kv: -kv[1])[:6]}}
        if trace_dir is not None:
            trace_dir.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace_dir / f"patch_embed_{name}_{out['dtype']}.json"))
    out["trace_dir"] = None if trace_dir is None else str(trace_dir)
    return out


def markdown(report: dict[str, Any]) -> str:
    """A short markdown table of the headline numbers."""
    env = report["environment"]
    device = env.get("gpu") or env.get("cpu_model")
    lines = [f"GPU suite (`--size {report['size']}`), {device}, torch {env['torch']}, CUDA {env['cuda']}, "
             f"cuDNN {env['cudnn_runtime']}, {env['utc']}", "", "| measurement | value |", "|---|---|"]
    for name in SECTIONS:
        if isinstance(report.get(name), dict) and "error" in report[name]:
            lines.append(f"| {name} | failed: {report[name]['error']} |")
    for key, entry in ({} if "error" in report.get("patch_op", {}) else report.get("patch_op", {})).items():
        for mode in ("forward", "forward_backward"):
            e = entry[mode]
            lines.append(f"| patch {key} {mode}: conv3d / patched / linear ms | {e['conv3d_ms']} / {e['patched_ms']} / "
                         f"{e['linear_ms']} (patched/linear {e['patched_over_linear']}) |")
    if (tower := report.get("vision_tower")) and "error" not in tower:
        for mode in ("forward", "forward_backward"):
            e = tower[mode]
            lines.append(f"| tower {tower['preset']} {tower['dtype']} {mode}: stock / patched ms | {e['stock_ms']} / "
                         f"{e['patched_ms']} (x{e['stock_over_patched']}) |")
    if (t := report.get("training")) and "error" not in t:
        lines.append(f"| training {t['preset']} {t['precision']}, {t['packed_row_tokens']}-token rows: tokens/s | "
                     f"{t['tokens_per_s']} |")
        lines.append(f"| training MFU | {t['mfu'] if t['mfu'] is not None else 'n/a: ' + t['mfu_reason']} |")
        lines.append(f"| training peak memory (GiB, {t['peak_memory_kind']}) | {t['peak_memory_bytes'] / 2**30:.2f} |")
    if (pt := report.get("patch_trace")) and "error" not in pt:
        p, b = pt["patched"], pt["linear"]
        lines.append(f"| patch trace {pt['dtype']}, {pt['windows']} windows fwd+bwd: patched / linear aten ops, host us, "
                     f"kernel us per call | {p['aten_ops_per_call']} / {b['aten_ops_per_call']}, "
                     f"{p['host_us_per_call']} / {b['host_us_per_call']}, "
                     f"{p['kernel_us_per_call']} / {b['kernel_us_per_call']} |")
    if (x := report.get("extraction")) and "error" not in x:
        lines.append(f"| extraction {x['model']} {x['dtype']}: samples/s | {x['samples_per_s']} |")
    return "\n".join(lines) + "\n"


SECTIONS = ("patch_op", "vision_tower", "training", "extraction", "patch_trace")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--device", default="auto", help="auto (cuda when available, else cpu), cpu, cuda, cuda:1")
    parser.add_argument("--markdown", nargs="?", const="-", default=None, metavar="PATH",
                        help="also write a markdown table: to PATH, or to stderr without one")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma list from {', '.join(SECTIONS)}")
    parser.add_argument("--trace-dir", type=Path, default=None, help="write patch_trace's chrome traces here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if unknown := sorted(set(only) - set(SECTIONS)):
        parser.error(f"--only: unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            parser.error(f"--device {args.device}: CUDA is not available here")
    size = SIZES[args.size]
    tower_dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    report: dict[str, Any] = {"benchmark": "gpu_suite", "size": args.size, "device": str(device),
                              "environment": environment(device)}
    started = time.perf_counter()
    runners = {"patch_op": lambda: patch_op(size, device), "vision_tower": lambda: vision_tower(size, device, tower_dtype),
               "training": lambda: training(size, device), "extraction": lambda: extraction(size, device),
               "patch_trace": lambda: patch_trace(size, device, args.trace_dir)}
    failed = []
    for name in only:
        begin = time.perf_counter()
        try:
            report[name] = runners[name]()
        except Exception as error:  # one section's failure must not lose the others' measurements
            logging.exception("section %s failed", name)
            report[name] = {"error": f"{type(error).__name__}: {error}"}
            failed.append(name)
        report.setdefault("section_seconds", {})[name] = round(time.perf_counter() - begin, 2)
    report["total_seconds"] = round(time.perf_counter() - started, 2)
    report["utc_end"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    print(json.dumps(report, indent=2))
    if args.markdown is not None:
        table = markdown(report)
        if args.markdown == "-":
            sys.stderr.write(table)
        else:
            Path(args.markdown).write_text(table, encoding="utf-8")
    if failed:
        sys.exit(f"gpu_suite: section(s) failed: {', '.join(failed)} (their errors are in the JSON)")


if __name__ == "__main__":
    main()
