"""The training config below the jobs: read, translate, override, validate and check before work.

Native vlforge YAML and LMMS Engine's two layouts become one validated :class:`TrainConfig`; problems are
one line each naming the file, line and key. ``train``, ``plan`` and ``extract`` import it.

Example:
    >>> from vlforge.config import TrainConfig, load_config
    >>> TrainConfig.model_fields["sp_ulysses_degree"].default
    1
"""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy).
_EXPORTS = {
    "ResolvedConfig": "vlforge.config.load",
    "load_config": "vlforge.config.load",
    "resolve_config": "vlforge.config.load",
    "ConfigValidationError": "vlforge.config.problems",
    "Problem": "vlforge.config.problems",
    "TrainConfig": "vlforge.config.schema",
}
lazy_exports(__name__, _EXPORTS)

__all__ = [
    "ConfigValidationError",
    "Problem",
    "ResolvedConfig",
    "TrainConfig",
    "load_config",
    "resolve_config",
]
