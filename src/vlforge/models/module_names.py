"""Module and class names from a config, resolved against the model's own module tree.

LMMS Engine configs name parts of the model as ``visual``, ``merger``, ``language_model`` or ``lm_head``;
in transformers 5 those live at ``model.visual``, ``model.visual.merger``, ``model.language_model`` and
``lm_head``. A name from ``model.freeze_modules`` resolves, in this order, to:

1. ``exact``: the module whose dotted path is the name;
2. ``suffix``: the one module whose path ends with ``.NAME`` (``visual`` -> ``model.visual``);
3. ``moved``: the one module whose path holds the name's parts in order, with the same last part
   (``model.layers`` -> ``model.language_model.layers``: a path of transformers 4);
4. ``alias``: a name of :data:`ALIASES` (``vision_tower``, ``multi_modal_projector``, ``llm``, ...), found
   from the model's structure, not from its class: the vision tower is the outermost module holding the
   image patch convolution but not the text embedding, the language model the parent of the input
   embedding, the projector the tower's ``merger`` / ``multi_modal_projector``, the head the output
   embedding. A leading ``model.`` / ``base_model.`` before an alias is allowed
   (``model.vision_tower.blocks`` -> ``model.visual.blocks``).

Several matches at one step are an error listing them; no match is an error with close matches. LoRA
``target_modules`` keep peft's own rule (a module name or path suffix, many matches wanted); one that
matches nothing goes through steps 3-4 above. FSDP layer class names match the model's classes exactly, or
ignoring case, ``_`` and a ``Text`` part (transformers 5 renamed text layers ``*TextDecoderLayer``).

Example:
    >>> import torch
    >>> from vlforge.models.module_names import resolve_module
    >>> net = torch.nn.Module()
    >>> net.model = torch.nn.Module()
    >>> net.model.visual = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 2, stride=2), torch.nn.Linear(4, 4))
    >>> net.model.language_model = torch.nn.Embedding(10, 4)
    >>> net.get_input_embeddings = lambda: net.model.language_model
    >>> resolve_module(net, "visual").paths, resolve_module(net, "vision_tower").how
    (('model.visual',), 'alias')
    >>> resolve_module(net, "visul")
    Traceback (most recent call last):
    ...
    vlforge.errors.ConfigError: model.freeze_modules: 'visul' matches no module of Module; close matches: visual (= model.visual)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from torch import nn

from vlforge.errors import ConfigError, close_matches

logger = logging.getLogger(__name__)

#: Leading path parts that wrap a model (transformers, peft, DDP, torch.compile) and may precede an alias.
WRAPPERS = ("model", "base_model", "module", "_orig_mod")


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def _path_of(model: nn.Module, target: nn.Module | None) -> str | None:
    if target is None:
        return None
    for path, module in model.named_modules():
        if module is target and path:
            return path
    return None


def _embedding(model: nn.Module, getter: str) -> nn.Module | None:
    try:
        return getattr(model, getter)()
    except (AttributeError, NotImplementedError, TypeError):
        return None


def vision_tower(model: nn.Module) -> str | None:
    """Path of the vision tower: the outermost module holding the image patch conv but not the text embedding."""
    conv = next((path for path, m in model.named_modules()
                 if isinstance(m, (nn.Conv2d, nn.Conv3d)) and m.in_channels <= 4), None)
    if conv is None:
        return None
    text = _embedding(model, "get_input_embeddings")
    tower = _parent(conv)
    while tower:
        outer = _parent(tower)
        holder = model.get_submodule(outer) if outer else model
        if text is not None and any(m is text for m in holder.modules()):
            break
        if not outer:
            break
        tower = outer
    return tower or None


def language_model(model: nn.Module) -> str | None:
    """Path of the language model: the parent of the input (token) embedding."""
    path = _path_of(model, _embedding(model, "get_input_embeddings"))
    return _parent(path) or None if path else None


def _named_under(model: nn.Module, root: str | None, names: tuple[str, ...]) -> str | None:
    """The first module named one of ``names`` (in that order), under ``root`` first, then anywhere."""
    paths = [path for path, _ in model.named_modules() if path]
    for scope in ([root] if root else []) + [""]:
        for name in names:
            found = [p for p in paths if p.split(".")[-1] == name and (not scope or p.startswith(scope + "."))]
            if len(found) == 1:
                return found[0]
    return None


def projector(model: nn.Module) -> str | None:
    """Path of the vision-to-text projector (Qwen's ``merger`` under the tower, LLaVA's ``multi_modal_projector``)."""
    return _named_under(model, vision_tower(model), ("merger", "multi_modal_projector", "mm_projector"))


def lm_head(model: nn.Module) -> str | None:
    """Path of the output embedding (``lm_head``)."""
    return _path_of(model, _embedding(model, "get_output_embeddings"))


def text_embedding(model: nn.Module) -> str | None:
    """Path of the input token embedding (``embed_tokens``)."""
    return _path_of(model, _embedding(model, "get_input_embeddings"))


@dataclass(frozen=True)
class Concept:
    """A part of a vision-language model, the names configs use for it, and how to find it."""

    label: str
    names: tuple[str, ...]
    locate: Callable[[nn.Module], str | None]


#: The alias table: names LMMS Engine and other trainers' configs use, per part of the model.
ALIASES: tuple[Concept, ...] = (
    Concept("vision tower", ("visual", "vision_tower", "vision_model", "vision_encoder", "visual_encoder",
                             "image_encoder", "vit"), vision_tower),
    Concept("projector", ("merger", "multi_modal_projector", "mm_projector", "projector", "connector",
                          "visual_projector"), projector),
    Concept("language model", ("language_model", "llm", "text_model", "lm", "text_decoder"), language_model),
    Concept("output head", ("lm_head", "output_layer", "embed_out"), lm_head),
    Concept("token embedding", ("embed_tokens", "wte", "word_embeddings", "tok_embeddings"), text_embedding),
)
_BY_ALIAS = {name: concept for concept in ALIASES for name in concept.names}


@dataclass(frozen=True)
class Resolved:
    """What one configured name resolved to."""

    name: str
    """The name as written in the config."""
    paths: tuple[str, ...]
    """Module paths in the model (several only for LoRA targets)."""
    how: str
    """``exact``, ``suffix``, ``moved``, ``alias`` or (LoRA) ``peft``."""

    def describe(self) -> str:
        shown = ", ".join(self.paths[:3]) + (f" (+{len(self.paths) - 3} more)" if len(self.paths) > 3 else "")
        return f"{self.name!r} -> {shown} ({self.how})"


def _is_subsequence(parts: list[str], path_parts: list[str]) -> bool:
    it = iter(path_parts)
    return all(part in it for part in parts)


def _moved(paths: list[str], name: str) -> list[str]:
    parts = name.split(".")
    if len(parts) < 2:
        return []
    return [p for p in paths if p.split(".")[-1] == parts[-1] and _is_subsequence(parts, p.split("."))]


def _alias(model: nn.Module, modules: dict[str, nn.Module], name: str) -> str | None:
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in _BY_ALIAS and all(p in WRAPPERS for p in parts[:i]):
            head = _BY_ALIAS[part].locate(model)
            if head is None:
                return None
            target = ".".join([head, *parts[i + 1:]])
            return target if target in modules else None
        if part not in WRAPPERS:
            return None
    return None


def _close(model: nn.Module, modules: dict[str, nn.Module], name: str) -> list[str]:
    """Close matches of ``name`` among the model's module names, paths and resolvable aliases."""
    paths = [p for p in modules if p and not any(part.isdigit() for part in p.split("."))]
    aliases = {alias for alias in _BY_ALIAS if _alias(model, modules, alias)}
    candidates = sorted({p.split(".")[-1] for p in paths} | aliases) + paths
    shown = []
    for close in dict.fromkeys(close_matches(name, candidates, n=5)):
        if close in modules:
            shown.append(close)
            continue
        suffix = [p for p in modules if p.endswith("." + close)]
        target = suffix[0] if len(suffix) == 1 else _alias(model, modules, close)
        shown.append(f"{close} (= {target})" if target else close)
    return shown


