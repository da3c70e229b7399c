"""Benchmark the Qwen3-VL patch embedding: stock Conv3d vs ``vlforge.patch`` vs a bare ``F.linear``.

Shape: 6080 windows of 3 x 2 x 16 x 16 (one 1216 x 1280-ish image batch) -> 1024 channels, bias on,
as ``Qwen3VLVisionPatchEmbed`` calls it: input ``(6080, 3, 2, 16, 16)``. For each dtype (fp32, bf16)
and mode (forward under ``no_grad``, forward+backward into the weight), every variant runs ``--warmup``
untimed times, then ``--repeats`` timed times, interleaved round-robin with the other variants so
that load from other processes hits all alike; the JSON gives the median, min and every run in ms,
and the ratios ``conv3d / patched`` (speed-up) and ``patched / linear`` (overhead over the bare GEMM).
Nothing is estimated: every number is measured on the machine described under ``machine``.

Run:
    .venv/bin/python benchmarks/patch_embed.py --repeats 7
    .venv/bin/python benchmarks/patch_embed.py --repeats 5 --windows 1520 --dtypes fp32   # quicker
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import vlforge
from vlforge.patches.timing import synchronize

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_facts(device: torch.device) -> dict[str, object]:
    facts: dict[str, object] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "device": str(device),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(device)
        facts["cudnn"] = torch.backends.cudnn.version()
    return facts


def time_interleaved(
    fns: dict[str, Callable[[], object]], warmup: int, repeats: int, device: torch.device,
    timer: Callable[[Callable[[], object]], float] | None = None,
) -> dict[str, list[float]]:
    """Milliseconds per call for each named function, runs interleaved round-robin.

    Interleaving (rotating the order every round) spreads drifting load from other processes evenly
    over the variants instead of penalising whichever ran during a busy spell. ``timer`` (a call ->
    milliseconds, e.g. CUDA events) replaces the wall clock + device sync.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    synchronize(device)
    runs: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if timer is not None:
                runs[name].append(timer(fns[name]))
                continue
            start = time.perf_counter()
            fns[name]()
            synchronize(device)
            runs[name].append((time.perf_counter() - start) * 1e3)
    return runs


def build(dtype: torch.dtype, device: torch.device, windows: int, out_channels: int, seed: int = 0):
    """Stock conv, a patched conv sharing its parameters' values, a bare-linear closure, and the input."""
    torch.manual_seed(seed)
    kernel = (2, 16, 16)
    conv = nn.Conv3d(3, out_channels, kernel, stride=kernel, bias=True).to(device=device, dtype=dtype)
    patched = nn.Conv3d(3, out_channels, kernel, stride=kernel, bias=True).to(device=device, dtype=dtype)
    patched.load_state_dict(conv.state_dict())
    vlforge.patch(patched)
    weight = nn.Parameter(conv.weight.detach().reshape(out_channels, -1).clone())
    bias = nn.Parameter(conv.bias.detach().clone())
    x = torch.randn(windows, 3, *kernel, device=device, dtype=dtype)

    def linear(inp: torch.Tensor) -> torch.Tensor:
        return F.linear(inp.reshape(inp.shape[0], -1), weight, bias)

    return {"conv3d": conv, "patched": patched, "linear": linear}, x, (weight, bias)


def bench_case(dtype_name: str, args: argparse.Namespace, device: torch.device) -> dict[str, object]:
    variants, x, linear_params = build(DTYPES[dtype_name], device, args.windows, args.out_channels)
    with torch.no_grad():
        reference = variants["conv3d"](x).reshape(args.windows, -1).float()
        max_abs_diff = {
            name: (variants[name](x).reshape(args.windows, -1).float() - reference).abs().max().item()
            for name in ("patched", "linear")
        }
    grad = torch.randn_like(reference).to(DTYPES[dtype_name])
    result: dict[str, object] = {"max_abs_diff_vs_conv3d": max_abs_diff}
    for mode in ("forward", "forward_backward"):
        steps = {}
        for name, fn in variants.items():
            params = linear_params if name == "linear" else tuple(fn.parameters())

            def step(fn=fn, params=params, mode=mode) -> None:
                if mode == "forward":
                    with torch.no_grad():
                        fn(x)
                    return
                out = fn(x).reshape(args.windows, -1)
                out.backward(grad)
                for p in params:
                    p.grad = None

            steps[name] = step
        timings = {
            name: {
                "median_ms": round(statistics.median(runs), 3),
                "min_ms": round(min(runs), 3),
                "runs_ms": [round(r, 3) for r in runs],
            }
            for name, runs in time_interleaved(steps, args.warmup, args.repeats, device).items()
        }
        conv_ms, patched_ms, linear_ms = (timings[n]["median_ms"] for n in ("conv3d", "patched", "linear"))
        result[mode] = {
            **timings,
            "speedup_patched_vs_conv3d": round(conv_ms / patched_ms, 3),
            "speedup_linear_vs_conv3d": round(conv_ms / linear_ms, 3),
            "patched_over_linear": round(patched_ms / linear_ms, 3),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per variant (median reported; >= 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per variant first")
    parser.add_argument("--windows", type=int, default=6080, help="number of 3x2x16x16 windows")
    parser.add_argument("--out-channels", type=int, default=1024)
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma list from: fp32, bf16")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.repeats < 5:
        parser.error("--repeats must be at least 5")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = sorted(set(dtypes) - set(DTYPES))
    if unknown:
        parser.error(f"unknown dtype(s) {unknown}; choose from {sorted(DTYPES)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    report: dict[str, object] = {
        "benchmark": "patch_embed",
        "shape": {
            "windows": args.windows,
            "window": [3, 2, 16, 16],
            "in_features": 3 * 2 * 16 * 16,
            "out_features": args.out_channels,
            "bias": True,
        },
        "repeats": args.repeats,
        "warmup": args.warmup,
        "machine": machine_facts(device),
        "results": {name: bench_case(name, args, device) for name in dtypes},
    }
    if "fp32" in report["results"]:
        forward = report["results"]["fp32"]["forward"]
        report["targets"] = {
            "fp32_forward_speedup_vs_conv3d": forward["speedup_patched_vs_conv3d"],
            "fp32_forward_at_least_4x_faster_than_conv3d": forward["speedup_patched_vs_conv3d"] >= 4.0,
            "fp32_forward_patched_over_linear": forward["patched_over_linear"],
            "fp32_forward_within_10pct_of_linear": forward["patched_over_linear"] <= 1.10,
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
