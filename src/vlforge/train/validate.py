"""The ``vlforge validate`` job: check a training config and describe the result for people or machines.

Example:
    >>> from vlforge.train.validate import check
    >>> report = check("/nonexistent.yaml", [])
    >>> report.ok, report.error_lines()
    (False, ['/nonexistent.yaml: config file not found'])
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlforge.train.config import ResolvedConfig, dump_problems, resolve_config
from vlforge.train.problems import ConfigValidationError, Problem


@dataclass
class ValidateReport:
    """Outcome of validating one config: the resolved config and warnings, or the problems."""

    file: str
    resolved: ResolvedConfig | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.resolved is not None

    def error_lines(self) -> list[str]:
        """One line per problem: ``file[:line]: key.path: message``."""
        return [str(problem) for problem in self.problems]

    def to_yaml_text(self) -> str:
        """The resolved native config as YAML, preceded by comments with the layout and every warning."""
        assert self.resolved is not None
        head = [f"# {self.file}: valid ({self.resolved.layout} layout); resolved vlforge config:"]
        head += [f"# warning: {warning}" for warning in self.resolved.warnings]
        return "\n".join(head) + "\n" + self.resolved.config.to_yaml()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``ok``, ``file``, and ``layout``/``warnings``/``config`` or ``errors``."""
        if self.resolved is None:
            return {"ok": False, "file": self.file, "errors": dump_problems(self.problems)}
        return {
            "ok": True,
            "file": self.file,
            "layout": self.resolved.layout,
            "warnings": list(self.resolved.warnings),
            "config": self.resolved.config.model_dump(mode="json"),
        }


def check(path: str | Path, overrides: Iterable[str] = ()) -> ValidateReport:
    """Validate ``path`` with ``overrides``; never raises for a bad config (the report holds the problems).

    Settings ``vlforge train`` refuses on this machine (``model.lora`` without peft, ``training.fp16``)
    are problems here too, with train's message, so validate and train agree; so is every data file,
    dataset YAML or media folder that does not exist (relative to the working directory).
    """
    try:
        resolved = resolve_config(path, overrides)
    except ConfigValidationError as error:
        return ValidateReport(str(path), problems=error.problems)
    from vlforge.errors import ConfigError
    from vlforge.train.preflight import check_supported

    try:
        check_supported(resolved.config)
    except ConfigError as error:
        return ValidateReport(str(path), problems=[Problem(resolved.origin, None, "", str(error))])
    from vlforge.train.data_check import data_file_problems

    problems = data_file_problems(resolved.config, resolved.origin)
    if problems:
        return ValidateReport(str(path), problems=problems)
    return ValidateReport(str(path), resolved=resolved)
