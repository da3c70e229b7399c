"""The one pydantic base of every options and config model, and its errors as one line.

Unknown keys are errors (``extra="forbid"``), fields are documented by the docstring under them, and NaN or
infinity are refused. :func:`error_line` renders a validation error as the one line users see, an unknown key
with its closest match.

Example:
    >>> from pydantic import ValidationError
    >>> from vlforge.strict import StrictModel, error_line
    >>> class Options(StrictModel):
    ...     batch_size: int = 1
    >>> try:
    ...     Options(batch_sise=2)
    ... except ValidationError as error:
    ...     print(error_line(error, Options))
    batch_sise: unknown key; did you mean 'batch_size'?
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

from vlforge.errors import ConfigError, did_you_mean


class StrictModel(BaseModel):
    """``extra="forbid"``, attribute docstrings as field descriptions, no NaN or infinity."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)
    unknown_label: ClassVar[str] = "key"
    """Word used for an unknown name: ``unknown key 'x'`` (configs) or ``unknown option 'x'`` (commands)."""


def model_in_annotation(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel class inside ``annotation`` (through ``X | None`` and ``list[X]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = model_in_annotation(arg)
        if found is not None:
            return found
    return None


def model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that holds the field at ``loc`` (list indices skipped), or None off the schema."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        info = current.model_fields.get(str(part))
        current = model_in_annotation(info.annotation) if info is not None else None
    return current


def first_problem(error: ValidationError) -> tuple[tuple[Any, ...], str, dict[str, Any]]:
    """``(location, message, details)`` of the first problem of ``error``: a check of several keys
    (:func:`field_error`) located at the key at fault, the message without pydantic's ``Value error,`` prefix."""
    first = error.errors(include_url=False)[0]
    loc = tuple(first["loc"])
    if first["type"] == "vlforge_field":
        loc = (*loc, *first["ctx"]["field"].split("."))
    return loc, first["msg"].removeprefix("Value error, "), first


def error_line(error: ValidationError, model: type[BaseModel]) -> str:
    """The first problem of ``error`` (raised validating ``model``) as ``key.path: message`` (list items as ``[i]``)."""
    loc, message, first = first_problem(error)
    path = ".".join(str(part) if not isinstance(part, int) else f"[{part}]" for part in loc).replace(".[", "[")
    if first["type"] == "extra_forbidden":
        owner = model_at(model, loc[:-1])
        names = set(owner.model_fields) | {f.alias for f in owner.model_fields.values() if f.alias} if owner else set()
        label = getattr(owner, "unknown_label", "key")
        return f"{path}: unknown {label}{did_you_mean(str(loc[-1]), sorted(names))}"
    return f"{path}: {message}" if path else message


def field_error(field: str, message: str) -> PydanticCustomError:
    """An error about ``field`` (dotted, relative to the model raising it) with a one-line message, for a check of
    several fields: :func:`error_line` and the CLI's flags name that exact key or flag."""
    return PydanticCustomError("vlforge_field", message, {"field": field})


def build_options(cls: type[BaseModel], **values: Any) -> Any:
    """``cls(**values)`` with a pydantic validation error turned into one ConfigError line (:func:`error_line`)."""
    try:
        return cls(**values)
    except ValidationError as error:
        raise ConfigError(error_line(error, cls)) from None
