"""``vlforge demo``: a tiny Qwen3-VL, patched, with measured equivalence and speed on this machine.

Run (CPU, about a minute):
    vlforge demo
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from rich.console import Console
from rich.table import Table

import vlforge
from vlforge.doctor import render as render_doctor
from vlforge.doctor import report as doctor_report
from vlforge.doctor.bench import measure_conv
from vlforge.doctor.rules import Measurement
from vlforge.errors import VlforgeError

logger = logging.getLogger(__name__)

QWEN3_VL_WINDOWS = 6080
"""Patch windows of one 8-frame Qwen3-VL clip in the seed report (3x2x16x16 -> 1024)."""


@dataclass
class Check:
    name: str
    value: float
    threshold: str
    passed: bool


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Silence a logger's INFO lines (the demo toggles patches many times)."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def demo_image(width: int = 224, height: int = 160) -> Image.Image:
    """A deterministic RGB test picture (gradients and a disc), made without any file."""
    ys, xs = np.mgrid[0:height, 0:width]
    red = (xs * 255 // max(width - 1, 1)).astype(np.uint8)
    green = (ys * 255 // max(height - 1, 1)).astype(np.uint8)
    blue = ((((xs - width / 2) ** 2 + (ys - height / 2) ** 2) < (min(width, height) / 3) ** 2) * 200).astype(np.uint8)
    return Image.fromarray(np.stack([red, green, blue], axis=-1), mode="RGB")


def _tower_output(model: torch.nn.Module, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        features = model.get_image_features(pixel_values=pixel_values, image_grid_thw=grid_thw)
    pooled = features.pooler_output
    return torch.cat(list(pooled), dim=0) if isinstance(pooled, (list, tuple)) else pooled


def equivalence_checks(model: torch.nn.Module, processor) -> list[Check]:
    """Stock vs patched vision-tower output on a real image, fp32 and bf16, against published thresholds."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[demo_image()], return_tensors="pt")
    pixel_values, grid_thw = inputs["pixel_values"], inputs["image_grid_thw"]

    checks = []
    vlforge.unpatch(model)
    stock = _tower_output(model, pixel_values, grid_thw)
    vlforge.patch(model)
    patched = _tower_output(model, pixel_values, grid_thw)
    diff = (stock - patched).abs().max().item()
    checks.append(Check("tower fp32 max abs diff", diff, "<= 1e-5", diff <= 1e-5))

    model.to(torch.bfloat16)
    try:
        vlforge.unpatch(model)
        stock_bf16 = _tower_output(model, pixel_values.bfloat16(), grid_thw).float()
        vlforge.patch(model)
        patched_bf16 = _tower_output(model, pixel_values.bfloat16(), grid_thw).float()
    finally:
        model.to(torch.float32)
    cosine = F.cosine_similarity(stock_bf16.flatten(), patched_bf16.flatten(), dim=0).item()
    checks.append(Check("tower bf16 cosine", cosine, ">= 0.999", cosine >= 0.999))
    return checks


def speed_rows(seconds: float = 20.0) -> list[Measurement]:
    """Stock Conv3d vs the GEMM path at the Qwen3-VL shape, fp32 and bf16, forward and forward+backward."""
    conv = torch.nn.Conv3d(3, 1024, kernel_size=(2, 16, 16), stride=(2, 16, 16))
    return [
        measure_conv(conv, QWEN3_VL_WINDOWS, dtype=dtype, seconds=seconds / 2)
        for dtype in (torch.float32, torch.bfloat16)
    ]


def run(console: Console, seconds: float = 20.0) -> None:
    """Run the demo, printing rich tables; raises VlforgeError when an equivalence check fails."""
    from vlforge.models import load

    console.rule("[bold]vlforge demo")
    console.print(
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
        f"device {'cuda' if torch.cuda.is_available() else 'cpu'}"
    )
    loaded = load("tiny:qwen3_vl")
    console.print(f"model: tiny Qwen3-VL from {loaded.path}")

    console.rule("[bold]1. vlforge doctor: this machine and the stock model")
    render_doctor(doctor_report(loaded, bench=True, bench_seconds=min(seconds, 6.0)), console)

    console.rule("[bold]2. vlforge.patch(model)")
    report = vlforge.patch(loaded.model)
    table = Table(title="Patched convolutions (now one GEMM each)")
    for column in ("module", "conv", "kernel", "K -> out", "precision"):
        table.add_column(column)
    for entry in report.patched:
        table.add_row(entry.name, entry.conv, "x".join(map(str, entry.kernel)),
                      f"{entry.in_features} -> {entry.out_features}", entry.precision)
    console.print(table)

    console.rule("[bold]3. Equivalence and speed")
    with _quiet("vlforge.patches"):
        checks = equivalence_checks(loaded.model, loaded.processor)
    table = Table(title="Equivalence on a real image (stock conv vs patched)")
    for column in ("check", "measured", "threshold", "verdict"):
        table.add_column(column)
    for check in checks:
        verdict = "[green]pass" if check.passed else "[red]FAIL"
        table.add_row(check.name, f"{check.value:.3g}", check.threshold, verdict)
    console.print(table)

    with _quiet("vlforge.patches"):
        rows = speed_rows(seconds=seconds)
    table = Table(title=f"Speed here: {QWEN3_VL_WINDOWS} windows of 3x2x16x16 -> 1024 (one 8-frame Qwen3-VL clip)")
    for column in ("dtype", "pass", "stock Conv3d ms", "vlforge GEMM ms", "speed-up"):
        table.add_column(column, justify="right")
    for row in rows:
        for label, times in (("forward", row.forward_ms), ("fwd+bwd", row.train_ms or {})):
            if times:
                table.add_row(row.dtype, label, f"{times['conv']:.1f}", f"{times['gemm']:.1f}",
                              f"{times['conv'] / times['gemm']:.1f}x")
    console.print(table)

    failed = [check.name for check in checks if not check.passed]
    if failed:
        raise VlforgeError(f"demo: equivalence check failed: {', '.join(failed)}")
    console.print("[bold green]demo finished: patched model is equivalent and its speed was measured above")
