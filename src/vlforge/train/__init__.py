"""vlforge's training engine: the FSDP2 trainer (``vlforge train``, ``torchrun -m vlforge.train``).

Its config (schema, LMMS Engine layouts, overrides, checks) is :mod:`vlforge.config`.

Example:
    >>> from vlforge.train import run
    >>> run.__name__
    'run'
"""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy): importing one light
# submodule of this package never loads the heavy ones.
_EXPORTS = {
    "RunResult": "vlforge.train.trainer",
    "Trainer": "vlforge.train.trainer",
    "run": "vlforge.train.trainer",
}
lazy_exports(__name__, _EXPORTS)

__all__ = ["RunResult", "Trainer", "run"]
