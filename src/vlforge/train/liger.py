"""``use_liger_kernel: true``: Liger's Triton kernels on the modules of the model's family, applied by vlforge itself.

What is replaced comes from the family record (:class:`vlforge.models.families.LigerTargets`): the RMSNorm classes,
the SwiGLU MLP classes and the text attention's rope function, plus every family's ``lm_head`` (the fused linear
cross-entropy over the label rows vlforge computes the loss on: :func:`vlforge.train.loss.forward_loss` hands the
head its targets and gets the token-sum back, so no logits are built). Before anything is replaced the installed
transformers is checked and each target is probed on the CPU for the maths Liger's kernel computes (no Triton kernel
runs in a probe):

* an RMSNorm's ``(offset + w)`` (Qwen3.5's norms are ``1 + w``) and its casting (``llama``: normalised in fp32, then
  cast, then times the weight; ``gemma``: all in fp32, cast last), matched bit for bit in bfloat16;
* a SwiGLU MLP against ``down(silu(gate(x)) * up(x))`` with its own weights and activation;
* the rope function against the whole-head ``rotate_half`` rope Liger computes (partial rotary, GLM's interleaved
  rope and a function transformers no longer has are refused);
* the signatures of Liger's functions against the arguments vlforge passes.

A target that is missing, matches no module, or computes something else is left as it is and named in ONE warning
line; every replacement is logged (class, count, first paths; every path at DEBUG). The swaps change module classes
(parameters and ``state_dict`` keys stay) and the family's rope function; :func:`remove_liger` undoes them. Without a
CUDA device there is nothing to run Triton on: one warning, nothing replaced (without liger-kernel the config check
already warned). Liger's own ``apply_liger_kernel_to_<model_type>`` is not called (it rebinds transformers' classes
for the whole process); :func:`audit_liger_entry` reads its source and names what it would leave undone here.

Example (CPU, no kernel runs):
    >>> plan = plan_liger(load("tiny:qwen3_vl").model, "qwen3_vl")              # doctest: +SKIP
    >>> [(r.kind, r.target, len(r.paths)) for r in plan.replacements][:2]     # doctest: +SKIP
    [('rms_norm', 'Qwen3VLTextRMSNorm', 9), ('swiglu', 'Qwen3VLTextMLP', 2)]
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from vlforge.models.families import family

logger = logging.getLogger(__name__)


@dataclass
class Replacement:
    kind: str
    """``rms_norm``, ``swiglu``, ``rope`` or ``fused_linear_cross_entropy``."""
    target: str
    """The class (or function) name."""
    paths: list[str]
    detail: str = ""


@dataclass
class LigerPlan:
    """What :func:`apply_liger` replaces, and what it leaves with the reason (one sentence each)."""

    family: str
    replacements: list[Replacement] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def warning(self) -> str | None:
        if not self.skipped:
            return None
        return f"use_liger_kernel ({self.family}): not applied: " + "; ".join(self.skipped)


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def liger_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("liger-kernel")
    except PackageNotFoundError:
        return None


# ---- the maths Liger's kernels compute (references for the probes) ----------------------------------------------
def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, casting: str) -> torch.Tensor:
    """RMSNorm as Liger's kernel computes it for ``casting`` ``llama`` or ``gemma`` (its documented modes)."""
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    if casting == "llama":
        return (offset + weight) * (x.float() * rstd).to(x.dtype)
    return ((x.float() * rstd) * (offset + weight.float())).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def reference_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The whole-head ``rotate_half`` rope of Liger's ``liger_rotary_pos_emb`` (heads on dim 1)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


# ---- probes -------------------------------------------------------------------------------------------------------
def _probe_norm(module: nn.Module) -> tuple[float, str] | str:
    """``(offset, casting)`` the module computes, or why it is not a norm Liger's kernel computes."""
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    weight = getattr(module, "weight", None)
    if not isinstance(eps, float) or not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return "no 1-D weight and eps"
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, weight.numel(), generator=gen)
    w = torch.randn(weight.numel(), generator=gen) * 0.5
    found = None
    with torch.no_grad():
        stock = torch.func.functional_call(module, {"weight": w}, (x,))
        for offset in (0.0, 1.0):
            if torch.allclose(stock, reference_rms_norm(x, w, eps, offset, "gemma"), rtol=1e-5, atol=1e-6):
                found = offset
        if found is None:
            return "computes neither x/rms * w nor x/rms * (1 + w)"
        xb, wb = x.bfloat16(), w.bfloat16()
        stock = torch.func.functional_call(module, {"weight": wb}, (xb,))
        for casting in ("llama", "gemma"):
            if torch.equal(stock, reference_rms_norm(xb, wb, eps, found, casting)):
                return found, casting
    return "its bfloat16 rounding follows neither of Liger's casting modes (llama, gemma)"


