"""Command-line flags declared once: on the command's options model.

Every field of an options model (a :class:`~vlforge.strict.StrictModel`) is a flag. Its name (``--field-name``),
type, default and help (the docstring under the field) come from the field alone; a marker in ``Annotated``
changes only how it is spelled on the command line:

- ``Flag("--model", "-m")``: other names; ``Flag("--per-block/--summary")`` or ``Flag(negatable=True)``
  (``--bench/--no-bench``) for a boolean with an off switch.
- ``Flag(split=int)``: one text of comma-separated items (``--batch-sizes 1,4,8``) parsed into ``list[int]``;
  with ``repeat=True`` the flag may also be given several times (``--tags a,b --tags c``).
- ``Arg()``: a positional argument; ``NO_FLAG``: set by code, never on the command line.

:func:`parameters` gives the typer parameters of a model and :func:`build` the model from their values (a bad
value is one line naming the flag). ``tests/test_cli_flags.py`` checks every command's flags against its model.

Example:
    >>> from typing import Annotated
    >>> class Options(StrictModel):
    ...     batch_sizes: Annotated[list[int], Flag(split=int)] = [1]
    ...     '''Comma-separated batch sizes.'''
    >>> build(Options, {"batch_sizes": "1,4"}).batch_sizes, flag_of(Options, "batch_sizes")
    ([1, 4], '--batch-sizes')
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from vlforge.errors import ConfigError
from vlforge.options import parse_list
from vlforge.strict import StrictModel, first_problem

JSON_HELP = "Print only the JSON report on stdout (the verdict still sets the exit code)."
"""The help of ``--json``, the one flag every reporting command adds beside its options model."""


@dataclass(frozen=True, init=False)
class Flag:
    """How a field is spelled on the command line (see the module docstring)."""

    names: tuple[str, ...] = ()
    negatable: bool = False
    split: type | None = None
    repeat: bool = False
    on_cli: bool = True

    def __init__(self, *names: str, negatable: bool = False, split: type | None = None, repeat: bool = False,
                 on_cli: bool = True) -> None:
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "negatable", negatable)
        object.__setattr__(self, "split", split)
        object.__setattr__(self, "repeat", repeat)
        object.__setattr__(self, "on_cli", on_cli)


@dataclass(frozen=True)
class Arg:
    """A positional argument."""


NO_FLAG = Flag(on_cli=False)
"""Marks a field that code sets and the command line does not (a tolerance, a derived value)."""


def marker(info: FieldInfo) -> Flag | Arg:
    """The field's marker (a plain ``Flag()`` when it has none)."""
    found = [m for m in info.metadata if isinstance(m, (Flag, Arg))]
    return found[0] if found else Flag()


def cli_fields(model: type[StrictModel]) -> dict[str, FieldInfo]:
    """The fields of ``model`` that are on the command line, in declaration order."""
    return {name: info for name, info in model.model_fields.items()
            if not (isinstance(marker(info), Flag) and not marker(info).on_cli)}


def flag_of(model: type[StrictModel], field: str) -> str:
    """The flag (``--batch-sizes``) or argument (``CONFIG``) that sets ``field``."""
    mark = marker(model.model_fields[field])
    if isinstance(mark, Arg):
        return field.upper()
    if mark.names:
        return mark.names[0].split("/")[0]
    return "--" + field.replace("_", "-")


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (it, False)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return args[0], True
    return annotation, False


