"""The memory estimate's one-line start-up verdict, the memory free here, and byte counts as text.

Example:
    >>> human(3 * 2**30), human(512)
    ('3.0 GiB', '512 B')
"""

from __future__ import annotations

from typing import Any


def human(size: float) -> str:
    """``12.3 GiB``-style text of a byte count."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


def free_bytes(device: Any, local_processes: int = 1) -> int | None:
    """Memory free for one process on ``device``: CUDA's free memory, or the host's available memory shared by
    the ``local_processes`` of this node."""
    from vlforge.models.load import available_bytes

    free = available_bytes(device)
    return free if device.type == "cuda" else free // max(local_processes, 1)


RESHARD_MARGIN = 0.85
"""Share of the free memory the plan with no layer resharded may use for ``fsdp.reshard_after_forward`` (auto) to keep
every layer gathered."""


def startup_verdict(cfg: Any, *, world: int, device: Any, local_processes: int = 1,
                    facts: dict[str, Any] | None = None) -> tuple[str, bool]:
    """``(one line, over)``: the estimated peak per rank against the memory free here (``over`` when above it).

    ``facts`` (a dict) also receives ``keep_gathered``: whether the peak with no FSDP2 unit resharded after the
    forward fits :data:`RESHARD_MARGIN` of the free memory."""
    from vlforge.memory.estimate import estimate_memory
    from vlforge.models.load import load_model_config

    estimate = estimate_memory(cfg, load_model_config(cfg.model.load_from_pretrained_path), world=world,
                               device=device)
    free = free_bytes(device, local_processes)
    top = sorted(((v, k) for k, v in estimate.parts.items() if v), reverse=True)[:3]
    parts = ", ".join(f"{k.replace('_', ' ')} {human(v)}" for v, k in top)
    where = f"{human(free)} free on {device.type}" if free is not None else "free memory unknown"
    over = free is not None and estimate.peak_bytes > free
    if facts is not None:
        facts["keep_gathered"] = free is not None and estimate.peak_bytes + estimate.gathered_extra <= free * RESHARD_MARGIN
    line = f"plan: about {human(estimate.peak_bytes)} peak per rank ({parts}); {where}"
    if over:
        line += "; the run may run out of memory: `vlforge plan CONFIG` lists changes that lower the peak"
    return line, over