def _mlp_parts(module: nn.Module) -> tuple[str, nn.Module] | str:
    act = getattr(module, "act_fn", None) or getattr(module, "activation_fn", None)
    if not (isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"):
        return f"its activation is {type(act).__name__}, not SiLU"
    if all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj")):
        return "separate", act
    if all(hasattr(module, name) for name in ("gate_up_proj", "down_proj")):
        return "fused", act
    return "no gate/up/down projections"


def _swiglu_parts(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if hasattr(module, "gate_up_proj"):
        gate, up = module.gate_up_proj(x).chunk(2, dim=-1)
        return gate, up
    return module.gate_proj(x), module.up_proj(x)


def _probe_swiglu(module: nn.Module) -> str | None:
    """None when ``module`` computes ``down(silu(gate(x)) * up(x))``, else why not."""
    parts = _mlp_parts(module)
    if isinstance(parts, str):
        return parts
    weight = next(module.parameters())
    if weight.is_meta:
        return None  # shapes only: the structure check above is what can be told
    x = torch.randn(3, weight.shape[-1], generator=torch.Generator().manual_seed(0)).to(weight)
    with torch.no_grad():
        gate, up = _swiglu_parts(module, x)
        if not torch.allclose(module(x), module.down_proj(F.silu(gate) * up), rtol=1e-5, atol=1e-6):
            return "its output is not down(silu(gate(x)) * up(x))"
    return None


def _text_rotary(model: nn.Module) -> tuple[int, int] | None:
    """``(head_dim, rotary dims)`` of the text model: the width of its rotary embedding's own output."""
    from vlforge.memory.probe import find_stack

    found = find_stack(model, "text")
    if found is None:
        return None
    owner, _ = found
    config = owner.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    device = next((b.device for b in owner.rotary_emb.buffers()), torch.device("cpu"))
    x = torch.zeros(1, 4, config.hidden_size, device=device)
    positions = torch.zeros(3, 1, 4, dtype=torch.long, device=device)
    try:
        cos, _ = owner.rotary_emb(x, positions)
    except (RuntimeError, ValueError, IndexError):
        cos, _ = owner.rotary_emb(x, positions[0])
    return head_dim, int(cos.shape[-1])


def _probe_rope(fn: Any, head_dim: int, rotary: int) -> str | None:
    if rotary != head_dim:
        return f"partial rotary ({rotary} of {head_dim} head dims; Liger's rope rotates whole heads)"
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 5, head_dim, generator=gen) for _ in range(2))
    cos, sin = (torch.randn(1, 5, head_dim, generator=gen) for _ in range(2))
    try:
        got = fn(q, k, cos, sin)
    except Exception as error:  # a signature or layout of its own: not Liger's rope
        return f"it does not take (q, k, cos, sin) ({type(error).__name__})"
    want = reference_rope(q, k, cos, sin)
    if not all(torch.allclose(g, w, rtol=1e-5, atol=1e-6) for g, w in zip(got, want, strict=True)):
        return "it is not the whole-head rotate_half rope Liger computes (e.g. an interleaved rope)"
    return None


# ---- Liger's functions and their signatures ----------------------------------------------------------------------
#: What vlforge calls in liger-kernel, and the parameters it passes (checked against the installed version).
LIGER_CALLS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "rms_norm": ("liger_kernel.ops.rms_norm", "LigerRMSNormFunction.forward",
                 ("X", "W", "eps", "offset", "casting_mode", "in_place")),
    "swiglu": ("liger_kernel.ops.swiglu", "LigerSiLUMulFunction.forward", ("a", "b")),
    "rope": ("liger_kernel.transformers.rope", "liger_rotary_pos_emb", ("q", "k", "cos", "sin", "unsqueeze_dim")),
    "fused_linear_cross_entropy": ("liger_kernel.transformers.functional", "liger_fused_linear_cross_entropy",
                                   ("input", "weight", "target", "bias", "ignore_index", "reduction")),
}


def _liger_object(kind: str) -> Any:
    module_name, attr, _ = LIGER_CALLS[kind]
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _signature_problem(kind: str) -> str | None:
    _, attr, wanted = LIGER_CALLS[kind]
    try:
        params = inspect.signature(_liger_object(kind)).parameters
    except (ImportError, AttributeError) as error:
        return f"liger-kernel {liger_version()} has no {attr} ({type(error).__name__})"
    missing = [name for name in wanted if name not in params]
    if missing:
        return f"liger-kernel {liger_version()}'s {attr} takes no {', '.join(missing)}"
    return None


