"""vlforge's training engine: typed config (schema, LMMS Engine layouts, overrides, ``vlforge validate``)
and the FSDP2 trainer (``vlforge.train.trainer.run``, ``vlforge train``, ``torchrun -m vlforge.train``).

Example:
    >>> from vlforge.train import TrainConfig, load_config
    >>> TrainConfig.model_fields["sp_ulysses_degree"].default
    1
"""

from vlforge.train.config import ResolvedConfig, load_config, resolve_config
from vlforge.train.problems import ConfigValidationError, Problem
from vlforge.train.schema import TrainConfig

__all__ = ["ConfigValidationError", "Problem", "ResolvedConfig", "TrainConfig", "load_config", "resolve_config"]
