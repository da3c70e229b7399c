"""Config problems: one line each, naming the file (and line), the dotted key path and what is wrong.

Example:
    >>> from vlforge.config.problems import Problem, render_path
    >>> str(Problem("run.yaml", 7, "training.lerning_rate", "unknown key; did you mean 'learning_rate'?"))
    "run.yaml:7: training.lerning_rate: unknown key; did you mean 'learning_rate'?"
    >>> render_path((0, "config", "learning_rate"))
    '[0].config.learning_rate'
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vlforge.errors import ConfigError, close_matches

PathT = tuple[str | int, ...]


def render_path(path: Sequence[str | int]) -> str:
    """``("data", "datasets", 0, "path")`` -> ``data.datasets[0].path``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where (origin file or override, line, key path) and what."""

    origin: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.origin}:{self.line}" if self.line else self.origin
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ConfigValidationError(ConfigError):
    """A config (file or overrides) is invalid; ``problems`` holds one :class:`Problem` per line."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = list(problems)
        assert self.problems, "ConfigValidationError needs at least one problem"
        super().__init__("\n".join(str(problem) for problem in self.problems))


def suggest(key: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to a misspelled ``key``, or None when nothing is close."""
    matches = close_matches(key, candidates)
    return matches[0] if matches else None