# ---- planning --------------------------------------------------------------------------------------------------
def _modules_of(model: nn.Module, class_name: str) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules()
            if class_name in {k.__name__ for k in type(m).__mro__} and not is_liger(m)]


def plan_liger(model: nn.Module, family_name: str) -> LigerPlan:
    """What :func:`apply_liger` would replace in ``model`` and what it would leave (probes only, any device)."""
    import transformers

    record = family(family_name)
    targets = record.liger
    modeling = importlib.import_module(record.modeling_module)
    plan = LigerPlan(family_name)
    version = transformers.__version__
    signatures = {kind: _signature_problem(kind) for kind in LIGER_CALLS} if liger_installed() else {}
    for kind, problem in signatures.items():
        if problem:
            plan.skipped.append(f"{kind}: {problem}")
    for name in targets.rms_norms:
        if signatures.get("rms_norm"):
            break
        if not hasattr(modeling, name):
            plan.skipped.append(f"rms_norm {name}: transformers {version} has no such class")
            continue
        found = _modules_of(model, name)
        if not found:
            plan.skipped.append(f"rms_norm {name}: matches no module of {type(model).__name__}")
            continue
        maths = _probe_norm(found[0][1])
        if isinstance(maths, str):
            plan.skipped.append(f"rms_norm {name}: {maths}")
            continue
        offset, casting = maths
        plan.replacements.append(Replacement("rms_norm", name, [p for p, _ in found],
                                             f"offset {offset:g}, {casting} casting"))
    for name in targets.swiglu:
        if signatures.get("swiglu"):
            break
        found = _modules_of(model, name)
        if not found:
            why = "matches no module" if hasattr(modeling, name) else f"transformers {version} has no such class"
            plan.skipped.append(f"swiglu {name}: {why}")
            continue
        problem = _probe_swiglu(found[0][1])
        if problem:
            plan.skipped.append(f"swiglu {name}: {problem}")
            continue
        plan.replacements.append(Replacement("swiglu", name, [p for p, _ in found]))
    if targets.rope and not signatures.get("rope"):
        fn = getattr(modeling, targets.rope, None)
        dims = _text_rotary(model)
        problem = (f"transformers {version} has no {record.modeling_module.rsplit('.', 1)[-1]}.{targets.rope}"
                   if fn is None else "no text rotary embedding" if dims is None else _probe_rope(fn, *dims))
        if problem:
            plan.skipped.append(f"rope {targets.rope}: {problem}")
        else:
            plan.replacements.append(Replacement("rope", targets.rope, [record.modeling_module]))
    head = model.get_output_embeddings()
    if not signatures.get("fused_linear_cross_entropy"):
        if isinstance(head, nn.Linear):
            plan.replacements.append(Replacement("fused_linear_cross_entropy", type(head).__name__, [
                next(n for n, m in model.named_modules() if m is head)], "over the label rows"))
        else:
            plan.skipped.append(f"fused_linear_cross_entropy: the output embedding is {type(head).__name__}")
    for name in targets.not_covered:
        if _modules_of(model, name):
            plan.skipped.append(f"{name}: Liger has no kernel for it")
    return plan


# ---- applying ------------------------------------------------------------------------------------------------------
def _norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    offset, casting, eps = self._vlforge_liger
    return LigerRMSNormFunction.apply(hidden_states, self.weight, eps, offset, casting, False)


def _swiglu_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    gate, up = _swiglu_parts(self, x)
    return self.down_proj(LigerSiLUMulFunction.apply(gate, up))


def _head_forward(self: nn.Linear, hidden_states: torch.Tensor) -> torch.Tensor:
    targets = self._vlforge_targets
    if targets is None:
        return F.linear(hidden_states, self.weight, self.bias)
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    flat = hidden_states.reshape(-1, hidden_states.shape[-1])
    weight, bias = self.weight, self.bias
    if weight.dtype != flat.dtype:  # fp32 master weights under autocast: the cast autocast would make (differentiable)
        weight = weight.to(flat.dtype)
        bias = None if bias is None else bias.to(flat.dtype)
    return liger_fused_linear_cross_entropy(flat, weight, targets, bias, reduction="sum").float()


_FORWARDS = {"rms_norm": _norm_forward, "swiglu": _swiglu_forward, "fused_linear_cross_entropy": _head_forward}
_CLASSES: dict[tuple[type, str], type] = {}