def _ambiguous(key: str, name: str, found: list[str], how: str) -> ConfigError:
    shown = ", ".join(found[:8]) + (f", ... ({len(found)} in all)" if len(found) > 8 else "")
    return ConfigError(f"{key}: {name!r} is ambiguous: it matches {len(found)} modules by {how} ({shown}); "
                       "write the full dotted path of the one you mean")


def resolve_module(model: nn.Module, name: str, *, key: str = "model.freeze_modules") -> Resolved:
    """The one module ``name`` means in ``model`` (see the module docstring); a :class:`ConfigError` else."""
    modules = dict(model.named_modules())
    paths = [p for p in modules if p]
    if name and name in modules:
        return Resolved(name, (name,), "exact")
    for how, found in (("suffix", [p for p in paths if p.endswith("." + name)]), ("moved", _moved(paths, name))):
        if len(found) == 1:
            return Resolved(name, (found[0],), how)
        if found:
            raise _ambiguous(key, name, found, how)
    target = _alias(model, modules, name)
    if target is not None:
        return Resolved(name, (target,), "alias")
    close = _close(model, modules, name)
    tops = ", ".join(n for n, _ in model.named_children())
    hint = f"close matches: {', '.join(close)}" if close else f"top-level modules: {tops}"
    raise ConfigError(f"{key}: {name!r} matches no module of {type(model).__name__}; {hint}")


