"""``run_profile``: load a model, build inputs, time every component per configuration.

For each attention implementation x batch size x variant (``stock``: stock convolutions;
``patched``: after ``vlforge.patch``; same weights, same process) it runs ``warmup`` forwards (the
first one also counts FLOPs), then ``repeats`` timed iterations of processor -> host-to-device ->
forward (``use_cache=False``, no grad), and optionally one more forward under ``torch.profiler``
for a Chrome trace.

Example (CPU, about ten seconds):
    >>> from vlforge.profile import ProfileOptions, run_profile
    >>> report = run_profile(ProfileOptions(model="tiny:qwen3_vl", synthetic="2x64x64",
    ...                                     compare=["stock", "patched"], repeats=1))  # doctest: +SKIP
    >>> report.comparisons[0].rows[0].name  # doctest: +SKIP
    'model.other'
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import vlforge
from vlforge.errors import VlforgeError
from vlforge.models.components import discover
from vlforge.models.inputs import make_spec
from vlforge.models.load import resolve_device
from vlforge.outputs import fsync_dir, record
from vlforge.patches import patched_modules
from vlforge.patches.timing import synchronize
from vlforge.profile.options import ProfileOptions, check_trace_dir, trace_name
from vlforge.profile.report import (
    ComponentStats,
    ProfileReport,
    RunProfile,
    TotalStats,
    compare,
    summarise,
    timing,
)
from vlforge.profile.timer import ComponentTimer

logger = logging.getLogger(__name__)

def attn_unavailable(attn: str, device: torch.device) -> str | None:
    """Why ``attn`` cannot run here, or ``None`` when it can."""
    from transformers.utils import import_utils

    if attn in ("sdpa", "eager"):
        return None
    if attn == "flex_attention":
        return None if hasattr(torch.nn.attention, "flex_attention") else "torch has no flex_attention"
    if device.type != "cuda":
        return f"{attn} needs a CUDA device"
    check = {"flash_attention_2": "is_flash_attn_2_available", "flash_attention_3": "is_flash_attn_3_available"}
    available = getattr(import_utils, check[attn], lambda: False)()
    return None if available else f"{attn} is not installed"


def set_variant(model: torch.nn.Module, variant: str) -> None:
    """Make ``model`` run stock convolutions or vlforge's GEMM path (native or fp32 precision)."""
    if variant == "stock":
        vlforge.unpatch(model)
    else:
        vlforge.patch(model, precision="fp32" if variant == "patched-fp32" else "native")


def _to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {key: value.to(device, non_blocking=False) for key, value in batch.items()}


