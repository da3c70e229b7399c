"""The repeated blocks of a model (its family's decoder layer and vision block classes): checkpointing, compiling.

Activation checkpointing modes (``model.activation_checkpointing``):

* ``none``: autograd keeps every activation of every block;
* ``full``: each block keeps only its input and runs again in the backward (transformers' own
  ``activation_checkpointing_enable``, non-reentrant; what ``gradient_checkpointing: true`` means);
* ``selective``: op-level selective checkpointing (``torch.utils.checkpoint.create_selective_checkpoint_contexts``,
  as torchtitan's ``op`` mode): inside a block the outputs of the matrix multiplies and of the attention kernels
  (:data:`SAVED_OPS`) are kept, everything else (norms, activation functions, rope, residual adds, casts) is
  recomputed in the backward. Those recomputed ops are memory-bound and cheap while the kept ones are nearly all of
  a block's FLOPs, so the backward repeats almost no compute, and the elementwise activations, a large share of a
  decoder layer's saved bytes (SwiGLU's three hidden-width tensors, the norms' fp32 copies), are not kept.
  Chosen over every-Nth-layer checkpointing because it saves memory in every layer at a fixed small cost and
  needs no tuning of N per model and row length.

Both go through transformers' own ``activation_checkpointing_enable`` (non-reentrant), which checkpoints its
``GradientCheckpointingLayer`` modules: in every family these are the blocks its record names (``text_layer_class``,
``vision_block_class``), checked when applied (a record block left out is an error, another checkpointed layer a
warning). The gradients and the loss are the same as without (tests/train/test_levers.py), only memory and time
change.

Regional compilation (``model.compile``): each such block's forward runs through one ``torch.compile``'d function
(parameter names, ``state_dict`` keys and FSDP2 units stay as they are; identical blocks share its graphs), with a
checkpointed block's checkpoint inside it (:func:`compile_blocks` says why). Packed attention, text and vision
(``vlforge.models.varlen``), and the Gated DeltaNet mixers of a packed row (``vlforge.models.linear_attention``)
are ops there, so a block is one graph.

Example:
    >>> from vlforge.models.presets import meta_model
    >>> model = meta_model("tiny:qwen3_vl")                                            # doctest: +SKIP
    >>> sorted(block_counts(model, "qwen3_vl").values())                              # doctest: +SKIP
    [2, 2]
"""

from __future__ import annotations

import functools
import importlib
import logging
import time
import types
from collections import Counter
from typing import Any

import torch

from vlforge.errors import ConfigError
from vlforge.models import linear_attention, varlen  # noqa: F401  (both register their ops)
from vlforge.models.families import FAMILIES, family

logger = logging.getLogger(__name__)

CHECKPOINTING = ("none", "selective", "full")
"""The modes, fastest (most memory) first."""


def _saved_ops() -> frozenset:
    aten = torch.ops.aten
    names = ("mm", "addmm", "_grouped_mm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward", "_efficient_attention_forward")
    ops = {getattr(aten, name).default for name in names if hasattr(aten, name)}
    try:  # torch's packed varlen attention (vlforge.models.varlen on CUDA) is a custom op: one op to the policy
        importlib.import_module("torch.nn.attention.varlen")  # registers torch.ops.torch_attn

        ops |= {getattr(torch.ops.torch_attn, name).default for name in ("_varlen_attn", "_varlen_attn_out")
                if hasattr(torch.ops.torch_attn, name)}
    except (ImportError, AttributeError, RuntimeError):  # a torch without it
        pass
    # vlforge's ops under compile: packed attention and the Gated DeltaNet delta rule (the conv is memory-bound)
    ops |= {torch.ops.vlforge.packed_attention.default, torch.ops.vlforge.gated_deltanet_rule.default}
    return frozenset(ops)


SAVED_OPS = _saved_ops()
"""Ops whose outputs selective checkpointing keeps: matrix multiplies (linear layers, MoE experts) and fused
attention kernels (their output and log-sum-exp), torch's varlen attention op, and under compile vlforge's packed
attention and delta-rule ops. The batched ``bmm`` of a math-path attention is not among them: it would keep the
L x L scores."""


def selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """The op-level policy: keep :data:`SAVED_OPS` outputs, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context() -> tuple[Any, Any]:
    """A fresh pair of selective-checkpoint contexts (``context_fn`` of ``torch.utils.checkpoint``)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(selective_policy)


def _class_names(module: torch.nn.Module) -> set[str]:
    return {klass.__name__ for klass in type(module).__mro__}  # FSDP2's FSDP<Layer> subclass counts as <Layer>


def block_modules(model: torch.nn.Module, family_name: str) -> list[tuple[str, torch.nn.Module]]:
    """``(path, module)`` of every decoder layer and vision block of ``model``, by its family record's classes."""
    record = family(family_name)
    wanted = {record.text_layer_class, record.vision_block_class}
    return [(name, module) for name, module in model.named_modules() if _class_names(module) & wanted]


