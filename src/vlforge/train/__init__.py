"""vlforge's training engine. This package holds its configuration layer: schema, LMMS Engine layouts,
overrides and validation (``vlforge validate CONFIG``).

Example:
    >>> from vlforge.train import TrainConfig, load_config
    >>> TrainConfig.model_fields["sp_ulysses_degree"].default
    1
"""

from vlforge.train.config import ResolvedConfig, load_config, resolve_config
from vlforge.train.problems import ConfigValidationError, Problem
from vlforge.train.schema import TrainConfig

__all__ = ["ConfigValidationError", "Problem", "ResolvedConfig", "TrainConfig", "load_config", "resolve_config"]
