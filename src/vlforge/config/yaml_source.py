"""Read a YAML config with the line of every key, rejecting syntax errors and duplicate keys loudly.

Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "c.yaml"
    >>> _ = path.write_text("training:\\n  learning_rate: 1.0e-4\\n")
    >>> source = read_yaml(path)
    >>> source.data, source.line_of(("training", "learning_rate"))
    ({'training': {'learning_rate': 0.0001}}, 2)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vlforge.config.problems import ConfigValidationError, PathT, Problem, render_path


@dataclass
class YamlSource:
    """Parsed YAML plus the 1-based line of every mapping key and sequence item."""

    origin: str
    data: Any
    lines: dict[PathT, int] = field(default_factory=dict)

    def line_of(self, path: PathT) -> int | None:
        """Line of ``path``, or of its nearest ancestor present in the file."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


def read_yaml(path: str | Path) -> YamlSource:
    """Parse ``path``; raise :class:`ConfigValidationError` for a missing file, bad syntax or duplicate keys."""
    origin = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigValidationError([Problem(origin, None, "", "config file not found")]) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigValidationError([Problem(origin, None, "", f"cannot read config file: {error}")]) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigValidationError([_syntax_problem(origin, error)]) from None
    source = YamlSource(origin, data)
    problems: list[Problem] = []
    if node is not None:
        _index(node, (), source.lines, origin, problems)
    if problems:
        raise ConfigValidationError(problems)
    return source


def _syntax_problem(origin: str, error: yaml.YAMLError) -> Problem:
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    reason = getattr(error, "problem", None) or str(error).splitlines()[0]
    line = mark.line + 1 if mark is not None else None
    column = f" (column {mark.column + 1})" if mark is not None else ""
    return Problem(origin, line, "", f"YAML syntax error: {reason}{column}")


def _index(node: yaml.Node, path: PathT, lines: dict[PathT, int], origin: str, problems: list[Problem]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node)
            if key == "<<":
                continue  # merge keys: their content is indexed where it is defined
            child = (*path, key)
            if key in seen:
                problems.append(Problem(origin, key_node.start_mark.line + 1, render_path(child), "duplicate key"))
            seen.add(key)
            lines[child] = key_node.start_mark.line + 1
            _index(value_node, child, lines, origin, problems)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = (*path, index)
            lines[child] = item.start_mark.line + 1
            _index(item, child, lines, origin, problems)
