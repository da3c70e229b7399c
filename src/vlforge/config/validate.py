"""The ``vlforge validate`` job: check a training config and describe the result for people or machines.

Example:
    >>> from vlforge.config.validate import check
    >>> report = check("/nonexistent.yaml", [])
    >>> report.ok, report.error_lines()
    (False, ['/nonexistent.yaml: config file not found'])
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field

from vlforge.command import Cli, Job
from vlforge.config.data_check import CHECK_RECORDS, RecordCheck
from vlforge.config.load import ResolvedConfig, dump_problems, resolve_config
from vlforge.config.problems import ConfigValidationError, Problem
from vlforge.errors import ExitCode
from vlforge.flags import Arg
from vlforge.strict import StrictModel

SHOWN_CLEAN = 10
"""Data files without a failing record that ``vlforge validate`` names one by one (the rest: one line)."""


@dataclass
class ValidateReport:
    """Outcome of validating one config: the resolved config and warnings, or the problems."""

    file: str
    resolved: ResolvedConfig | None = None
    problems: list[Problem] = field(default_factory=list)
    datasets: list[RecordCheck] = field(default_factory=list)
    """The first records of each data file as read (``records``: their layout, how many, which fail)."""

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
        head += self.data_lines()
        head += [f"# warning: {warning}" for warning in self.resolved.warnings]
        return "\n".join(head) + "\n" + self.resolved.config.to_yaml()

    def data_lines(self) -> list[str]:
        """``# data: PATH: LAYOUT; N of M records read, F fail`` per data file, and its first failing records; past
        :data:`SHOWN_CLEAN` files without a failure (a directory of shards), one line counts the rest (``--json``
        lists every file)."""
        lines, clean, hidden = [], 0, []
        for check in self.datasets:
            if check.layout is not None and not check.failed:
                clean += 1
                if clean > SHOWN_CLEAN:
                    hidden.append(check)
                    continue
            lines.append(f"# data: {check.line()}")
            lines += [f"#   {example}" for example in check.examples]
        if hidden:
            lines.append(f"# data: {len(hidden)} more data file(s), none fails ({sum(c.read for c in hidden)} of "
                         f"{sum(c.records for c in hidden)} records read; --json lists each)")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``ok``, ``file``, ``datasets``, and ``layout``/``warnings``/``config`` or ``errors``; the
        warnings are the config's and those the data pipeline gave reading each file (also in its ``datasets`` item)."""
        datasets = [check.to_dict() for check in self.datasets]
        if self.resolved is None:
            return {"ok": False, "file": self.file, "errors": dump_problems(self.problems), "datasets": datasets}
        return {
            "ok": True,
            "file": self.file,
            "layout": self.resolved.layout,
            "warnings": [*self.resolved.warnings, *(warning for check in self.datasets for warning in check.warnings)],
            "datasets": datasets,
            "config": self.resolved.config.model_dump(mode="json"),
        }


def check(path: str | Path, overrides: Iterable[str] = (), *, model: bool = True, records: int = 0) -> ValidateReport:
    """Validate ``path`` with ``overrides``; never raises for a bad config (the report holds the problems).

    Settings ``vlforge train`` refuses on this machine (``model.lora`` without peft, ``training.fp16``)
    are problems here too, with train's message, so validate and train agree; so is a model reference train
    cannot resolve (an unknown ``tiny:``/``real:`` preset, a missing local checkpoint), and every data file,
    dataset YAML or media folder that does not exist (relative to the working directory), and every data file
    whose start holds no chat record. With ``records`` the first that many records of each data file are read as
    training reads them (``datasets`` of the report); failing ones are problems as training would meet them.
    """
    try:
        resolved = resolve_config(path, overrides)
    except ConfigValidationError as error:
        return ValidateReport(str(path), problems=error.problems)
    from vlforge.config.preflight import check_model, check_supported
    from vlforge.errors import ConfigError, ModelLoadError

    try:
        check_supported(resolved.config)
    except ConfigError as error:
        return ValidateReport(str(path), problems=[Problem(resolved.origin, None, "", str(error))])
    try:  # as train does before loading (train and plan check it themselves, after the output paths: model=False)
        if model:
            check_model(resolved.config)
    except (ConfigError, ModelLoadError) as error:
        return ValidateReport(str(path), problems=[Problem(resolved.origin, None, "model.load_from_pretrained_path",
                                                           str(error))])
    from vlforge.config.data_check import data_file_problems, record_checks

    problems = data_file_problems(resolved.config, resolved.origin)
    datasets: list[RecordCheck] = []
    if records and not problems:
        datasets, problems = record_checks(resolved.config, resolved.origin, limit=records)
    if problems:
        return ValidateReport(str(path), problems=problems, datasets=datasets)
    return ValidateReport(str(path), resolved=resolved, datasets=datasets)


class ConfigFlags(StrictModel):
    """A training config and its ``key=value`` overrides: the arguments of validate, train and plan."""

    unknown_label: ClassVar[str] = "option"
    config: Annotated[Path, Arg()]
    """Training config YAML: native, LMMS Engine or guide layout."""
    overrides: Annotated[list[str], Arg()] = Field(default_factory=list)
    """key=value overrides, e.g. training.max_steps=10 or packing.packing_length=8192."""


def validated(config: Path, overrides: Iterable[str]) -> ResolvedConfig:
    """``config`` read and validated once (``vlforge validate``'s checks but the model's, which each job makes
    after its output paths); every problem is a line of the :class:`~vlforge.errors.ConfigError` raised."""
    from vlforge.errors import ConfigError

    report = check(config, overrides, model=False)
    if not report.ok:
        raise ConfigError("\n".join(report.error_lines()))
    return report.resolved


def _render(run: ConfigFlags, report: ValidateReport, console: Any) -> None:
    """The resolved YAML on stdout (written as it is: no markup), or one ``error:`` line per problem on stderr
    (after what was read of each data file)."""
    if report.ok:
        console.file.write(report.to_yaml_text())
        console.file.flush()
        return
    for line in report.data_lines():
        sys.stderr.write(f"{line.removeprefix('# ')}\n")
    for line in report.error_lines():
        sys.stderr.write(f"error: {line}\n")


JOB: Job[ConfigFlags, ValidateReport] = Job(
    check=lambda run: None, run=lambda run: check(run.config, tuple(run.overrides), records=CHECK_RECORDS),
    render=_render,
    to_json=lambda report: json.dumps(report.to_dict(), indent=2),
    exit_code=lambda report: ExitCode.OK if report.ok else ExitCode.BAD_INPUT,
)
CLI = Cli(flags=ConfigFlags, job=JOB)