def block_counts(model: torch.nn.Module, family_name: str) -> Counter:
    """Class name -> how many blocks of it ``model`` has (record classes only)."""
    record = family(family_name)
    wanted = {record.text_layer_class, record.vision_block_class}
    return Counter(next(iter(_class_names(m) & wanted)) for _, m in block_modules(model, family_name))


def _describe(counts: Counter) -> str:
    return " + ".join(f"{n} {name}" for name, n in sorted(counts.items()))


def apply_checkpointing(model: torch.nn.Module, mode: str, family_name: str) -> Counter:
    """Switch ``model``'s blocks to checkpointing ``mode`` (``none`` leaves them as they are); returns the blocks
    by class. A model whose family record names classes it does not have is a :class:`ConfigError`."""
    if mode not in CHECKPOINTING:
        raise ValueError(f"activation checkpointing mode {mode!r} (known: {', '.join(CHECKPOINTING)})")
    if mode == "none":
        return Counter()
    known = family_name in FAMILIES
    counts = block_counts(model, family_name) if known else Counter()
    if known and not counts:
        record = family(family_name)
        raise ConfigError(f"model.activation_checkpointing: {mode}: {type(model).__name__} has no "
                          f"{record.text_layer_class} or {record.vision_block_class} (family {family_name})")
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if mode == "selective":
        kwargs["context_fn"] = selective_context
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if not known:  # no record: every layer transformers checkpoints
        model.config.use_cache = False
        logger.info("activation checkpointing: %s on the layers transformers checkpoints (%s has no vlforge record)",
                    mode, family_name)
        return counts
    unwrapped = [name for name, m in block_modules(model, family_name) if not getattr(m, "gradient_checkpointing", 0)]
    if unwrapped:  # the record's blocks are the ones transformers checkpoints: anything else is a stale record
        raise ConfigError(f"model.activation_checkpointing: {mode}: transformers did not checkpoint "
                          f"{unwrapped[0]} (+{len(unwrapped) - 1} more)")
    ours = {id(m) for _, m in block_modules(model, family_name)}
    others = sorted({type(m).__name__ for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True
                     and hasattr(m, "_gradient_checkpointing_func") and id(m) not in ours
                     and "GradientCheckpointingLayer" in _class_names(m)})
    if others:
        logger.warning("activation checkpointing: transformers also checkpoints %s (not in the %s record)",
                       ", ".join(others), family_name)
    model.config.use_cache = False
    logger.info("activation checkpointing: %s on %s", mode, _describe(counts))
    return counts


def compile_blocks(model: torch.nn.Module, family_name: str, **options: Any) -> Counter:
    """Compile the forward of every block of ``model`` (the compilation itself happens on first use).

    Blocks of one kind (class and child modules: Qwen3.5's linear- and full-attention layers are two kinds, a
    dense and a sparse MoE layer too) share one compiled function and its graphs; each kind has its own function,
    so each has dynamo's whole cache of ``recompile_limit`` entries (a static and a dynamic shape, training and
    eval) instead of every kind of the model sharing one, which a vision tower and two layer kinds overflow within
    two steps (the overflow runs eager, silently but for dynamo's warning). A checkpointed block is compiled
    around its checkpoint, as torchtitan orders them: under ``module.compile()`` transformers' checkpointing (its
    layers' forward wrapper) runs inside the compiled call, and with the checkpoint's saved-tensor hooks dynamo
    compiled no graph (measured through ``vlforge train``), so the checkpoint moves into the compiled function
    (same checkpoint function and policy, transformers' flag off; dynamo traces it as one region and compiles the
    recomputation with it). Module hooks (FSDP2's) stay outside the compiled code. The checkpointing mode is fixed
    from here on (``gradient_checkpointing_enable``/``disable`` no longer reach these blocks)."""
    counts = block_counts(model, family_name)
    if not counts:
        record = family(family_name)
        raise ConfigError(f"model.compile: {type(model).__name__} has no {record.text_layer_class} or "
                          f"{record.vision_block_class} (family {family_name})")
    varlen.use_for_vision(model)  # the towers' per-image attention as one op, not a host-side split
    limit = _raise_recompile_limit()
    compiled: dict[tuple[str, ...], Any] = {}
    checkpointed = 0
    for _, module in block_modules(model, family_name):
        kind = (type(module).__name__, *(f"{name}:{type(child).__name__}" for name, child in module._modules.items()))
        if kind not in compiled:
            compiled[kind] = torch.compile(_own_copy(_block_forward, len(compiled)), **options)
        checkpoint = None
        if getattr(module, "gradient_checkpointing", False):
            checkpoint = module._gradient_checkpointing_func
            module.gradient_checkpointing = False  # transformers' __call__ no longer checkpoints: the compiled code does
            checkpointed += 1
        module.forward = functools.partial(compiled[kind], module.forward, checkpoint)
        module._vlforge_compiled = True
    logger.info("compile: torch.compile on %s (%d kinds, up to %d graphs each)%s (compiled on first use; the time "
                "is logged)", _describe(counts), len(compiled), limit,
                f", their checkpoints inside the compiled code ({checkpointed} blocks)" if checkpointed else "")
    return counts


