"""Peak memory per rank of a training config, from the configs alone (meta tensors, no weights).

``vlforge plan`` turns it into a verdict and suggestions; the trainer logs its one-line start-up verdict.
"""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy).
_EXPORTS = {
    "MemoryEstimate": "vlforge.memory.estimate",
    "estimate_memory": "vlforge.memory.estimate",
}
lazy_exports(__name__, _EXPORTS)

__all__ = [
    "MemoryEstimate",
    "estimate_memory",
]
