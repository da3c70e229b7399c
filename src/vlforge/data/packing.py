"""Packing samples into ``packing_length`` budgets, length grouping, and the two collates.

* :class:`Binner` - online ``first_fit`` / ``best_fit`` bin packing with a bounded number of open bins;
  a sample is never split, and every sample added comes out in exactly one bin.
* :class:`LengthGrouper` - ``group_by_length`` for padded batches: sort a window of samples by length.
* :func:`collate_padded` - (B, Lmax) right-padded batch with ``attention_mask`` and (3, B, L) positions.
* :func:`collate_packed` - one packed row: ``position_ids`` (4, 1, L) whose first row restarts at 0 per
  sample (transformers reads it to build a block-diagonal causal mask) plus ``cu_seqlens``.

Example:
    >>> b = Binner(capacity=10, strategy="best_fit", max_open_bins=2)
    >>> [b.add(x, x) for x in (6, 5, 4, 3)]
    [[], [], [[6, 4]], []]
    >>> b.flush()
    [[5, 3]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import torch

from vlforge.data.processor import IGNORE_INDEX, ProcessedSample

T = TypeVar("T")
Strategy = Literal["first_fit", "best_fit"]


class Binner(Generic[T]):
    """Place items (with lengths) into bins of ``capacity``; return bins as they close.

    A new item goes to the first open bin it fits (``first_fit``) or the one it fills most
    (``best_fit``); otherwise it opens a bin. A bin closes when it is exactly full, or - when more than
    ``max_open_bins`` are open - the fullest bin closes. ``flush()`` closes all (end of stream).
    """

    def __init__(self, capacity: int, strategy: Strategy = "first_fit", max_open_bins: int = 8) -> None:
        if strategy not in ("first_fit", "best_fit"):
            raise ValueError(f"unknown packing_strategy {strategy!r}")
        self.capacity, self.strategy, self.max_open_bins = capacity, strategy, max_open_bins
        self.bins: list[list[T]] = []
        self.loads: list[int] = []

    def add(self, item: T, length: int) -> list[list[T]]:
        if length > self.capacity:
            raise ValueError(f"item of length {length} exceeds capacity {self.capacity}")
        fits = [i for i, load in enumerate(self.loads) if load + length <= self.capacity]
        if fits:
            i = fits[0] if self.strategy == "first_fit" else min(fits, key=lambda j: (self.capacity - self.loads[j], j))
            self.bins[i].append(item)
            self.loads[i] += length
        else:
            self.bins.append([item])
            self.loads.append(length)
            i = len(self.bins) - 1
        closed = []
        if self.loads[i] == self.capacity:
            closed.append(self._close(i))
        while len(self.bins) > self.max_open_bins:
            closed.append(self._close(max(range(len(self.loads)), key=lambda j: (self.loads[j], -j))))
        return closed

    def _close(self, i: int) -> list[T]:
        self.loads.pop(i)
        return self.bins.pop(i)

    def flush(self) -> list[list[T]]:
        out, self.bins, self.loads = self.bins, [], []
        return out


class LengthGrouper(Generic[T]):
    """Collect ``window`` items, sort them by length (if ``sort``), and cut them into batches of ``batch_size``."""

    def __init__(self, batch_size: int, window: int, sort: bool = True) -> None:
        self.batch_size, self.window, self.sort = batch_size, max(window, batch_size), sort
        self.items: list[tuple[T, int]] = []

    def add(self, item: T, length: int) -> list[list[T]]:
        self.items.append((item, length))
        return self._cut() if len(self.items) >= self.window else []

    def _cut(self) -> list[list[T]]:
        items = sorted(self.items, key=lambda p: p[1]) if self.sort else self.items
        ordered = [it for it, _ in items]
        self.items = []
        return [ordered[i : i + self.batch_size] for i in range(0, len(ordered), self.batch_size)]

    def flush(self) -> list[list[T]]:
        return self._cut() if self.items else []


@dataclass
class PackingStats:
    """Real tokens vs tokens the model computes (padding included) and vs the token budget
    (``packing_length`` per packed row; the padded size for padded batches)."""

    batches: int = 0
    samples: int = 0
    real_tokens: int = 0
    computed_tokens: int = 0
    budget_tokens: int = 0

    def update(self, lengths: list[int], computed: int, budget: int | None = None) -> None:
        self.batches += 1
        self.samples += len(lengths)
        self.real_tokens += sum(lengths)
        self.computed_tokens += computed
        self.budget_tokens += computed if budget is None else budget

    @property
    def efficiency(self) -> float:
        """Real tokens / tokens computed."""
        return self.real_tokens / self.computed_tokens if self.computed_tokens else 0.0

    @property
    def fill(self) -> float:
        """Real tokens / token budget (how full the packed rows are)."""
        return self.real_tokens / self.budget_tokens if self.budget_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "samples": self.samples, "real_tokens": self.real_tokens,
                "computed_tokens": self.computed_tokens, "budget_tokens": self.budget_tokens,
                "efficiency": round(self.efficiency, 6), "fill": round(self.fill, 6)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PackingStats:
        return cls(d["batches"], d["samples"], d["real_tokens"], d["computed_tokens"], d.get("budget_tokens", 0))


def _cat(samples: list[ProcessedSample], key: str) -> torch.Tensor | None:
    parts = [getattr(s, key) for s in samples if getattr(s, key) is not None]
    return torch.cat(parts) if parts else None


def _vision(samples: list[ProcessedSample]) -> dict[str, torch.Tensor]:
    out = {}
    for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        value = _cat(samples, key)
        if value is not None:
            out[key] = value
    return out


def collate_padded(samples: list[ProcessedSample], pad_token_id: int, pad_to: int | None = None) -> dict[str, Any]:
    """Right-pad to the longest sample (or ``pad_to``): ids, labels, attention_mask, (3, B, L) positions."""
    width = max(pad_to or 0, max(len(s) for s in samples))
    n = len(samples)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    position_ids = torch.zeros((3, n, width), dtype=torch.long)
    types = torch.zeros((n, width), dtype=torch.int)
    for i, s in enumerate(samples):
        length = len(s)
        input_ids[i, :length], labels[i, :length] = s.input_ids, s.labels
        attention_mask[i, :length] = 1
        position_ids[:, i, :length] = s.position_ids
        types[i, :length] = s.mm_token_type_ids
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask,
            "position_ids": position_ids, "mm_token_type_ids": types, **_vision(samples)}


def collate_packed(samples: list[ProcessedSample], pad_token_id: int, pad_to: int | None = None) -> dict[str, Any]:
    """Concatenate into one row; per-sample positions kept, ``cu_seqlens`` marks the boundaries.

    With ``pad_to`` the row is padded to that length with one extra pseudo-sample of pad tokens
    (labels ignored) so shapes stay static.
    """
    lengths = [len(s) for s in samples]
    total = sum(lengths)
    pad = max(0, (pad_to or 0) - total)
    ids = [s.input_ids for s in samples]
    labels = [s.labels for s in samples]
    text_pos = [torch.arange(n) for n in lengths]
    mrope = [s.position_ids for s in samples]
    types = [s.mm_token_type_ids for s in samples]
    if pad:
        ids.append(torch.full((pad,), pad_token_id, dtype=torch.long))
        labels.append(torch.full((pad,), IGNORE_INDEX, dtype=torch.long))
        text_pos.append(torch.arange(pad))
        mrope.append(torch.arange(pad).expand(3, -1))
        types.append(torch.zeros(pad, dtype=torch.int))
        lengths = [*lengths, pad]
    position_ids = torch.cat([torch.cat(text_pos)[None], torch.cat(mrope, dim=1)])[:, None, :]
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths), 0)
    return {"input_ids": torch.cat(ids)[None], "labels": torch.cat(labels)[None], "position_ids": position_ids,
            "mm_token_type_ids": torch.cat(types)[None], "cu_seqlens": cu, "max_seqlen": max(lengths),
            **_vision(samples)}