def _liger_class(cls: type, kind: str) -> type:
    key = (cls, kind)
    if key not in _CLASSES:
        _CLASSES[key] = type(f"Liger{cls.__name__}", (cls,), {"forward": _FORWARDS[kind], "__module__": __name__,
                                                                "_vlforge_liger_stock": cls})
    return _CLASSES[key]


def is_liger(module: nn.Module) -> bool:
    """Whether ``module`` runs a Liger kernel put there by :func:`apply_liger`."""
    return any("_vlforge_liger_stock" in k.__dict__ for k in type(module).__mro__)


_ROPE_ORIGINALS: dict[str, tuple[str, Any]] = {}


def apply_liger(model: nn.Module, family_name: str, device: torch.device) -> LigerPlan | None:
    """Put Liger's kernels on ``model`` (see the module docstring); None when nothing can run here."""
    if not liger_installed() or device.type != "cuda":
        # the config check already warned once (TrainConfig.inert_warnings): not installed, or no CUDA GPU
        logger.debug("liger: nothing applied (liger-kernel installed: %s, device %s)", liger_installed(), device)
        return None
    plan = plan_liger(model, family_name)
    names = dict(model.named_modules())
    for item in plan.replacements:
        if item.kind == "rope":
            modeling = importlib.import_module(item.paths[0])
            _ROPE_ORIGINALS.setdefault(item.paths[0], (item.target, getattr(modeling, item.target)))
            setattr(modeling, item.target, _liger_object("rope"))
        else:
            for path in item.paths:
                module = names[path]
                if item.kind == "rms_norm":
                    offset, casting = _probe_norm(module)
                    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
                    module._vlforge_liger = (offset, casting, eps)
                if item.kind == "fused_linear_cross_entropy":
                    module._vlforge_targets = None
                module.__class__ = _liger_class(type(module), item.kind)
                logger.debug("liger: %s on %s", item.kind, path)
        shown = ", ".join(item.paths[:3]) + (f" (+{len(item.paths) - 3} more)" if len(item.paths) > 3 else "")
        logger.info("liger: %s%s replaces %s (%d): %s", item.kind, f" ({item.detail})" if item.detail else "",
                    item.target, len(item.paths), shown)
    if (line := plan.warning()) is not None:
        logger.warning(line)
    for note in audit_liger_entry(family_name):
        logger.info("liger: %s", note)
    return plan


def remove_liger(model: nn.Module) -> int:
    """Undo :func:`apply_liger` on ``model`` (and the family rope functions); returns the modules restored."""
    count = 0
    for module in model.modules():
        if is_liger(module):
            module.__class__ = next(k.__dict__["_vlforge_liger_stock"] for k in type(module).__mro__
                                    if "_vlforge_liger_stock" in k.__dict__)
            for attr in ("_vlforge_liger", "_vlforge_targets"):
                module.__dict__.pop(attr, None)
            count += 1
    for module_name, (attr, original) in list(_ROPE_ORIGINALS.items()):
        setattr(importlib.import_module(module_name), attr, original)
        del _ROPE_ORIGINALS[module_name]
    return count


# ---- Liger's own entry for the family ------------------------------------------------------------------------------
def audit_liger_entry(family_name: str) -> list[str]:
    """What liger-kernel's own ``apply_liger_kernel_to_<model_type>`` would leave undone against the installed
    transformers, read from its source: names it assigns in the modeling module that transformers does not define
    (a renamed function or class: that patch does nothing) and switches it accepts but never reads."""
    if not liger_installed():
        return []
    from liger_kernel.transformers import monkey_patch

    entry = getattr(monkey_patch, "MODEL_TYPE_TO_APPLY_LIGER_FN", {}).get(family_name)
    if entry is None:
        return [f"liger-kernel {liger_version()} has no entry for {family_name}"]
    record = family(family_name)
    modeling = importlib.import_module(record.modeling_module)
    short = record.modeling_module.rsplit(".", 1)[-1]
    source = inspect.getsource(entry)
    notes = []
    assigned = sorted(set(re.findall(rf"\b{short}\.(\w+)\s*=", source)))
    missing = [name for name in assigned if not hasattr(modeling, name)]
    if missing:
        notes.append(f"liger-kernel {liger_version()}'s {entry.__name__} assigns {short}.{', '.join(missing)}, which "
                     "this transformers does not define: those patches would do nothing")
    body = source.split(":", 1)[-1] if ")" not in source else source[source.index(")") + 1:]
    for switch in ("rope", "swiglu", "rms_norm", "layer_norm"):
        if switch in inspect.signature(entry).parameters and not re.search(rf"\bif\b[^\n]*\b{switch}\b", body):
            notes.append(f"{entry.__name__} accepts {switch}= and never reads it")
    return notes