def resolve_modules(model: nn.Module, names: Iterable[str], *, key: str = "model.freeze_modules") -> list[Resolved]:
    """:func:`resolve_module` for each name, each resolution logged."""
    resolved = [resolve_module(model, name, key=key) for name in names]
    for item in resolved:
        logger.info("%s: %s", key, item.describe())
    return resolved


def resolve_lora_targets(model: nn.Module, names: Iterable[str],
                         *, key: str = "model.lora.target_modules") -> list[str]:
    """LoRA targets for peft: names peft matches stay as written, others become the full paths they resolve to."""
    modules = dict(model.named_modules())
    paths = [p for p in modules if p]
    targets: list[str] = []
    for name in names:
        found = [p for p in paths if p == name or p.endswith("." + name)]
        if found:
            item = Resolved(name, tuple(found), "peft")
            targets.append(name)
        else:
            item = resolve_module(model, name, key=key)
            targets.extend(item.paths)
        logger.info("%s: %s", key, item.describe())
    return list(dict.fromkeys(targets))


def _normalise(class_name: str) -> str:
    return class_name.lower().replace("_", "").replace("text", "")


def resolve_layer_classes(model: nn.Module, names: Iterable[str],
                          *, key: str = "fsdp.transformer_layer_cls_to_wrap") -> dict[str, type]:
    """Class name as written -> the model's class: exact, else equal ignoring case, ``_`` and ``Text``."""
    classes = {type(m).__name__: type(m) for m in model.modules()}
    result: dict[str, type] = {}
    for name in names:
        if name in classes:
            result[name] = classes[name]
            continue
        renamed = [c for c in classes if _normalise(c) == _normalise(name)]
        if len(renamed) == 1:
            logger.info("%s: %r -> %s (the model's name for that class)", key, name, renamed[0])
            result[name] = classes[renamed[0]]
            continue
        layers = list(getattr(model, "_no_split_modules", None) or [])
        close = close_matches(name, sorted(classes), n=3)
        hints = [f"close matches: {', '.join(close)}"] if close else []
        if layers:
            hints.append(f"its layer classes: {', '.join(sorted(layers))}")
        raise ConfigError(f"{key}: no module of class {name!r} in {type(model).__name__}"
                          + (f"; {'; '.join(hints)}" if hints else ""))
    return result
