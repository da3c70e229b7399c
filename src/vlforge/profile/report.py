"""The profile report: per-component statistics, totals, anomalies and stock/patched ratios.

Shares: every component row is *exclusive* time (its own code, without hooked children), so the
``share_pct`` of the component rows sums to 100% of the model forward. Rows in ``totals``
(``vision.blocks``, ``vision`` = the whole tower, ``text.layers``, ``text`` = the whole
language model) are sums of component rows, shown for
reading; they are not part of the 100%. Processor and host-to-device times are separate phases,
outside the forward.

Anomaly: a component whose share of time is at least ``anomaly_min_share`` percent and more than
``anomaly_ratio`` times its share of FLOPs (a component with no FLOPs and a large share counts).
``anomalies`` lists them by excess share (time share minus FLOP share), worst first.

Example:
    >>> from vlforge.profile.report import summarise
    >>> import json
    >>> run = summarise([{"a": 9.0, "b": 1.0}], {"a": 10, "b": 990}, meta={"a": ("a", "vision", "x"),
    ...     "b": ("b", "text", "y")}, calls={"a": 1, "b": 1})
    >>> run["anomalies"], [round(c["share_pct"]) for c in run["components"]]
    (['a'], [90, 10])
"""

from __future__ import annotations

import statistics
from typing import Any

from pydantic import ConfigDict

from vlforge.strict import StrictModel

ANOMALY_RATIO = 3.0
ANOMALY_MIN_SHARE = 5.0


class _Strict(StrictModel):
    """Report fields: unknown keys are errors when a report is read back; measured values may be inf."""

    model_config = ConfigDict(allow_inf_nan=True)


class Timing(_Strict):
    """Median and spread of a time over the repeats, in milliseconds."""

    median_ms: float
    min_ms: float
    max_ms: float
    spread_pct: float
    """``(max - min) / median`` in percent."""


class ComponentStats(_Strict):
    name: str
    path: str
    """Module name inside the model (``""`` for the root)."""
    group: str
    kind: str
    calls: int
    """Calls per forward."""
    time: Timing
    """Exclusive time."""
    inclusive_ms: float
    """Median inclusive time (with hooked children)."""
    share_pct: float
    flops: int
    flop_share_pct: float
    gflops_per_s: float | None
    anomaly: bool
    time_to_flop_ratio: float | None
    """``share_pct / flop_share_pct``; ``None`` when the component has no FLOPs."""


class TotalStats(_Strict):
    name: str
    members: int
    time: Timing
    share_pct: float
    flops: int
    flop_share_pct: float
    gflops_per_s: float | None


class RunProfile(_Strict):
    """One configuration: variant x attention implementation x batch size."""

    variant: str
    attn: str
    batch_size: int
    processor: Timing
    host_to_device: Timing
    forward: Timing
    """The whole model forward (sum of the exclusive component times)."""
    components: list[ComponentStats]
    totals: list[TotalStats]
    anomalies: list[str]
    trace: str | None = None


class CompareRow(_Strict):
    name: str
    baseline_ms: float
    candidate_ms: float
    ratio: float | None
    """``baseline / candidate``: above 1 means the candidate is faster."""


class Comparison(_Strict):
    attn: str
    batch_size: int
    baseline: str
    candidate: str
    forward_ratio: float | None
    rows: list[CompareRow]


class ProfileReport(_Strict):
    model: str
    family: str
    device: str
    dtype: str
    input: str
    pixel_values_shape: list[int]
    """Of batch size 1."""
    sequence_length: int
    warmup: int
    repeats: int
    threads: int
    torch_version: str
    transformers_version: str
    anomaly_ratio: float
    anomaly_min_share: float
    skipped_attn: dict[str, str]
    runs: list[RunProfile]
    comparisons: list[Comparison]

    def run(self, variant: str, attn: str | None = None, batch_size: int | None = None) -> RunProfile:
        """The first run matching the arguments."""
        for run in self.runs:
            if run.variant == variant and attn in (None, run.attn) and batch_size in (None, run.batch_size):
                return run
        raise KeyError(f"no run {variant}/{attn}/{batch_size}")


