"""``run_verify``: stock vs patched on the same inputs and the same weights, with thresholds.

Order of work (one process, one model): capture the input of every patchable convolution during a
stock vision-tower forward; compare each convolution stock vs patched on copies (fp32, bf16, and
against an fp64 reference on CPU / fp32 on GPU); run the stock tower, logits and greedy generation;
patch the model in place; run them again; compare; restore the model's patch state.

Published thresholds (flags of the CLI): patch layer fp32 max abs diff < 1e-5, patch layer bf16
cosine > 0.999, vision tower per-sample pooled cosine > 0.99. End-to-end numbers are reported;
they become checks only when a threshold is given (``max_kl``, ``min_top1``,
``require_identical_generation``), since on random tiny models a bf16 rounding difference can flip
a near-tie argmax without anything being wrong.

Example (CPU, seconds):
    >>> from vlforge.verify import VerifyOptions, run_verify
    >>> report = run_verify(VerifyOptions(model="tiny:qwen3_vl", synthetic="2x64x64"))  # doctest: +SKIP
    >>> report.passed  # doctest: +SKIP
    True
"""

from __future__ import annotations

import copy
import logging
import math
from typing import Any

import torch
from torch import nn

import vlforge
from vlforge.errors import VlforgeError
from vlforge.models.components import discover
from vlforge.models.inputs import make_spec
from vlforge.models.load import resolve_device
from vlforge.patches import is_patchable, patched_modules
from vlforge.verify import checks
from vlforge.verify.options import (
    VerifyOptions,
)
from vlforge.verify.report import (
    Check,
    EndToEnd,
    HonestyRow,
    LayerResult,
    TowerResult,
    VerifyReport,
)

logger = logging.getLogger(__name__)

def reference_dtype_for(device: torch.device) -> torch.dtype:
    """fp64 on CPU (exact enough, and cheap there); fp32 on accelerators (fp64 is slow or absent)."""
    return torch.float64 if device.type == "cpu" else torch.float32


def _patched_copy(module: nn.Module, precision: str) -> nn.Module:
    clone = copy.deepcopy(module)
    vlforge.patch(clone, precision=precision)
    return clone


