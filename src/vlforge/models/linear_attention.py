"""Packed rows through Gated DeltaNet linear attention (Qwen3.5): each sample's conv window and recurrent state
start fresh at its boundary.

transformers' ``Qwen3_5GatedDeltaNet`` runs its short causal depthwise conv and its gated delta rule over the whole
row: in a packed row every sample's state flows into the next (with restarting position ids it silently leaks;
given ``cu_seq_lens_q`` it refuses without flash-linear-attention, and even with it the conv is never told where a
sample starts). :func:`use_for_packed_rows` gives every Gated DeltaNet module of a model a forward that keeps the
stock projections, gates, gated norm and output projection and splits only the two sequence mixers at the sample
boundaries (the ``cu_seq_lens_q`` keyword vlforge passes for a packed row, as :mod:`vlforge.models.varlen` reads):

- with CUDA tensors, each mixer through an optional kernel where one is installed, with the kernel's own
  packed-sequence argument: the conv through ``causal_conv1d_fn(..., seq_idx=)`` (causal-conv1d) or else fla's
  Triton ``causal_conv1d(..., cu_seqlens=)``, the delta rule through fla's ``chunk_gated_delta_rule(...,
  cu_seqlens=)`` - one call per layer each;
- anywhere else (CPU, or no kernel for that mixer): transformers' own torch functions once per sample, each with a
  zero conv context and a zero initial state, which is exactly the computation of separate forwards.

Without boundaries (an unpacked batch, generation with a cache) the stock forward runs. The change is on the module
instances only (their class, other models and the checkpoint are untouched); :class:`LinearAttentionPatch.restore`
undoes it.

Example (CPU, seconds):
    >>> from vlforge.models import load                                        # doctest: +SKIP
    >>> patch = use_for_packed_rows(load("tiny:qwen3_5").model)                # doctest: +SKIP
    >>> patch.count                                                            # doctest: +SKIP
    1
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import itertools
import logging
import sys
import types
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from vlforge.models.opaque import (
    autocast_inputs,
    autograd_inside_op,
    grad_shapes,
    grads_or_none,
    recomputed_grads,
    same_tensor,
    version,
)

logger = logging.getLogger(__name__)

BOUNDARY_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")
"""The packed-row keywords the decoder layer forwards; the stock functions never see them."""


def is_gated_deltanet(module: torch.nn.Module) -> bool:
    """A Gated DeltaNet token mixer of transformers (Qwen3.5, Qwen3.5-MoE): the class name says so."""
    return type(module).__name__.endswith("GatedDeltaNet")


_MIXERS = ("causal_conv1d_fn", "causal_conv1d_update", "torch_chunk_gated_delta_rule",
           "torch_recurrent_gated_delta_rule")
"""The modeling module's sequence-mixer functions. transformers wraps each so that it dispatches to causal-conv1d
or fla when those import - whatever the tensors' device, meta included."""


def reference(module: torch.nn.Module, name: str) -> Any:
    """transformers' own torch implementation of the mixer ``name`` of ``module``'s modeling module, unwrapped
    from its kernel dispatch (so it computes in torch on any device, whatever is installed)."""
    return inspect.unwrap(vars(sys.modules[type(module).__module__])[name])


@contextlib.contextmanager
def reference_mixers(model: torch.nn.Module) -> Iterator[int]:
    """Within the block, the stock Gated DeltaNet layers of ``model`` compute with transformers' torch functions
    (the meta-device memory probes need this: a Triton kernel launched on meta tensors writes through null
    pointers on the current GPU). Yields how many modeling modules were switched; restores them on exit."""
    modules = {sys.modules[type(m).__module__] for m in model.modules() if is_gated_deltanet(m)}
    saved = [(mod, name, vars(mod)[name]) for mod in modules for name in _MIXERS if name in vars(mod)]
    try:
        for mod, name, fn in saved:
            setattr(mod, name, inspect.unwrap(fn))
        yield len(modules)
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