def timing(values: list[float]) -> dict[str, float]:
    """Median, min, max and spread of ``values`` (milliseconds)."""
    median = statistics.median(values)
    low, high = min(values), max(values)
    return {"median_ms": median, "min_ms": low, "max_ms": high,
            "spread_pct": 100.0 * (high - low) / median if median > 0 else 0.0}


def _rate(flops: int, ms: float) -> float | None:
    return flops / (ms / 1e3) / 1e9 if flops and ms > 0 else None


def total_groups(names: list[str]) -> dict[str, list[str]]:
    """Aggregate rows: blocks, layers and whole towers."""
    groups = {
        "vision.blocks": [n for n in names if n.startswith("vision.block.")],
        "vision": [n for n in names if n.startswith("vision.")],
        "text.layers": [n for n in names if n.startswith("text.layer.")],
        "text": [n for n in names if n.startswith("text.")],
    }
    return {name: members for name, members in groups.items() if members}


def summarise(
    repeats: list[dict[str, float]],
    flops: dict[str, int],
    *,
    meta: dict[str, tuple[str, str, str]],
    calls: dict[str, int],
    inclusive: list[dict[str, float]] | None = None,
    ratio: float = ANOMALY_RATIO,
    min_share: float = ANOMALY_MIN_SHARE,
) -> dict[str, Any]:
    """Component rows, totals and anomalies from per-repeat exclusive times (``name -> ms``).

    ``meta`` maps a name to ``(path, group, kind)``.
    """
    names = list(meta)
    medians = {n: statistics.median(r[n] for r in repeats) for n in names}
    total_time = sum(medians.values()) or 1.0
    total_flops = sum(flops.values()) or 1
    components = []
    anomalies: list[tuple[float, str]] = []
    for name in names:
        path, group, kind = meta[name]
        share = 100.0 * medians[name] / total_time
        flop_share = 100.0 * flops[name] / total_flops
        relative = share / flop_share if flop_share > 0 else None
        flagged = share >= min_share and (relative is None or relative > ratio)
        if flagged:
            anomalies.append((share - flop_share, name))
        inclusive_ms = statistics.median(r[name] for r in inclusive) if inclusive else medians[name]
        components.append({
            "name": name, "path": path, "group": group, "kind": kind, "calls": calls.get(name, 0),
            "time": timing([r[name] for r in repeats]), "inclusive_ms": inclusive_ms, "share_pct": share,
            "flops": flops[name], "flop_share_pct": flop_share, "gflops_per_s": _rate(flops[name], medians[name]),
            "anomaly": flagged, "time_to_flop_ratio": relative,
        })
    totals = []
    for name, members in total_groups(names).items():
        per_repeat = [sum(r[m] for m in members) for r in repeats]
        group_time = timing(per_repeat)
        group_flops = sum(flops[m] for m in members)
        totals.append({
            "name": name, "members": len(members), "time": group_time,
            "share_pct": 100.0 * sum(medians[m] for m in members) / total_time,
            "flops": group_flops, "flop_share_pct": 100.0 * group_flops / total_flops,
            "gflops_per_s": _rate(group_flops, group_time["median_ms"]),
        })
    anomalies.sort(reverse=True)
    return {"components": components, "totals": totals, "anomalies": [name for _, name in anomalies]}


def compare(baseline: RunProfile, candidate: RunProfile) -> Comparison:
    """Per-component ``baseline / candidate`` median exclusive time, totals included.

    A row with no time on either side (a component the other variant never runs) has no ratio.
    """
    rows = []
    cand = {c.name: c.time.median_ms for c in candidate.components}
    cand.update({t.name: t.time.median_ms for t in candidate.totals})
    base = [(c.name, c.time.median_ms) for c in baseline.components]
    base += [(t.name, t.time.median_ms) for t in baseline.totals]
    for name, base_ms in base:
        cand_ms = cand.get(name)
        if cand_ms is None:
            continue
        rows.append(CompareRow(name=name, baseline_ms=base_ms, candidate_ms=cand_ms,
                               ratio=base_ms / cand_ms if base_ms > 0 and cand_ms > 0 else None))
    forward = candidate.forward.median_ms
    return Comparison(attn=baseline.attn, batch_size=baseline.batch_size, baseline=baseline.variant,
                      candidate=candidate.variant, rows=rows,
                      forward_ratio=baseline.forward.median_ms / forward if forward > 0 else None)
