"""Find the timed components of a vision-language model from its module structure, for any family.

Nothing here depends on class or attribute names of one family: the vision tower is the ancestor
of the patch-embedding convolution that holds the list of blocks; the language model is the parent
of the input embedding; ``lm_head`` is the output embedding. Each component gets a stable name
(``vision.patch_embed``, ``vision.block.3``, ``text.layer.0``, ``lm_head``, ...). Components never
overlap in *exclusive* time: the ``*.other`` components are the towers' own code between their
children (index maths, masks, scatter), so the exclusive times of all components add up to the
whole forward.

Example:
    >>> import torch
    >>> from vlforge.models.components import discover
    >>> discover(torch.nn.Linear(2, 2))
    Traceback (most recent call last):
    ...
    vlforge.errors.ModelLoadError: Linear has no stride==kernel patch convolution: not a vision-language model vlforge can profile
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from vlforge.errors import ModelLoadError
from vlforge.patches import is_patchable

GROUPS = ("vision", "text", "head", "model")


@dataclass(frozen=True)
class Component:
    """One timed module: ``name`` is vlforge's name, ``path`` the module's name inside the model."""

    name: str
    path: str
    group: str
    """``vision``, ``text``, ``head`` or ``model``."""
    kind: str
    """What it is: patch_embed, pos_embed, rotary, block, merger, deepstack_merger, embed, layer, norm,
    lm_head, other (the parent's own code) or extra (any other child, e.g. GLM's downsample)."""
    module: nn.Module


def _parent_path(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def _find_patch_conv(model: nn.Module) -> str:
    for path, module in model.named_modules():
        if is_patchable(module) and module.in_channels <= 4:
            return path
    for path, module in model.named_modules():
        if is_patchable(module):
            return path
    raise ModelLoadError(
        f"{type(model).__name__} has no stride==kernel patch convolution: "
        "not a vision-language model vlforge can profile"
    )


def _is_rotary(name: str, module: nn.Module) -> bool:
    return "rotary" in name.lower() or "rotary" in type(module).__name__.lower()


def _vision_components(model: nn.Module, modules: dict[str, nn.Module]) -> list[Component]:
    conv_path = _find_patch_conv(model)
    embed_path = _parent_path(conv_path)
    tower_path = embed_path
    while True:
        tower_path = _parent_path(tower_path) if tower_path else ""
        tower = modules[tower_path]
        if any(isinstance(child, nn.ModuleList) and len(child) for child in tower.children()):
            break
        if not tower_path:
            raise ModelLoadError(f"no vision tower with a list of blocks holds {conv_path!r}")
    # The patch embedding is the tower's child on the way to the conv (the module holding the conv).
    rel = conv_path[len(tower_path) + 1 :] if tower_path else conv_path
    embed_child = rel.split(".", 1)[0]
    prefix = f"{tower_path}." if tower_path else ""
    lists = [(name, child) for name, child in tower.named_children() if isinstance(child, nn.ModuleList)]
    block_list = max((item for item in lists if "merger" not in item[0].lower()), key=lambda it: len(it[1]))[0]
    found = [Component("vision.other", tower_path, "vision", "other", tower)]
    for name, child in tower.named_children():
        path = prefix + name
        lowered = name.lower()
        if name == embed_child:
            found.append(Component("vision.patch_embed", path, "vision", "patch_embed", child))
        elif isinstance(child, nn.ModuleList):
            if name == block_list:
                found += [Component(f"vision.block.{i}", f"{path}.{i}", "vision", "block", blk)
                          for i, blk in enumerate(child)]
            elif "merger" in lowered:
                found += [Component(f"vision.deepstack_merger.{i}", f"{path}.{i}", "vision", "deepstack_merger", m)
                          for i, m in enumerate(child)]
            else:
                found += [Component(f"vision.{name}.{i}", f"{path}.{i}", "vision", "extra", m)
                          for i, m in enumerate(child)]
        elif _is_rotary(name, child):
            found.append(Component("vision.rotary_embed", path, "vision", "rotary", child))
        elif isinstance(child, nn.Embedding) or "pos_emb" in lowered or "position" in lowered or lowered == "embeddings":
            found.append(Component("vision.pos_embed", path, "vision", "pos_embed", child))
        elif "merger" in lowered:
            found.append(Component("vision.merger", path, "vision", "merger", child))
        else:
            found.append(Component(f"vision.{name}", path, "vision", "extra", child))
    return found


def _text_components(model: nn.Module, paths: dict[int, str], vision_root: str) -> list[Component]:
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embedding is None or id(embedding) not in paths:
        raise ModelLoadError(f"{type(model).__name__} has no input embedding: cannot find its language model")
    text_path = _parent_path(paths[id(embedding)])
    text = model.get_submodule(text_path) if text_path else model
    if text is model or (vision_root and text_path.startswith(vision_root)):
        raise ModelLoadError(f"the input embedding of {type(model).__name__} is not inside a separate language model")
    found = [Component("text.other", text_path, "text", "other", text)]
    for name, child in text.named_children():
        path = f"{text_path}.{name}"
        if child is embedding:
            found.append(Component("text.embed_tokens", path, "text", "embed", child))
        elif isinstance(child, nn.ModuleList):
            found += [Component(f"text.layer.{i}", f"{path}.{i}", "text", "layer", layer)
                      for i, layer in enumerate(child)]
        elif _is_rotary(name, child):
            found.append(Component("text.rotary_embed", path, "text", "rotary", child))
        elif "norm" in name.lower():
            found.append(Component(f"text.{name}", path, "text", "norm", child))
        else:
            found.append(Component(f"text.{name}", path, "text", "extra", child))
    return found


def discover(model: nn.Module) -> list[Component]:
    """Every timed component of ``model``, in execution-like order: model glue, vision, text, head."""
    modules = dict(model.named_modules())
    paths = {id(module): path for path, module in modules.items()}
    vision = _vision_components(model, modules)
    found = [Component("model.other", "", "model", "other", model), *vision]
    found += _text_components(model, paths, vision[0].path)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and id(head) in paths:
        found.append(Component("lm_head", paths[id(head)], "head", "lm_head", head))
    seen: set[int] = set()
    names: set[str] = set()
    unique = []
    for component in found:
        if id(component.module) in seen:
            raise ModelLoadError(f"module {component.path!r} matched two components; cannot profile this model")
        seen.add(id(component.module))
        if component.name in names:  # e.g. two position embeddings: fall back to the module's own name
            component = replace(component, name=f"{component.group}.{component.path.rsplit('.', 1)[-1]}")
        names.add(component.name)
        unique.append(component)
    return unique
