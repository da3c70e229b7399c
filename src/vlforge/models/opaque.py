"""What vlforge's custom ops share: computations whose control flow follows a packed row's sample bounds (host-side
Python, read once per row) run as one opaque ``torch.library`` op under ``torch.compile``, where dynamo would
otherwise break the graph on them (and a break inside a checkpointed block sends the whole block back to eager).

Their backward re-runs the same eager forward under autograd and differentiates it (:func:`recomputed_grads`), so
an op needs no hand-written backward and no saved intermediates of whichever kernel ran; the cost is one more
forward of that computation. The ops' tensors of sample bounds are recognised as the row's own
(:func:`same_tensor`), so the host read happens once per row, not once per layer.

Example:
    >>> import torch
    >>> x = torch.randn(3, requires_grad=True)
    >>> (grad,) = recomputed_grads(lambda t: t.square(), [x], torch.ones(3), [True])
    >>> torch.allclose(grad, 2 * x)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def autograd_inside_op() -> Any:
    """A guard under which autograd records again inside a custom op's kernel (the dispatcher runs kernels with
    autograd's dispatch keys excluded; autocast's stay excluded, as in the forward)."""
    C = torch._C
    exclude = C._dispatch_tls_local_exclude_set()
    exclude = exclude.remove(C.DispatchKey.AutogradFunctionality).remove(C.DispatchKey.ADInplaceOrView)
    return C._ForceDispatchKeyGuard(C._dispatch_tls_local_include_set(), exclude)


def recomputed_grads(forward: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor | None],
                     grad: torch.Tensor, needed: Sequence[bool]) -> list[torch.Tensor]:
    """The gradients of ``forward(*inputs)`` against ``grad`` for every floating-point input ``needed`` says,
    contiguous (zeros where the output does not depend on it); an empty tensor for any other input."""
    with autograd_inside_op(), torch.enable_grad():
        leaves = [None if t is None else t.detach().requires_grad_(bool(want) and t.is_floating_point())
                  for t, want in zip(inputs, needed, strict=True)]
        wanted = [t for t in leaves if t is not None and t.requires_grad]
        out = forward(*leaves)
        found = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True) if wanted else ())
    grads = []
    for leaf in leaves:
        if leaf is None or not leaf.requires_grad:
            grads.append(torch.empty(0))
            continue
        value = next(found)
        grads.append(torch.zeros_like(leaf, memory_format=torch.contiguous_format) if value is None
                     else value.contiguous())
    return grads


def grad_shapes(inputs: Sequence[torch.Tensor | None], needed: Sequence[bool]) -> list[torch.Tensor]:
    """What :func:`recomputed_grads` returns for ``inputs``, as empty tensors (an op's fake kernel)."""
    return [t.new_empty(t.shape) if want and t is not None and t.is_floating_point() else torch.empty(0)
            for t, want in zip(inputs, needed, strict=True)]


def grads_or_none(grads: Sequence[torch.Tensor], needed: Sequence[bool]) -> list[torch.Tensor | None]:
    """:func:`recomputed_grads`'s answer as autograd wants it: None for an input that needs no gradient."""
    return [g if want else None for g, want in zip(grads, needed, strict=True)]


def autocast_inputs(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Floating-point ``tensors`` in autocast's lower precision where autocast is on for their device, as autocast
    casts a convolution's or attention's inputs in eager code: an op's kernel runs with autocast off (a compiled
    graph's runtime turns it off), so the caller casts what eager autocast would have."""
    device = next(t.device.type for t in tensors if t is not None)
    if not torch.is_autocast_enabled(device):
        return list(tensors)
    dtype = torch.get_autocast_dtype(device)
    return [t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors]


def version(tensor: torch.Tensor) -> int | None:
    """``tensor``'s version counter (bumped by every in-place write); None for an inference tensor (it has none)."""
    return None if tensor.is_inference() else tensor._version


def same_tensor(a: torch.Tensor, a_version: int | None, b: torch.Tensor) -> bool:
    """``b`` is the tensor ``a`` or a view of its memory (a compiled graph may hand an op another tensor object over
    the same storage), unwritten since ``a`` was at ``a_version`` (:func:`version`). Only sound while ``a`` is
    alive: its memory cannot have been reused."""
    if a_version is None or b.is_inference():
        return a is b
    return b._version == a_version and (a is b or (
        a.device == b.device and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        and a.data_ptr() == b.data_ptr()))