def _profile_run(model: torch.nn.Module, spec: Any, timer: ComponentTimer, meta: dict[str, tuple[str, str, str]],
                 *, options: ProfileOptions, device: torch.device, variant: str, attn: str,
                 batch_size: int) -> RunProfile:
    flops: dict[str, int] | None = None

    def forward(batch: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            model(**batch, use_cache=False)

    if options.warmup == 0:  # the FLOP count needs one untimed forward of its own
        with timer.counting_flops() as flops:
            forward(_to_device(spec.build(batch_size), device))
        timer.detach_calls()
    for step in range(options.warmup):
        batch = _to_device(spec.build(batch_size), device)
        with timer.counting_flops() if step == 0 else contextlib.nullcontext() as counted:
            forward(batch)
        if step == 0:
            flops = counted
        synchronize(device)
        timer.detach_calls()
    assert flops is not None
    processor_ms, h2d_ms, forward_ms, exclusive, inclusive, calls = [], [], [], [], [], {}
    for _ in range(options.repeats):
        start = time.perf_counter()
        cpu_batch = spec.build(batch_size)
        processor_ms.append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()
        batch = _to_device(cpu_batch, device)
        synchronize(device)
        h2d_ms.append((time.perf_counter() - start) * 1e3)
        forward(batch)
        times = timer.detach_calls()
        exclusive.append({name: t.exclusive_ms for name, t in times.items()})
        inclusive.append({name: t.inclusive_ms for name, t in times.items()})
        forward_ms.append(sum(exclusive[-1].values()))
        calls = {name: t.calls for name, t in times.items()}
    trace = None
    if options.trace_dir is not None:
        trace = _trace(forward, _to_device(spec.build(batch_size), device), timer, options.trace_dir,
                       trace_name(variant, attn, batch_size), device)
    summary = summarise(exclusive, flops, meta=meta, calls=calls, inclusive=inclusive,
                        ratio=options.anomaly_ratio, min_share=options.anomaly_min_share)
    return RunProfile(
        variant=variant, attn=attn, batch_size=batch_size, processor=timing(processor_ms),
        host_to_device=timing(h2d_ms), forward=timing(forward_ms),
        components=[ComponentStats(**row) for row in summary["components"]],
        totals=[TotalStats(**row) for row in summary["totals"]], anomalies=summary["anomalies"], trace=trace,
    )


def _trace(forward: Any, batch: dict[str, torch.Tensor], timer: ComponentTimer, directory: Path, name: str,
           device: torch.device) -> str:
    from torch.profiler import ProfilerActivity, profile

    directory.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    timer.label_ranges = True
    try:
        with profile(activities=activities, record_shapes=True) as prof:
            forward(batch)
            synchronize(device)
    finally:
        timer.label_ranges = False
        timer.detach_calls()
    path = directory / name
    with tempfile.TemporaryDirectory(dir=directory, prefix=".tmp-trace.") as staging:
        partial = Path(staging) / name
        prof.export_chrome_trace(str(partial))
        partial.replace(path)
    fsync_dir(directory)
    record(path, writer="profile")
    logger.info("wrote Chrome trace %s (open in chrome://tracing or ui.perfetto.dev)", path)
    return str(path)


def _load(options: ProfileOptions, device: torch.device, attn: str) -> Any:
    from vlforge.models import load

    return load(options.model, dtype=options.dtype, device=str(device), attn_implementation=attn)


def run_profile(options: ProfileOptions, *, loaded: Any | None = None) -> ProfileReport:
    """Profile ``options.model`` (or the already ``loaded`` model) and return the report.

    A ``loaded`` model runs in its own dtype and device placement (``options.dtype`` and
    ``options.device`` only steer loading); it ends in the patch state and attention
    implementation it came with.
    """
    import transformers

    check_trace_dir(options)
    device = resolve_device(options.device) if loaded is None else next(loaded.model.parameters()).device
    skipped = {attn: why for attn in options.attn if (why := attn_unavailable(attn, device))}
    attns = [attn for attn in options.attn if attn not in skipped]
    if not attns:
        raise VlforgeError("no requested attention implementation can run here: "
                           + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    for attn, why in skipped.items():
        logger.warning("skipping attention implementation %s: %s", attn, why)
    if loaded is None:
        loaded = _load(options, device, attns[0])
    model = loaded.model.eval()
    spec = make_spec(loaded, synthetic=options.synthetic, images=options.images or None, video=options.video,
                     video_frames=options.video_frames)
    components = discover(model)
    meta = {c.name: (c.path, c.group, c.kind) for c in components}
    timer = ComponentTimer([(c.name, c.module) for c in components], device=device)
    originally_patched = {name: getattr(model.get_submodule(name), "_vlforge_precision", "native")
                          for name in patched_modules(model)}
    sample = spec.build(1)
    original_attn = getattr(model.config, "_attn_implementation", None)
    runs: list[RunProfile] = []
    try:
        with timer.attached():
            for attn in attns:
                if hasattr(model, "set_attn_implementation"):
                    model.set_attn_implementation(attn)
                for batch_size in options.batch_sizes:
                    for variant in options.compare:
                        set_variant(model, variant)
                        logger.info("profiling %s, attn=%s, batch=%d", variant, attn, batch_size)
                        runs.append(_profile_run(model, spec, timer, meta, options=options, device=device,
                                                 variant=variant, attn=attn, batch_size=batch_size))
    finally:
        vlforge.unpatch(model)
        for name, precision in originally_patched.items():
            vlforge.patch(model, precision=precision, include=[name])
        if original_attn and hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(original_attn)
    comparisons = []
    if len(options.compare) > 1:
        for attn in attns:
            for batch_size in options.batch_sizes:
                matching = [r for r in runs if r.attn == attn and r.batch_size == batch_size]
                comparisons += [compare(matching[0], other) for other in matching[1:]]
    return ProfileReport(
        model=str(getattr(loaded, "source", options.model)), family=str(model.config.model_type),
        device=str(device), dtype=str(next(model.parameters()).dtype).removeprefix("torch."), input=spec.description,
        pixel_values_shape=list(sample["pixel_values"].shape), sequence_length=int(sample["input_ids"].shape[1]),
        warmup=options.warmup, repeats=options.repeats, threads=torch.get_num_threads(),
        torch_version=torch.__version__, transformers_version=transformers.__version__,
        anomaly_ratio=options.anomaly_ratio, anomaly_min_share=options.anomaly_min_share, skipped_attn=skipped,
        runs=runs, comparisons=comparisons,
    )
