"""What is trained of a loaded model: frozen modules and LoRA adapters (names resolved as LMMS configs write them).

Example:
    >>> from vlforge.models.adapters import freeze
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    >>> freeze(net, ["0"])  # weight 2x2 + bias 2
    6
    >>> freeze(net, ["2"])
    Traceback (most recent call last):
    ...
    vlforge.errors.ConfigError: model.freeze_modules: '2' matches no module of Sequential; top-level modules: 0, 1
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Any

from vlforge.errors import ConfigError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

PEFT_MISSING = "model.lora needs peft, which is not installed here: pip install peft (or remove model.lora)"


def freeze(model: torch.nn.Module, names: list[str]) -> int:
    """Set ``requires_grad=False`` under each configured module name; returns the parameters frozen.

    Names resolve as LMMS Engine configs write them (``visual`` -> ``model.visual``; see
    :mod:`vlforge.models.module_names`); each resolution is logged.
    """
    from vlforge.models.module_names import resolve_modules

    frozen = 0
    for item in resolve_modules(model, names, key="model.freeze_modules"):
        path = item.paths[0]
        params = {id(p) for p in model.get_submodule(path).parameters()}
        tied = sorted(name for name, p in model.named_parameters(remove_duplicate=False)
                      if id(p) in params and not name.startswith(path + "."))
        if tied:
            logger.warning("model.freeze_modules: %r shares weights with %s (tied); they are frozen too",
                           item.name, ", ".join(tied))
        for param in model.get_submodule(path).parameters():
            if param.requires_grad:
                param.requires_grad_(False)
                frozen += param.numel()
    return frozen


def apply_lora(model: torch.nn.Module, lora: Any) -> torch.nn.Module:
    """Wrap ``model`` in a peft ``PeftModel`` with adapters per ``lora`` (a ``model.lora`` section).

    Only the adapter weights stay trainable; the base weights are frozen by peft.
    """
    if importlib.util.find_spec("peft") is None:
        raise ConfigError(PEFT_MISSING)
    from peft import LoraConfig, get_peft_model

    from vlforge.models.module_names import resolve_lora_targets

    targets = resolve_lora_targets(model, lora.target_modules)
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=targets, lora_dropout=lora.dropout)
    try:
        return get_peft_model(model, config)
    except ValueError as error:  # e.g. no module matches target_modules
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"model.lora.target_modules {list(lora.target_modules)}: {first}") from error