def _cli_type(annotation: Any) -> Any:
    """The type typer parses: literals and constrained types as their base, lists of them as lists."""
    annotation, _ = _strip_optional(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return type(typing.get_args(annotation)[0])
    if origin is list:
        return list[_cli_type(typing.get_args(annotation)[0])]
    if annotation in (str, int, float, bool, Path):
        return annotation
    raise TypeError(f"no command-line type for {annotation!r}")


def _default(info: FieldInfo) -> Any:
    """The field's default (a factory's value), or ``...`` when it is required."""
    if info.default_factory is not None:
        return info.default_factory()
    return ... if info.default is PydanticUndefined else info.default


def _split_text(value: Any) -> str | None:
    return ",".join(str(v) for v in value) if value else None


def parameter(name: str, info: FieldInfo) -> inspect.Parameter:
    """The typer parameter of one field (name, type, default and help from the field)."""
    import typer

    mark, default, kind = marker(info), _default(info), _cli_type(info.annotation)
    is_list = typing.get_origin(kind) is list
    required = default is ...
    if isinstance(mark, Arg):
        decl: Any = typer.Argument(help=info.description, show_default=not required and default is not None)
        annotation = kind if required else kind | None
        cli_default = default if not is_list else (default or None)
    else:
        names = mark.names or ((f"--{name.replace('_', '-')}/--no-{name.replace('_', '-')}",) if mark.negatable
                               else (f"--{name.replace('_', '-')}",))
        show: Any = True
        if mark.split is not None:
            annotation = (list[str] if mark.repeat else str) | None
            cli_default = _split_text(default) if not required else ...
        elif is_list:
            annotation, cli_default = kind | None, (default or None) if not required else ...
            show = _split_text(default) or False
        else:
            annotation, cli_default = (kind if default is not None or required else kind | None), default
        decl = typer.Option(*names, help=info.description, show_default=show)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[annotation, decl],
                             default=inspect.Parameter.empty if cli_default is ... else cli_default)


def parameters(model: type[StrictModel]) -> list[inspect.Parameter]:
    """The typer parameters of every command-line field of ``model`` (arguments first, in declaration order)."""
    params = [parameter(name, info) for name, info in cli_fields(model).items()]
    return sorted(params, key=lambda p: not isinstance(marker(model.model_fields[p.name]), Arg))


def json_parameter() -> inspect.Parameter:
    """``--json``: only JSON on stdout."""
    import typer

    decl = typer.Option("--json", help=JSON_HELP)
    return inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[bool, decl],
                             default=False)


def build(model: type[StrictModel], values: dict[str, Any]) -> Any:
    """``model`` from the command line's ``values`` (split lists parsed, unset lists left to their default); a
    validation error is one :class:`~vlforge.errors.ConfigError` line naming the flag."""
    fields = model.model_fields
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        mark = marker(fields[name])
        if isinstance(mark, Flag) and mark.split is not None:
            if value is None:
                continue
            value = parse_list(value, cast=mark.split, flag=flag_of(model, name))
        elif value is None and typing.get_origin(_cli_type(fields[name].annotation)) is list:
            continue
        kwargs[name] = value
    try:
        return model(**kwargs)
    except ValidationError as error:
        found, message, _ = first_problem(error)
        loc = [str(part) for part in found]
        where = flag_of(model, loc[0]) if loc and loc[0] in fields else ".".join(loc) or model.__name__
        raise ConfigError(f"{where}: {message}") from None


_WORDS = {"true": True, "false": False, "null": None}


def key_values(values: list[str] | None, option: str, *, numbers: bool = False) -> dict[str, Any]:
    """``KEY=VALUE`` items of a repeatable flag; values parsed as JSON where they are (``enable_thinking=false``),
    and true / false / null in any case as the boolean or None (Python's ``False`` too, as Hydra reads them).

    Example:
        >>> key_values(["enable_thinking=false", "name=x"], "--template-var")
        {'enable_thinking': False, 'name': 'x'}
    """
    out: dict[str, Any] = {}
    for item in values or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{option} {item!r}: expected KEY=VALUE")
        word = raw.strip().lower()
        try:
            value = _WORDS[word] if word in _WORDS else json.loads(raw)
        except ValueError:
            value = raw
        if numbers and not isinstance(value, int | float):
            raise ConfigError(f"{option} {item!r}: the value must be a number")
        out[key.strip()] = value
    return out