def _stock_copy(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    clone = copy.deepcopy(module).to(dtype)
    vlforge.unpatch(clone)
    return clone


@torch.no_grad()
def check_layer(name: str, conv: nn.Module, x: torch.Tensor, *, precision: str,
                reference_dtype: torch.dtype) -> tuple[LayerResult, list[HonestyRow]]:
    """Stock vs patched on copies of one convolution for its real input ``x``."""
    stock32 = _stock_copy(conv, torch.float32)
    x32 = x.float()
    fp32 = checks.abs_diff(stock32(x32), _patched_copy(stock32, "native")(x32))
    stock16 = _stock_copy(conv, torch.bfloat16)
    x16 = x.to(torch.bfloat16)
    out16 = stock16(x16)
    patched16 = _patched_copy(stock16, precision)(x16)
    result = LayerResult(
        name=name, input_shape=list(x.shape), kernel=list(conv.kernel_size),
        fp32_max_abs_diff=fp32["max"], fp32_mean_abs_diff=fp32["mean"], bf16_cosine=checks.cosine(out16, patched16),
        bf16_max_abs_diff=checks.abs_diff(out16, patched16)["max"],
    )
    # Precision honesty: the same bf16 weights and input, computed exactly (fp64) or in fp32 on GPU.
    reference = _stock_copy(stock16, reference_dtype)(x16.to(reference_dtype))
    honesty = []
    for label, output in (("stock bf16", out16), ("patched bf16 native", _patched_copy(stock16, "native")(x16)),
                          ("patched bf16 fp32", _patched_copy(stock16, "fp32")(x16))):
        error = checks.reference_error(output, reference)
        honesty.append(HonestyRow(level="patch_layer", module=name, variant=label,
                                  reference=str(reference_dtype).removeprefix("torch."), **error))
    return result, honesty


def _tower_output(tower: nn.Module, pixels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    out = tower(pixels, grid_thw=grid)
    pooled = getattr(out, "pooler_output", None)
    if isinstance(pooled, torch.Tensor):
        return pooled
    hidden = getattr(out, "last_hidden_state", out)
    if isinstance(hidden, (tuple, list)):
        hidden = hidden[0]
    return hidden


def _sample_sizes(rows: int, grid: torch.Tensor, merge: int) -> list[int]:
    cells = [int(t * h * w) for t, h, w in grid.tolist()]
    return cells if sum(cells) == rows else [c // merge**2 for c in cells]


def _capture_conv_inputs(model: nn.Module, run: Any) -> dict[str, torch.Tensor]:
    captured: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in model.named_modules():
        if is_patchable(module):
            def hook(mod: nn.Module, args: Any, name: str = name) -> None:
                captured.setdefault(name, args[0].detach().clone())
            handles.append(module.register_forward_pre_hook(hook))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return captured


def _generate(model: nn.Module, batch: dict[str, torch.Tensor], tokens: int, pad_id: int | None) -> torch.Tensor:
    out = model.generate(**batch, max_new_tokens=tokens, do_sample=False, num_beams=1, pad_token_id=pad_id,
                         temperature=None, top_p=None, top_k=None)
    return out[:, batch["input_ids"].shape[1]:]


def first_divergence(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Index of the first generated position where two ``(batch, tokens)`` outputs differ, else None."""
    length = min(a.shape[1], b.shape[1])
    differ = (a[:, :length] != b[:, :length]).any(0).nonzero()
    if len(differ):
        return int(differ[0])
    return None if a.shape[1] == b.shape[1] else length


def _threshold_checks(options: VerifyOptions, layers: list[LayerResult], tower: TowerResult,
                      e2e: EndToEnd) -> list[Check]:
    found = []
    # NaN never compares greater or smaller, so it is ranked worst explicitly (and then fails its check).
    worst32 = max(layers, key=lambda layer: (math.isnan(layer.fp32_max_abs_diff), layer.fp32_max_abs_diff))
    found.append(Check(name="patch_layer.fp32_max_abs_diff", value=worst32.fp32_max_abs_diff, op="<",
                       threshold=options.max_fp32_layer_diff, where=worst32.name,
                       passed=worst32.fp32_max_abs_diff < options.max_fp32_layer_diff))
    worst16 = min(layers, key=lambda layer: (not math.isnan(layer.bf16_cosine), layer.bf16_cosine))
    found.append(Check(name="patch_layer.bf16_cosine", value=worst16.bf16_cosine, op=">",
                       threshold=options.min_bf16_layer_cosine, where=worst16.name,
                       passed=worst16.bf16_cosine > options.min_bf16_layer_cosine))
    found.append(Check(name="vision_tower.pooled_cosine", value=tower.min_pooled_cosine, op=">",
                       threshold=options.min_tower_cosine, where=tower.module,
                       passed=tower.min_pooled_cosine > options.min_tower_cosine))
    if options.max_kl is not None:
        found.append(Check(name="end_to_end.kl_mean", value=e2e.kl_mean, op="<", threshold=options.max_kl,
                           where="logits", passed=e2e.kl_mean < options.max_kl))
    if options.min_top1 is not None:
        found.append(Check(name="end_to_end.top1", value=e2e.top1, op=">=", threshold=options.min_top1,
                           where="logits", passed=e2e.top1 >= options.min_top1))
    if options.require_identical_generation and e2e.generated_tokens:
        found.append(Check(name="end_to_end.generation_identical", value=float(e2e.generation_identical),
                           op="==", threshold=1.0, where=f"{e2e.generated_tokens} greedy tokens",
                           passed=e2e.generation_identical))
    return found


def run_verify(options: VerifyOptions, *, loaded: Any | None = None) -> VerifyReport:
    """Compare stock and patched ``options.model`` (or the already ``loaded`` model).

    A ``loaded`` model in another dtype than ``options.dtype`` is compared on a converted copy; the
    caller's model ends exactly as it came (weights, dtype and patch state).
    """
    if loaded is None:
        from vlforge.models import load

        loaded = load(options.model, dtype=options.dtype, device=str(resolve_device(options.device)),
                      attn_implementation=options.attn)
    model = loaded.model.eval()
    device = next(model.parameters()).device
    dtype = getattr(torch, options.dtype)
    if next(model.parameters()).dtype != dtype:  # never change the caller's model: compare on a copy
        logger.info("verify: running a %s copy of the %s model", options.dtype, next(model.parameters()).dtype)
        model = copy.deepcopy(model).to(dtype)
    originally = {n: getattr(model.get_submodule(n), "_vlforge_precision", "native") for n in patched_modules(model)}
    vlforge.unpatch(model)
    if not any(is_patchable(module) for module in model.modules()):
        raise VlforgeError(f"{options.model}: no stride==kernel convolution to verify")
    spec = make_spec(loaded, synthetic=options.synthetic, images=options.images or None, video=options.video,
                     video_frames=options.video_frames)
    batch = {k: v.to(device) for k, v in spec.build(options.batch_size).items()}
    tower_path = next(c.path for c in discover(model) if c.name == "vision.other")
    tower = model.get_submodule(tower_path)
    pixels = batch["pixel_values"].to(dtype)
    grid = batch["image_grid_thw"]
    merge = int(getattr(model.config.vision_config, "spatial_merge_size", 2))
    reference_dtype = reference_dtype_for(device)
    pad_id = getattr(getattr(loaded, "tokenizer", None), "pad_token_id", None)
    try:
        with torch.no_grad():
            stock_tower: list[torch.Tensor] = []
            inputs = _capture_conv_inputs(model, lambda: stock_tower.append(_tower_output(tower, pixels, grid)))
            layers, honesty = [], []
            for name, x in inputs.items():
                result, rows = check_layer(name, model.get_submodule(name), x, precision=options.precision,
                                           reference_dtype=reference_dtype)
                layers.append(result)
                honesty += rows
            stock_logits = model(**batch, use_cache=False).logits
            stock_gen = _generate(model, batch, options.generate_tokens, pad_id) if options.generate_tokens else None
            vlforge.patch(model, precision=options.precision)
            patched_tower = _tower_output(tower, pixels, grid)
            patched_logits = model(**batch, use_cache=False).logits
            patched_gen = _generate(model, batch, options.generate_tokens, pad_id) if options.generate_tokens else None
            if options.tower_reference:
                honesty += _tower_honesty(tower, tower_path, pixels, grid, stock_tower[0], patched_tower, options,
                                          reference_dtype)
    finally:
        vlforge.unpatch(model)
        for name, precision in originally.items():
            vlforge.patch(model, precision=precision, include=[name])
    sizes = _sample_sizes(stock_tower[0].shape[0], grid, merge)
    pooled = [checks.cosine(a, b) for a, b in zip(checks.split_pooled(stock_tower[0], sizes),
                                                  checks.split_pooled(patched_tower, sizes), strict=True)]
    tower_result = TowerResult(module=tower_path, output_shape=list(patched_tower.shape), pooled_cosines=pooled,
                               min_pooled_cosine=min(pooled, key=lambda c: (not math.isnan(c), c)),
                               max_abs_diff=checks.abs_diff(stock_tower[0], patched_tower)["max"])
    agreement = checks.logits_agreement(stock_logits, patched_logits)
    first_diff = first_divergence(stock_gen, patched_gen) if stock_gen is not None else None
    identical = first_diff is None
    e2e = EndToEnd(kl_mean=agreement["kl_mean"], kl_max=agreement["kl_max"], top1=agreement["top1"],
                   top5=agreement["topk"], positions=agreement["positions"], generated_tokens=options.generate_tokens,
                   generation_identical=identical, first_divergence=first_diff)
    found = _threshold_checks(options, layers, tower_result, e2e)
    failed = [c.name for c in found if not c.passed]
    return VerifyReport(
        model=str(getattr(loaded, "source", options.model)), family=str(model.config.model_type), device=str(device),
        dtype=options.dtype, precision=options.precision, attn=options.attn, input=spec.description,
        batch_size=options.batch_size, layers=layers, tower=tower_result, end_to_end=e2e, honesty=honesty,
        checks=found, failed=failed, passed=not failed,
    )


def _tower_honesty(tower: nn.Module, tower_path: str, pixels: torch.Tensor, grid: torch.Tensor, stock: torch.Tensor,
                   patched: torch.Tensor, options: VerifyOptions, reference_dtype: torch.dtype) -> list[HonestyRow]:
    """Tower outputs of the run dtype against a high-precision copy of the same (rounded) weights."""
    if pixels.dtype == reference_dtype:
        return []
    reference_tower = _stock_copy(tower, reference_dtype)
    reference = _tower_output(reference_tower, pixels.to(reference_dtype), grid)
    del reference_tower
    other = "fp32" if options.precision == "native" else "native"
    vlforge.patch(tower, precision=other)
    other_out = _tower_output(tower, pixels, grid)
    vlforge.patch(tower, precision=options.precision)
    run = options.dtype.replace("float", "fp").replace("bfp16", "bf16")
    rows = []
    for label, output in ((f"stock {run}", stock), (f"patched {run} {options.precision}", patched),
                          (f"patched {run} {other}", other_out)):
        rows.append(HonestyRow(level="vision_tower", module=tower_path, variant=label,
                               reference=str(reference_dtype).removeprefix("torch."),
                               **checks.reference_error(output, reference)))
    return rows