RECOMPILE_LIMIT = 32
"""Graphs dynamo keeps per compiled function (its ``recompile_limit``, 8 by default), raised to this: a block kind
takes one per static and dynamic shape, training and eval, and each set of keyword arguments the model passes
through (a batch with a video hands the vision blocks ``second_per_grid_ts``, one without does not), so 8 run out
within a few steps of mixed media and every later variant runs eager."""


def _raise_recompile_limit() -> int:
    import torch._dynamo

    config = torch._dynamo.config
    if config.recompile_limit < RECOMPILE_LIMIT:
        logger.info("compile: dynamo's recompile_limit %d -> %d (see vlforge.models.blocks.RECOMPILE_LIMIT)",
                    config.recompile_limit, RECOMPILE_LIMIT)
        config.recompile_limit = RECOMPILE_LIMIT
    return config.recompile_limit


def _own_copy(function: Any, number: int) -> Any:
    """``function`` with a code object of its own (dynamo keeps its cache on the code object)."""
    code = function.__code__.replace(co_name=f"{function.__name__}_{number}")
    copy = types.FunctionType(code, function.__globals__, code.co_name, function.__defaults__, function.__closure__)
    copy.__doc__ = function.__doc__
    return copy


def _block_forward(forward: Any, checkpoint: Any, *args: Any, **kwargs: Any) -> Any:
    """A block's forward, inside ``checkpoint`` (``torch.utils.checkpoint.checkpoint`` with the mode's options)
    when the block trains; as transformers' checkpointing layer, only the positional arguments are checkpoint
    inputs."""
    if checkpoint is not None and forward.__self__.training and torch.is_grad_enabled():
        return checkpoint(functools.partial(forward, **_no_cache(forward.__self__, kwargs)), *args)
    return forward(*args, **kwargs)


def _no_cache(module: torch.nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """What transformers' checkpointing wrapper does before it checkpoints: no KV cache is built (a recomputed
    forward would append to it twice)."""
    kwargs = dict(kwargs)
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    if not getattr(module, "_can_checkpoint_with_cache", False):
        for name in ("cache", "layer_past"):
            if kwargs.get(name) is not None:
                kwargs[name] = None
    return kwargs


def is_compiled(module: torch.nn.Module) -> bool:
    """Whether :func:`compile_blocks` compiled ``module``'s forward."""
    return bool(module.__dict__.get("_vlforge_compiled"))


def any_compiled(model: torch.nn.Module) -> bool:
    """Whether :func:`compile_blocks` compiled any block of ``model`` (what later forward swaps that dynamo cannot
    trace, sequence parallelism's, ask before they keep dynamo out)."""
    return any(is_compiled(m) for m in model.modules())


def compiled_graphs() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters.get("stats", {}).get("unique_graphs", 0))


def graph_breaks() -> Counter:
    """Reason -> how many times dynamo broke a graph in this process so far."""
    from torch._dynamo.utils import counters

    return Counter(counters.get("graph_break", {}))


class CompileWatch:
    """Logs the steps during which new graphs were compiled, with their wall time (compilation included):
    the first step, a step with a new shape, the first step with images. Graph breaks in a step are a warning:
    one inside a checkpointed block runs that whole kind of block eager, even while other kinds compile."""

    def __init__(self, first_step: int = 1) -> None:
        self.first_step = first_step
        self.graphs = compiled_graphs()
        self.breaks = graph_breaks()
        self.begun = 0.0
        self.total = 0.0

    def begin(self) -> None:
        self.begun = time.perf_counter()

    def end(self, step: int) -> None:
        graphs = compiled_graphs()
        if step == self.first_step and graphs == self.graphs:
            logger.warning("model.compile: step %d compiled no graph: the blocks ran eager (see the warnings above; "
                           "TORCH_LOGS=graph_breaks says why)", step)
        breaks = graph_breaks()
        new = breaks - self.breaks
        if new:
            reason, count = new.most_common(1)[0]
            logger.warning("model.compile: step %d broke %d graph(s) (%d reason(s); most often, %d times: %s); a break "
                           "inside a checkpointed block runs that kind of block eager (TORCH_LOGS=graph_breaks says "
                           "where)", step, sum(new.values()), len(new), count, reason.splitlines()[0][:200])
            self.breaks = breaks
        if graphs > self.graphs:
            seconds = time.perf_counter() - self.begun
            self.total += seconds
            logger.info("compile: step %d compiled %d new graph(s) and took %.1f s (%.1f s in such steps so far)",
                        step, graphs - self.graphs, seconds, self.total)
            self.graphs = graphs
