"""Time components through forward hooks and attribute FLOPs to them, without touching the forward.

Each component gets a pre-hook (push a start marker) and a post-hook (pop, record the end marker).
Markers are ``time.perf_counter`` on CPU and CUDA events on GPU (read after one synchronisation at
the end of the forward, so hooks never stall the device). A call's *inclusive* time runs from its
pre- to its post-hook; its *exclusive* time is that minus the inclusive time of the hooked
components called inside it. Exclusive times of all components add up to the root's inclusive
time, which is the whole forward.

FLOPs come from a ``TorchDispatchMode`` that sees every aten op and charges torch's own analytic
formula for it (``torch.utils.flop_counter.flop_registry``: ``mm``/``addmm``/``bmm`` = 2·M·N·K,
convolution = 2·K·O·windows, attention = 4·B·H·Sq·Sk·D) to the innermost running component.

Example:
    >>> import torch
    >>> from vlforge.profile.timer import ComponentTimer
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    >>> timer = ComponentTimer([("root", model), ("fc", model[0])])
    >>> with timer.attached(), timer.counting_flops() as flops:
    ...     _ = model(torch.randn(3, 4))
    >>> flops["fc"], flops["root"]
    (192, 0)
    >>> timer.detach_calls()["fc"].calls
    1
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_flop_count


@dataclass
class CallTimes:
    """Time one component took in one forward (all its calls added), in milliseconds."""

    calls: int = 0
    inclusive_ms: float = 0.0
    exclusive_ms: float = 0.0


def _sdpa_like_flops(args: Sequence[Any]) -> int:
    query, key, value = args[:3]
    if query.dim() == 3:  # (heads, seq, dim) in some varlen paths
        return sdpa_flop_count((1, *query.shape), (1, *key.shape), (1, *value.shape))
    return sdpa_flop_count(tuple(query.shape), tuple(key.shape), tuple(value.shape))


class _FlopMode(TorchDispatchMode):
    def __init__(self, timer: ComponentTimer, counts: dict[str, int]) -> None:
        super().__init__()
        self.timer = timer
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        formula = flop_registry.get(packet)
        if formula is not None:
            flops = formula(*args, **kwargs, out_val=out)
        elif "scaled_dot_product" in packet.__name__ and "backward" not in packet.__name__:
            flops = _sdpa_like_flops(args)  # the CPU flash kernel is not in torch's registry
        else:
            return out
        self.counts[self.timer.current() or self.timer.names[0]] += int(flops)
        return out


class ComponentTimer:
    """Hooks that time named modules per forward; see the module docstring for the rules."""

    def __init__(self, components: Sequence[tuple[str, nn.Module]], *, device: torch.device | None = None) -> None:
        self.names = [name for name, _ in components]
        self.modules = [module for _, module in components]
        self.cuda = device is not None and device.type == "cuda"
        self._handles: list[Any] = []
        self._events: list[list[Any]] = []  # [index, start, end, parent position]
        self._stack: list[int] = []
        self._ranges: dict[int, Any] = {}
        self.label_ranges = False

    def _marker(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _pre(self, index: int) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            position = len(self._events)
            parent = self._stack[-1] if self._stack else -1
            if self.label_ranges:
                record = torch.profiler.record_function(f"vlforge::{self.names[index]}")
                record.__enter__()
                self._ranges[position] = record
            self._events.append([index, self._marker(), None, parent])
            self._stack.append(position)

        return hook

    def _post(self, index: int) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not self._stack or self._events[self._stack[-1]][0] != index:
                return  # a forward that raised inside a child: its record is dropped
            position = self._stack.pop()
            self._events[position][2] = self._marker()
            record = self._ranges.pop(position, None)
            if record is not None:
                record.__exit__(None, None, None)

        return hook

    @contextlib.contextmanager
    def attached(self) -> Iterator[ComponentTimer]:
        """Register the hooks for the duration of the block."""
        try:
            for index, module in enumerate(self.modules):
                self._handles.append(module.register_forward_pre_hook(self._pre(index)))
                self._handles.append(module.register_forward_hook(self._post(index), always_call=True))
            yield self
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()

    def current(self) -> str | None:
        """Name of the innermost component running now."""
        return self.names[self._events[self._stack[-1]][0]] if self._stack else None

    @contextlib.contextmanager
    def counting_flops(self) -> Iterator[dict[str, int]]:
        """Count the FLOPs of every aten op run in the block, charged to the innermost component."""
        counts = dict.fromkeys(self.names, 0)
        with _FlopMode(self, counts):
            yield counts

    def detach_calls(self) -> dict[str, CallTimes]:
        """Times of the forward(s) since the last call, per component; clears the record."""
        if self.cuda:
            torch.cuda.synchronize()
        events, self._events, self._stack = self._events, [], []
        elapsed = [0.0] * len(events)
        for position, (_, start, end, _) in enumerate(events):
            if end is None:
                continue
            elapsed[position] = start.elapsed_time(end) if self.cuda else (end - start) * 1e3
        children = [0.0] * len(events)
        for position, (_, _, end, parent) in enumerate(events):
            if parent >= 0 and end is not None:
                children[parent] += elapsed[position]
        times = {name: CallTimes() for name in self.names}
        for position, (index, _, end, _) in enumerate(events):
            if end is None:
                continue
            entry = times[self.names[index]]
            entry.calls += 1
            entry.inclusive_ms += elapsed[position]
            entry.exclusive_ms += elapsed[position] - children[position]
        return times
