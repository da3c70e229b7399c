"""A pydantic base for every options/config model: unknown keys are errors with a "did you mean".

Example:
    >>> from vlforge.strict import StrictModel
    >>> class Options(StrictModel):
    ...     batch_size: int = 1
    >>> Options(batch_sise=2)
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for Options
      Value error, unknown key 'batch_sise'; did you mean 'batch_size'? [type=value_error, input_value={'batch_sise': 2}, input_type=dict]
    ...
"""

from __future__ import annotations

import difflib
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator


class StrictModel(BaseModel):
    """``extra="forbid"`` plus a close-match suggestion for the first unknown key."""

    model_config = ConfigDict(extra="forbid")
    unknown_label: ClassVar[str] = "key"
    """Word used in the error: ``unknown key 'x'`` (configs) or ``unknown option 'x'`` (commands)."""

    @model_validator(mode="before")
    @classmethod
    def _suggest_unknown(cls, data: Any) -> Any:
        if isinstance(data, dict):
            fields = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
            for key in data:
                if key not in fields:
                    hint = difflib.get_close_matches(str(key), sorted(fields), n=1)
                    suffix = f"; did you mean {hint[0]!r}?" if hint else ""
                    raise ValueError(f"unknown {cls.unknown_label} {key!r}{suffix}")
        return data
