"""vlforge's training engine: typed config (schema, LMMS Engine layouts, overrides, ``vlforge validate``)
and the FSDP2 trainer (``vlforge.train.trainer.run``, ``vlforge train``, ``torchrun -m vlforge.train``).

Example:
    >>> from vlforge.train import TrainConfig, load_config
    >>> TrainConfig.model_fields["sp_ulysses_degree"].default
    1
"""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy): importing one light
# submodule of this package never loads the heavy ones.
_EXPORTS = {
    "ResolvedConfig": "vlforge.train.config",
    "load_config": "vlforge.train.config",
    "resolve_config": "vlforge.train.config",
    "ConfigValidationError": "vlforge.train.problems",
    "Problem": "vlforge.train.problems",
    "TrainConfig": "vlforge.train.schema",
}
lazy_exports(__name__, _EXPORTS)

__all__ = ["ConfigValidationError", "Problem", "ResolvedConfig", "TrainConfig", "load_config", "resolve_config"]
