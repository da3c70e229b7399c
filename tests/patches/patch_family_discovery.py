"""Find, build and feed every transformers model family whose patch embedding is a stride==kernel conv.

Nothing here names a family: candidates come from grepping the installed transformers' modeling
sources for ``nn.Conv3d(`` / ``nn.Conv2d(`` calls that pass a ``stride``; each candidate's config class
comes from ``CONFIG_MAPPING``; its config (and every sub-config) is shrunk generically; the tower is the
``PreTrainedModel`` class of that module whose ``config_class`` is the (sub-)config's class and whose
instance holds a convolution ``vlforge.patches.is_patchable`` accepts.

Example (the test modules do this once per session):
    >>> from patch_family_discovery import discover
    >>> "qwen3_vl" in [family.name for family in discover("Conv3d")]
    True
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

from vlforge.patches import is_patchable

# Generic tiny sizes, keyed by config attribute name. Widths stay divisible by the head count.
_WIDTHS = ("hidden_size", "embed_dim", "dim", "d_model", "out_hidden_size", "projection_dim")
_FFN = ("intermediate_size", "mlp_dim", "ffn_dim", "mlp_hidden_dim")
_HEADS = ("num_heads", "num_attention_heads", "num_key_value_heads", "attention_heads")
_DEPTHS = ("depth", "num_hidden_layers", "num_layers", "layers", "pred_num_hidden_layers")
_WIDTH, _FFN_WIDTH, _N_HEADS = 32, 64, 2
_MAX_FRAMES_PER_TUBELET = 2


@dataclass
class Family:
    """One model family: where its conv lives and how to build its vision/video tower tiny."""

    name: str
    """``config.model_type`` of the family (the key of ``CONFIG_MAPPING``)."""
    module: str
    kind: str
    """``Conv3d`` (video / Qwen-style patch embeddings) or ``Conv2d`` (image patch embeddings)."""
    tower: type[PreTrainedModel] | None = None
    config: PreTrainedConfig | None = None
    conv_names: list[str] = field(default_factory=list)
    skip_reason: str | None = None
    """Why a tiny tower could not be built generically (the test reports it as skipped)."""


def _conv_call_pattern(kind: str) -> re.Pattern[str]:
    # ``nn.Conv3d(`` ... ``stride`` before the call's closing parenthesis (one level of nesting allowed).
    return re.compile(rf"nn\.{kind}\((?:[^()]|\([^()]*\))*?\bstride\b", re.DOTALL)


@functools.cache
def candidate_modules(kind: str) -> dict[str, Path]:
    """Module directory name -> modeling file, for files that call ``nn.{kind}(`` with a stride."""
    pattern = _conv_call_pattern(kind)
    root = Path(transformers.models.__file__).parent
    found: dict[str, Path] = {}
    for path in sorted(root.glob("*/modeling_*.py")):
        if pattern.search(path.read_text(encoding="utf-8")):
            found.setdefault(path.parent.name, path)
    return found


def _model_types_by_module() -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for model_type in CONFIG_MAPPING_NAMES:
        grouped.setdefault(model_type_to_module_name(model_type), []).append(model_type)
    return grouped


def _sub_configs(config: PreTrainedConfig) -> Iterator[PreTrainedConfig]:
    for key in getattr(config, "sub_configs", {}) or {}:
        value = getattr(config, key, None)
        if isinstance(value, PreTrainedConfig):
            yield value


def _walk(config: PreTrainedConfig) -> Iterator[PreTrainedConfig]:
    """Sub-configs depth-first (vision towers live there), then the config itself (video-only models)."""
    for sub in _sub_configs(config):
        yield from _walk(sub)
    yield config


def shrink(config: PreTrainedConfig) -> None:
    """Make ``config`` and all its sub-configs tiny in place: narrow, one layer, small images and clips."""
    for sub in _sub_configs(config):
        shrink(sub)
    values = config.__dict__
    heads = _N_HEADS
    for name in _WIDTHS:
        if isinstance(values.get(name), int) and not isinstance(values.get(name), bool):
            setattr(config, name, _WIDTH)
    for name in _FFN:
        if isinstance(values.get(name), int):
            setattr(config, name, _FFN_WIDTH)
    for name in _HEADS:
        if isinstance(values.get(name), int):
            setattr(config, name, heads)
    if isinstance(values.get("head_dim"), int):
        config.head_dim = _WIDTH // heads
    for name, value in list(values.items()):
        depth = name in _DEPTHS or (name.startswith("num_") and name.endswith("_layers"))
        if depth and isinstance(value, int) and not isinstance(value, bool):
            setattr(config, name, 1)
    patch = values.get("patch_size", values.get("tubelet_size"))
    patch = patch[-1] if isinstance(patch, (list, tuple)) else patch
    if isinstance(patch, int):
        for name in ("image_size", "crop_size"):
            size = values.get(name)
            if isinstance(size, int):
                setattr(config, name, 4 * patch)
            elif isinstance(size, (list, tuple)) and len(size) == 2:
                setattr(config, name, type(size)([4 * patch, 4 * patch]))
    tubelet = values.get("tubelet_size")
    tubelet = tubelet[0] if isinstance(tubelet, (list, tuple)) else tubelet
    if isinstance(tubelet, int):
        for name in ("num_frames", "frames_per_clip"):
            if isinstance(values.get(name), int):
                setattr(config, name, _MAX_FRAMES_PER_TUBELET * tubelet)


def _tower_classes(module: Any, config: PreTrainedConfig) -> list[type[PreTrainedModel]]:
    classes = []
    for obj in vars(module).values():
        if (
            inspect.isclass(obj)
            and issubclass(obj, PreTrainedModel)
            and obj.__module__ == module.__name__
            and obj.__dict__.get("config_class", getattr(obj, "config_class", None)) is type(config)
            and not obj.__name__.endswith("PreTrainedModel")
        ):
            classes.append(obj)
    # Bare towers before task heads ("...ForConditionalGeneration"), shorter names first.
    return sorted(classes, key=lambda c: ("For" in c.__name__, len(c.__name__), c.__name__))


def is_patch_embedding(module: nn.Module, kind: str) -> bool:
    """A patchable ``nn.{kind}`` that cuts real patches (kernel > 1 element, not a pointwise conv)."""
    return (
        isinstance(module, getattr(nn, kind))
        and is_patchable(module)
        and math.prod(module.kernel_size) > 1
    )


def _build(family: Family, model_type: str, kind: str) -> None:
    module = importlib.import_module(family.module)
    config = CONFIG_MAPPING_NAMES[model_type]
    config_cls = getattr(importlib.import_module(module.__name__.replace(".modeling_", ".configuration_")), config, None)
    if config_cls is None:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        config_cls = CONFIG_MAPPING[model_type]
    root = config_cls()
    shrink(root)
    errors, without_patch_conv = [], []
    for sub in _walk(root):
        for cls in _tower_classes(module, sub):
            try:
                with torch.device("meta"):  # shapes only: cheap even where the shrink missed a width
                    model = cls(copy.deepcopy(sub))
            except Exception as exc:  # one class failing to build tiny is data, not a test failure
                errors.append(f"{cls.__name__}: {type(exc).__name__}: {exc}")
                continue
            names = [name for name, mod in model.named_modules() if is_patch_embedding(mod, kind)]
            if names:
                family.tower, family.config, family.conv_names = cls, sub, names
                return
            without_patch_conv.append(cls.__name__)
    built = f"built without a stride==kernel {kind}: {', '.join(without_patch_conv) or 'none'}"
    family.skip_reason = (
        f"no tiny tower could be built generically ({built}); failed: " + "; ".join(errors)[:400]
        if errors
        else None  # every class built and none holds a patch conv: not a patch-embedding family
    )


@functools.cache
def _model_types() -> dict[str, list[str]]:
    return _model_types_by_module()


@functools.cache
def discover_family(module_dir: str, kind: str) -> Family:
    """Build one candidate family tiny (cached per session); ``skip_reason`` says why when impossible."""
    path = candidate_modules(kind)[module_dir]
    model_types = _model_types().get(module_dir, [])
    model_type = module_dir if module_dir in model_types else (model_types[0] if model_types else None)
    family = Family(
        name=model_type or module_dir, module=f"transformers.models.{module_dir}.{path.stem}", kind=kind
    )
    if model_type is None:
        family.skip_reason = f"{module_dir} has no entry in CONFIG_MAPPING"
        return family
    try:
        _build(family, model_type, kind)
    except Exception as exc:  # reported as the family's skip reason, never swallowed silently
        family.skip_reason = f"tiny config could not be made: {type(exc).__name__}: {exc}"[:400]
    return family


def discover(kind: str) -> list[Family]:
    """Every family whose tiny tower holds a stride==kernel ``nn.{kind}`` patch embedding."""
    return [
        family
        for family in (discover_family(name, kind) for name in candidate_modules(kind))
        if family.tower is not None
    ]


def _int(config: PreTrainedConfig, *names: str, default: int | None = None) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, (list, tuple)):
            value = value[0]
        if isinstance(value, int):
            return value
    if default is not None:
        return default
    raise KeyError(f"{type(config).__name__} has none of {names}")


def make_inputs(family: Family, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Keyword inputs for the tower's forward: Qwen style ``(hidden_states, grid_thw)`` or a video clip."""
    assert family.tower is not None and family.config is not None
    config = family.config
    params = list(inspect.signature(family.tower.forward).parameters)[1:]
    generator = torch.Generator().manual_seed(1)
    if "grid_thw" in params:
        merge = _int(config, "spatial_merge_size")
        channels = _int(config, "in_channels", "in_chans", "num_channels")
        patch = _int(config, "patch_size")
        temporal = _int(config, "temporal_patch_size")
        # Two images in one batch; t=1 rows (GLM-4V's position interpolation indexes images per frame).
        grid = torch.tensor([[1, 2 * merge, 2 * merge], [1, merge, 2 * merge]])
        rows = int(grid.prod(dim=1).sum())
        pixels = torch.randn(rows, channels * temporal * patch * patch, generator=generator)
        return {params[0]: pixels.to(dtype), "grid_thw": grid}
    name = next(p for p in params if p.startswith("pixel_values"))
    channels = _int(config, "num_channels", "in_chans", "in_channels", default=3)
    size = _int(config, "image_size", "crop_size")
    if family.kind == "Conv2d":
        return {name: torch.randn(2, channels, size, size, generator=generator).to(dtype)}
    frames = _int(config, "num_frames", "frames_per_clip")
    clip = torch.randn(1, frames, channels, size, size, generator=generator)
    return {name: clip.to(dtype)}


def float_outputs(output: Any) -> list[torch.Tensor]:
    """Every floating tensor in a model output (ModelOutput, tuple, list), in order."""
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in float_outputs(item)]
    return []


def run_tower(model: nn.Module, inputs: dict[str, Any]) -> list[torch.Tensor]:
    """Forward with a fixed seed (some towers draw random masks) and no grad; the float outputs."""
    torch.manual_seed(0)
    with torch.no_grad():
        return [t.detach() for t in float_outputs(model(**inputs))]