def sample_bounds(cu_seqlens: torch.Tensor, length: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each non-empty sample of a row of ``length`` tokens; a pad tail past the last boundary
    is one more sample (as :mod:`vlforge.models.varlen` treats it)."""
    cu = [int(x) for x in cu_seqlens.reshape(-1).tolist()]
    if not cu or cu[0] != 0:
        cu = [0, *cu]
    if cu[-1] > length:
        raise ValueError(f"the packed row's boundaries end at {cu[-1]} but it has {length} tokens")
    bounds = [(a, b) for a, b in itertools.pairwise(cu) if b > a]
    if cu[-1] < length:
        bounds.append((cu[-1], length))
    return bounds


@dataclass
class _Row:
    """The sample boundaries of the packed row being run, read from its boundary tensor once per forward: every
    Gated DeltaNet layer gets the same tensor object, so the host sync (and the kernels' index tensors) happen once,
    not once per layer."""

    source: Any  # a weak reference to the boundary tensor these were read from
    length: int
    bounds: list[tuple[int, int]]
    index: dict[Any, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    version: int | None = None  # the boundary tensor's version counter when read

    def kernel_index(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``seq_idx`` (1, T) int32 for causal-conv1d and ``cu_seqlens`` int64 for fla, on ``device``."""
        if device not in self.index:
            lengths = torch.tensor([b - a for a, b in self.bounds])
            seq_idx = torch.repeat_interleave(torch.arange(len(self.bounds), dtype=torch.int32), lengths)
            cu = torch.tensor([0, *(b for _, b in self.bounds)], dtype=torch.long)
            self.index[device] = (seq_idx.reshape(1, -1).contiguous().to(device), cu.to(device))
        return self.index[device]


_LAST_ROW: list[_Row] = []


def _is_source(row: _Row, tensor: torch.Tensor) -> bool:
    known = row.source()
    return known is not None and same_tensor(known, row.version, tensor)


def _row_of(kwargs: dict[str, Any], length: int) -> _Row | None:
    cu = kwargs.get("cu_seq_lens_q")
    source = cu if cu is not None else kwargs.get("seq_idx")  # or a per-token sample index (DataCollatorWithFlattening)
    if source is None:
        return None
    if _LAST_ROW and _LAST_ROW[0].length == length and _is_source(_LAST_ROW[0], source):
        return _LAST_ROW[0]
    if cu is None:
        idx = source.reshape(-1)
        starts = (torch.nonzero(idx[1:] != idx[:-1]).reshape(-1) + 1).tolist()
        cu = torch.tensor([0, *starts, idx.numel()])
    row = _Row(weakref.ref(source), length, sample_bounds(cu, length), version=version(source))
    _LAST_ROW[:] = [row]
    return row


@dataclass(frozen=True)
class Kernels:
    """The optional CUDA kernels with packed-sequence arguments (None where not installed)."""

    causal_conv1d_fn: Any = None  # causal-conv1d: (B, C, T) channel-last x, seq_idx
    chunk_gated_delta_rule: Any = None  # fla: (B, T, H, D), cu_seqlens
    fla_causal_conv1d: Any = None  # fla's Triton conv: (B, T, C), cu_seqlens

    @property
    def usable(self) -> bool:
        return self.conv is not None or self.chunk_gated_delta_rule is not None

    @property
    def conv(self) -> Any:
        return self.causal_conv1d_fn or self.fla_causal_conv1d

    def describe(self) -> str:
        if not self.usable:
            return "torch per sample (neither causal-conv1d nor flash-linear-attention is usable here)"
        conv = ("causal-conv1d" if self.causal_conv1d_fn else "fla's Triton conv" if self.fla_causal_conv1d
                else "torch per sample")
        rule = "fla" if self.chunk_gated_delta_rule else "torch per sample"
        return f"on CUDA: conv {conv}, delta rule {rule}; elsewhere torch per sample"


_FOUND: list[Kernels] = []


def _optional(module: str, name: str, package: str) -> Any:
    """``module.name`` where ``module`` imports; a build for another torch/CUDA is absent, and said once."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return None
    try:
        return getattr(importlib.import_module(module), name)
    except Exception as error:
        logger.warning("%s does not import here (%s); Gated DeltaNet uses the torch path for it", package, error)
        return None


def kernels() -> Kernels:
    """causal-conv1d's ``causal_conv1d_fn`` and fla's ``chunk_gated_delta_rule`` and Triton ``causal_conv1d``
    where they import (looked up once)."""
    if not _FOUND:
        _FOUND.append(Kernels(
            causal_conv1d_fn=_optional("causal_conv1d", "causal_conv1d_fn", "causal-conv1d"),
            chunk_gated_delta_rule=_optional("fla.ops.gated_delta_rule", "chunk_gated_delta_rule",
                                             "flash-linear-attention"),
            fla_causal_conv1d=_optional("fla.modules.causal_conv1d", "causal_conv1d", "flash-linear-attention")))
    return _FOUND[0]


def _kernel_device(x: torch.Tensor) -> bool:
    """Whether ``x`` lives where the optional kernels run (CUDA)."""
    return x.is_cuda


_CHECK_LENGTHS = (37, 3, 90)  # a packed row crossing fla's 64-token chunk, with a sample shorter than the conv
_CHECKED: dict[str, Kernels] = {}


def kernels_on(module: torch.nn.Module, device: torch.device) -> Kernels:
    """The kernels that passed their check on ``device`` (once per device and process): each found kernel runs a
    small packed row of ``module``'s shapes forward and backward in float32 against transformers' torch function
    per sample; one that raises or disagrees is left out, with one warning naming why (e.g. fla refuses its gated
    backward on Hopper with Triton 3.4-3.7.0, a build for another CUDA does not launch)."""
    key = str(device)
    if key not in _CHECKED:
        found = kernels()
        _CHECKED[key] = Kernels(
            causal_conv1d_fn=_passes("causal-conv1d's causal_conv1d_fn", found.causal_conv1d_fn,
                                     lambda fn: _check_conv(module, device, Kernels(causal_conv1d_fn=fn))),
            chunk_gated_delta_rule=_passes("fla's chunk_gated_delta_rule", found.chunk_gated_delta_rule,
                                           lambda fn: _check_rule(module, device, fn)),
            fla_causal_conv1d=_passes("fla's Triton causal_conv1d", found.fla_causal_conv1d,
                                      lambda fn: _check_conv(module, device, Kernels(fla_causal_conv1d=fn))))
        logger.info("Gated DeltaNet kernels on %s: %s", key, _CHECKED[key].describe())
    return _CHECKED[key]


def _passes(name: str, fn: Any, check: Any) -> Any:
    if fn is None:
        return None
    try:
        with autograd_inside_op(), torch.enable_grad(), torch.autocast("cuda", enabled=False), \
                torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):  # outside any checkpointing and
            # op kernel (under compile the first check runs inside the conv op, where autograd is off)
            error = check(fn)
    except Exception as exc:  # a kernel that cannot run here is left out, not fatal
        logger.warning("%s does not run here (%s: %s); Gated DeltaNet uses the torch path for it", name,
                       type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return None
    if error > 1e-2:
        logger.warning("%s disagrees with transformers' torch function on a packed row (max relative error %.2e); "
                       "Gated DeltaNet uses the torch path for it", name, error)
        return None
    return fn


def _row_check(device: torch.device) -> tuple[list[tuple[int, int]], torch.Tensor, torch.Tensor]:
    cu = torch.tensor([0, *itertools.accumulate(_CHECK_LENGTHS)], device=device)
    seq_idx = torch.repeat_interleave(torch.arange(len(_CHECK_LENGTHS), device=device, dtype=torch.int32),
                                      torch.tensor(_CHECK_LENGTHS, device=device))[None]
    return list(itertools.pairwise(cu.tolist())), cu, seq_idx.contiguous()


def _relative(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((a.detach().float() - b.detach().float()).abs().max() / b.detach().float().abs().max().clamp_min(1e-6))
               for a, b in zip(got, want, strict=True))


def _check_conv(module: torch.nn.Module, device: torch.device, found: Kernels) -> float:
    generator = torch.Generator(device=device).manual_seed(0)
    channels, width = module.conv1d.weight.shape[0], module.conv1d.weight.shape[-1]
    bounds, cu, idx = _row_check(device)
    x = torch.randn(1, channels, cu[-1].item(), device=device, generator=generator, requires_grad=True)
    w = torch.randn(channels, width, device=device, generator=generator, requires_grad=True)
    out = _kernel_conv(found, x, w, None, module.activation, idx, cu)
    want = _torch_conv(module, x, w, None, bounds)
    grad = torch.randn(want.shape, device=device, generator=generator)
    got_grads = torch.autograd.grad(out, (x, w), grad, retain_graph=True)
    want_grads = torch.autograd.grad(want, (x, w), grad)
    return _relative([out, *got_grads], [want, *want_grads])


def _check_rule(module: torch.nn.Module, device: torch.device, fn: Any) -> float:
    generator = torch.Generator(device=device).manual_seed(0)
    bounds, cu, _ = _row_check(device)
    length, hk, hv = int(cu[-1]), module.num_k_heads, module.num_v_heads

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=generator).requires_grad_()

    q, k, v = rand(1, length, hk, module.head_k_dim), rand(1, length, hk, module.head_k_dim), \
        rand(1, length, hv, module.head_v_dim)
    g_in, b_in = rand(1, length, hv), rand(1, length, hv)
    inputs = (q, k, v, g_in, b_in)
    g, beta = -F.softplus(g_in), b_in.sigmoid()
    out = _kernel_rule(fn, q, k, v, g, beta, cu)
    want = _torch_rule(module, q, k, v, g, beta, bounds)
    grad = torch.randn(want.shape, device=device, generator=generator)
    got_grads = torch.autograd.grad(out, inputs, grad, retain_graph=True)  # g and beta are shared
    want_grads = torch.autograd.grad(want, inputs, grad)
    return _relative([out, *got_grads], [want, *want_grads])


def _kernel_conv(found: Kernels, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 activation: str, seq_idx: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """``x`` (1, C, T) through causal-conv1d (``seq_idx``, channel-last) or else fla's Triton conv
    (``cu_seqlens``, time-major)."""
    if found.causal_conv1d_fn is not None:
        if x.stride(1) != 1:  # causal-conv1d takes seq_idx for a channel-last layout only
            x = x.transpose(1, 2).contiguous().transpose(1, 2)
        return found.causal_conv1d_fn(x, weight, bias, seq_idx=seq_idx, activation=activation)
    out, _ = found.fla_causal_conv1d(x.transpose(1, 2), weight, bias, activation=activation, cu_seqlens=cu)
    return out.transpose(1, 2)


def _torch_conv(module: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                bounds: list[tuple[int, int]]) -> torch.Tensor:
    """transformers' torch conv once per sample (a zero left context at each start)."""
    conv = reference(module, "causal_conv1d_fn")
    return torch.cat([conv(x[:, :, a:b], weight, bias, activation=module.activation) for a, b in bounds], dim=2)


def _kernel_rule(fn: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    out, _ = fn(query, key, value, g=g, beta=beta, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    return out


def _torch_rule(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                g: torch.Tensor, beta: torch.Tensor, bounds: list[tuple[int, int]]) -> torch.Tensor:
    """transformers' torch chunked delta rule once per sample (a zero state at each start)."""
    rule = reference(module, "torch_chunk_gated_delta_rule")
    return torch.cat([rule(query[:, a:b], key[:, a:b], value[:, a:b], g=g[:, a:b], beta=beta[:, a:b],
                           initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=True)[0]
                      for a, b in bounds], dim=1)


def row_of_bounds(bounds: list[tuple[int, int]]) -> _Row:
    """The row of the given sample bounds (reused while the same bounds come again, as every layer of a forward
    sees them: the kernels' index tensors are then built once per forward)."""
    bounds = [(int(a), int(b)) for a, b in bounds]
    if _LAST_ROW and _LAST_ROW[0].bounds == bounds:
        return _LAST_ROW[0]
    row = _Row(lambda: None, bounds[-1][1], bounds)
    _LAST_ROW[:] = [row]
    return row


def packed_causal_conv1d(module: torch.nn.Module, x: torch.Tensor, row: _Row,
                         channels: torch.Tensor | None = None) -> torch.Tensor:
    """The layer's depthwise causal conv over ``x`` (1, C, T), with a zero left context at every sample start;
    ``channels``: the indices of the layer's conv channels ``x`` holds (all of them when None)."""
    weight, bias = module.conv1d.weight.squeeze(1), module.conv1d.bias
    if channels is not None:
        weight, bias = weight[channels], None if bias is None else bias[channels]
    return _conv(module, x, weight, bias, row)


def _conv(module: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
          row: _Row) -> torch.Tensor:
    found = kernels_on(module, x.device) if _kernel_device(x) else Kernels()
    if found.conv is not None:
        seq_idx, cu = row.kernel_index(x.device)
        return _kernel_conv(found, x, weight, bias, module.activation, seq_idx, cu)
    return _torch_conv(module, x, weight, bias, row.bounds)


def packed_delta_rule(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      g: torch.Tensor, beta: torch.Tensor, row: _Row) -> torch.Tensor:
    """The chunked gated delta rule over (1, T, H, D) inputs with a zero state at every sample start."""
    found = kernels_on(module, query.device) if _kernel_device(query) else Kernels()
    if found.chunk_gated_delta_rule is not None:
        _, cu = row.kernel_index(query.device)
        return _kernel_rule(found.chunk_gated_delta_rule, query, key, value, g, beta, cu)
    return _torch_rule(module, query, key, value, g, beta, row.bounds)


# -- under torch.compile: the two mixers as opaque ops (vlforge.models.opaque) --------------------------------------
_LAYERS: dict[str, weakref.WeakSet] = {}
"""Modeling module name -> its live packed-row Gated DeltaNet layers (the ops take no module: the kernel checks and
transformers' torch functions are the same for every layer of that module; any live one serves)."""


def _layer(modeling: str) -> torch.nn.Module:
    for layer in _LAYERS.get(modeling, ()):
        return layer
    raise RuntimeError(f"no live Gated DeltaNet layer of {modeling} (use_for_packed_rows was not called on it)")


def _row_for(cu_seqlens: torch.Tensor, length: int) -> _Row:
    return _row_of({"cu_seq_lens_q": cu_seqlens}, length)


@torch.library.custom_op("vlforge::gated_deltanet_conv", mutates_args=())
def gated_deltanet_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cu_seqlens: torch.Tensor,
                        modeling: str) -> torch.Tensor:
    """:func:`packed_causal_conv1d` as one op: (1, C, T) in and out."""
    return _conv_eager(x, weight, bias, cu_seqlens, modeling).contiguous()


def _conv_eager(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cu_seqlens: torch.Tensor,
                modeling: str) -> torch.Tensor:
    return _conv(_layer(modeling), x, weight, bias, _row_for(cu_seqlens, x.shape[-1]))


@gated_deltanet_conv.register_fake
def _conv_shape(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cu_seqlens: torch.Tensor,
                modeling: str) -> torch.Tensor:
    return x.new_empty(x.shape)


@torch.library.custom_op("vlforge::gated_deltanet_conv_backward", mutates_args=())
def _conv_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   cu_seqlens: torch.Tensor, modeling: str, needed: list[bool]) -> list[torch.Tensor]:
    return recomputed_grads(lambda *t: _conv_eager(*t, cu_seqlens, modeling), [x, weight, bias], grad, needed)


@_conv_backward.register_fake
def _conv_backward_shape(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         cu_seqlens: torch.Tensor, modeling: str, needed: list[bool]) -> list[torch.Tensor]:
    return grad_shapes([x, weight, bias], needed)


def _keep_conv_inputs(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, weight, bias, cu_seqlens, ctx.modeling = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, bias, cu_seqlens)


def _conv_grads(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, weight, bias, cu_seqlens = ctx.saved_tensors
    needed = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
    grads = _conv_backward(grad.contiguous(), x, weight, bias if ctx.has_bias else None, cu_seqlens, ctx.modeling,
                           needed)
    return *grads_or_none(grads, needed), None, None


gated_deltanet_conv.register_autograd(_conv_grads, setup_context=_keep_conv_inputs)


@torch.library.custom_op("vlforge::gated_deltanet_rule", mutates_args=())
def gated_deltanet_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                        beta: torch.Tensor, cu_seqlens: torch.Tensor, modeling: str) -> torch.Tensor:
    """:func:`packed_delta_rule` as one op: (1, T, H, D) in, (1, T, value heads, value dim) out."""
    return _rule_eager(query, key, value, g, beta, cu_seqlens, modeling).contiguous()


def _rule_eager(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                cu_seqlens: torch.Tensor, modeling: str) -> torch.Tensor:
    row = _row_for(cu_seqlens, query.shape[1])
    return packed_delta_rule(_layer(modeling), query, key, value, g, beta, row).to(query.dtype)


@gated_deltanet_rule.register_fake
def _rule_shape(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                cu_seqlens: torch.Tensor, modeling: str) -> torch.Tensor:
    return value.new_empty(value.shape, dtype=query.dtype)


@torch.library.custom_op("vlforge::gated_deltanet_rule_backward", mutates_args=())
def _rule_backward(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                   beta: torch.Tensor, cu_seqlens: torch.Tensor, modeling: str, needed: list[bool]) -> list[torch.Tensor]:
    return recomputed_grads(lambda *t: _rule_eager(*t, cu_seqlens, modeling), [query, key, value, g, beta], grad,
                            needed)


@_rule_backward.register_fake
def _rule_backward_shape(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         g: torch.Tensor, beta: torch.Tensor, cu_seqlens: torch.Tensor, modeling: str,
                         needed: list[bool]) -> list[torch.Tensor]:
    return grad_shapes([query, key, value, g, beta], needed)


def _keep_rule_inputs(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    *tensors, ctx.modeling = inputs
    ctx.save_for_backward(*tensors)


def _rule_grads(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    *tensors, cu_seqlens = ctx.saved_tensors
    needed = list(ctx.needs_input_grad[:5])
    grads = _rule_backward(grad.contiguous(), *tensors, cu_seqlens, ctx.modeling, needed)
    return *grads_or_none(grads, needed), None, None


gated_deltanet_rule.register_autograd(_rule_grads, setup_context=_keep_rule_inputs)


def packed_forward(self: torch.nn.Module, hidden_states: torch.Tensor, cache: Any = None,
                   attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
    """The Gated DeltaNet forward with sample boundaries (see the module docstring)."""
    cache = kwargs.pop("cache_params", cache)  # the stock forward's older name
    cu = kwargs.get("cu_seq_lens_q")
    if torch.compiler.is_compiling() and cu is not None and cache is None and hidden_states.shape[0] == 1:
        stock = vars(sys.modules[type(self).__module__])
        return mix(self, stock["apply_mask_to_padding_states"](hidden_states, attention_mask), cu)
    row = _row_of(kwargs, hidden_states.shape[1])
    rest = {k: v for k, v in kwargs.items() if k not in BOUNDARY_KEYS}
    if row is None:
        return self._vlforge_stock_forward(hidden_states, cache=cache, attention_mask=attention_mask, **rest)
    if cache is not None:
        raise ValueError("a packed row (cu_seq_lens_q) is for training: run it with use_cache=False")
    if hidden_states.shape[0] != 1:
        raise ValueError(f"a packed batch is one row, got {hidden_states.shape[0]}")
    stock = vars(sys.modules[type(self).__module__])
    hidden_states = stock["apply_mask_to_padding_states"](hidden_states, attention_mask)  # as the stock layer
    return mix(self, hidden_states, row)


def mix(self: torch.nn.Module, hidden_states: torch.Tensor, row: _Row | torch.Tensor) -> torch.Tensor:
    """Projections, the per-sample conv and delta rule, the gated norm and the output projection of one row;
    ``row``: its bounds, or under compile the tensor of its bounds (the mixers then run as ops)."""
    batch, length, _ = hidden_states.shape
    qkv = self.in_proj_qkv(hidden_states).transpose(1, 2)
    if isinstance(row, torch.Tensor):  # the conv's inputs as autocast gives F.conv1d them in eager code
        qkv, weight, bias = autocast_inputs(qkv, self.conv1d.weight.squeeze(1), self.conv1d.bias)
        mixed = gated_deltanet_conv(qkv, weight, bias, row, type(self).__module__)
    else:
        mixed = packed_causal_conv1d(self, qkv, row)
    mixed = mixed.transpose(1, 2)
    z = self.in_proj_z(hidden_states).reshape(batch, length, -1, self.head_v_dim)
    b, a = self.in_proj_b(hidden_states), self.in_proj_a(hidden_states)
    query, key, value = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    query = query.reshape(batch, length, -1, self.head_k_dim)
    key = key.reshape(batch, length, -1, self.head_k_dim)
    value = value.reshape(batch, length, -1, self.head_v_dim)
    beta = b.sigmoid()
    g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    if isinstance(row, torch.Tensor):
        core = gated_deltanet_rule(query, key, value, g, beta, row, type(self).__module__)
    else:
        core = packed_delta_rule(self, query, key, value, g, beta, row)
    core = self.norm(core.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(core.reshape(batch, length, -1))


@dataclass
class LinearAttentionPatch:
    """The Gated DeltaNet modules given :func:`packed_forward`; :meth:`restore` gives them back their own."""

    modules: list[torch.nn.Module] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.modules)

    def restore(self) -> int:
        for module in self.modules:
            module.__dict__.pop("forward", None)
            module.__dict__.pop("_vlforge_stock_forward", None)
        count, self.modules = len(self.modules), []
        return count


def use_for_packed_rows(model: torch.nn.Module) -> LinearAttentionPatch:
    """Give every Gated DeltaNet module of ``model`` the boundary-aware forward (idempotent; logged). Raises when
    the model has none: only a family with linear attention asks for it."""
    patch = LinearAttentionPatch([m for m in model.modules() if is_gated_deltanet(m)])
    if not patch.modules:
        raise ValueError(f"{type(model).__name__} has no Gated DeltaNet layer to make packed-row aware")
    for module in patch.modules:
        _LAYERS.setdefault(type(module).__module__, weakref.WeakSet()).add(module)
        if "_vlforge_stock_forward" not in module.__dict__:
            module._vlforge_stock_forward = module.forward
            module.forward = types.MethodType(packed_forward, module)
    path = kernels().describe()
    logger.info("packed rows: %d Gated DeltaNet layer(s) restart their conv and state at each sample (%s)",
                patch.count, path)
    return patch
