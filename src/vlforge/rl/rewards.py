"""A reward function read from its file and called the way its engine calls it.

:func:`inspect_reward` reads the file with :mod:`ast` only (no code runs, no torch): the function exists, what it
takes, and the regular expressions in the file that name tags (``r"<think>.*</think>.*\\\\boxed..."``): the tags the
reward needs. :func:`load_scorer` runs the file (its imports resolve with ``--reward-path`` directories appended
to ``sys.path``) and returns a :class:`Scorer` that calls the function in its engine's signature
(:mod:`vlforge.rl.engines`).

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "r.py"
    >>> _ = path.write_text('import re\\ndef f(completions, **kw):\\n    return [float(bool(re.search(r"<think>.*</think>", c))) for c in completions]\\n')
    >>> info = inspect_reward(path, "f")
    >>> info.params, info.patterns, info.signature
    (['completions'], ['<think>.*</think>'], 'trl')
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlforge.errors import ConfigError
from vlforge.vocab.templates import TAG_RE, TemplateError, regex_literals


@dataclass
class RewardInfo:
    """What the file says about the function, read without running it."""

    file: Path
    function: str
    params: list[str]
    var_keyword: bool
    patterns: list[str]
    """String constants of the file (docstrings excluded) that hold a tag, in source order."""
    reward_type: str | None = None
    """EasyR1's module-level ``REWARD_TYPE`` (``batch`` / ``sequential``), when the file sets one."""
    spans: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(line, column, end line, end column) of each pattern in the source, for rewrites."""

    @property
    def signature(self) -> str | None:
        """The engine whose signature the parameters match (None: none does)."""
        names = set(self.params)
        if {"queries", "prompts", "labels"} <= names:
            return "openrlhf"
        if {"data_source", "solution_str", "ground_truth"} <= names:
            return "verl"
        if self.params[:1] in (["reward_inputs"], ["reward_input"]):
            return "easyr1"
        if "completions" in names or (self.var_keyword and not self.params):
            return "trl"
        return None


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                out.add(id(first.value))
    return out


def inspect_reward(file: Path, function: str) -> RewardInfo:
    """Parse ``file`` and describe ``function``; a missing file, a syntax error or a missing function is one line."""
    if not file.is_file():
        raise ConfigError(f"--reward {file}: not found")
    try:
        tree = ast.parse(file.read_text(), filename=str(file))
    except SyntaxError as error:
        raise ConfigError(f"--reward {file}:{error.lineno}: not valid Python ({error.msg})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--reward {file}: cannot read ({error})") from None
    found = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function]
    assigned = [n for n in tree.body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == function for t in n.targets)]
    if not found and not assigned:
        names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        from vlforge.errors import did_you_mean

        raise ConfigError(f"--reward {file}: no function {function!r}{did_you_mean(function, names)} "
                          f"(functions: {', '.join(names) or 'none'})")
    params: list[str] = []
    var_keyword = True
    if found:
        args = found[0].args
        params = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
        var_keyword = args.kwarg is not None
    docstrings = _docstring_nodes(tree)
    patterns, spans = [], []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                and TAG_RE.search(node.value)):
            patterns.append(node.value)
            spans.append((node.lineno, node.col_offset, node.end_lineno or node.lineno, node.end_col_offset or 0))
    order = sorted(range(len(patterns)), key=lambda i: spans[i])
    reward_type = None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "REWARD_TYPE" for t in node.targets)
                and isinstance(node.value, ast.Constant)):
            reward_type = str(node.value.value)
    return RewardInfo(file=file, function=function, params=params, var_keyword=var_keyword,
                      patterns=[patterns[i] for i in order], reward_type=reward_type, spans=[spans[i] for i in order])


def pattern_literals(pattern: str) -> list[str]:
    """The literal runs every match of ``pattern`` holds, or the string itself when it is not a regex."""
    try:
        return regex_literals(pattern, required_only=True)
    except TemplateError:
        return [pattern]


def trl_reward_file(name: str) -> Path | None:
    """The file of a reward that TRL's ``trl grpo`` names without a module (``think_format_reward``), found
    without importing TRL."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return None
    for path in sorted((Path(next(iter(spec.submodule_search_locations))) / "rewards").glob("*.py")):
        if f"def {name}(" in path.read_text():
            return path
    return None


def resolve_module_function(ref: str, search: list[Path]) -> tuple[Path, str]:
    """``module.function`` (TRL's ``reward_funcs``) as a file and a name, found on ``search`` + ``sys.path``."""
    module, _, function = ref.rpartition(".")
    if not module:
        found = trl_reward_file(ref)
        if found is None:
            raise ConfigError(f"reward_funcs {ref!r}: not a module.function path, and no reward of TRL "
                              "(trl.rewards) has that name (is trl installed? pip install 'vlforge[trl]')")
        return found, ref
    relative = Path(*module.split("."))
    for base in [*search, *(Path(p) for p in sys.path if p)]:
        for candidate in (base / relative.with_suffix(".py"), base / relative / "__init__.py"):
            if candidate.is_file():
                return candidate, function
    raise ConfigError(f"reward_funcs {ref!r}: no file for module {module!r} in the working directory, "
                      "--reward-path or sys.path")


def _load_function(file: Path, function: str, extra_paths: list[Path]) -> tuple[Callable, Any]:
    for path in extra_paths:
        if str(path) not in sys.path:
            sys.path.append(str(path))
    name = f"vlforge_reward_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"--reward {file}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # the user's module: any import or runtime error is theirs to read
        sys.modules.pop(name, None)
        raise ConfigError(f"--reward {file}: importing it failed ({type(error).__name__}: {error}); "
                          "add the directories its imports need with --reward-path") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ConfigError(f"--reward {file}: {function!r} is not a function")
    return fn, module


def _number(value: Any, where: str) -> float:
    if value is None:
        return math.nan
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    raise ConfigError(f"{where}: returned {type(value).__name__} {value!r}, not a number")


@dataclass
class Sample:
    """One completion as the engine hands it to its reward."""

    text: str
    """The completion decoded with the engine's ``skip_special_tokens``."""
    ids: list[int]
    prompt_text: str
    row: Any
    """The :class:`~vlforge.rl.prompts.PromptRow`."""


@dataclass
class Scorer:
    """The user's reward function called in its engine's signature."""

    engine: str
    fn: Callable
    info: RewardInfo
    kwargs: dict = field(default_factory=dict)
    reward_type: str = "batch"

    @property
    def where(self) -> str:
        return f"{self.info.file}:{self.info.function}"

    def __call__(self, samples: list[Sample]) -> list[float]:
        try:
            scores = getattr(self, f"_{self.engine}")(samples)
        except ConfigError:
            raise
        except Exception as error:  # the user's function failed on a real completion
            raise ConfigError(f"{self.where} raised {type(error).__name__}: {error}") from None
        if len(scores) != len(samples):
            raise ConfigError(f"{self.where}: returned {len(scores)} rewards for {len(samples)} completions")
        return scores

    def _trl(self, samples: list[Sample]) -> list[float]:
        rows = [s.row for s in samples]
        if rows[0].conversational:
            prompts: list[Any] = [r.messages for r in rows]
            completions: list[Any] = [[{"role": "assistant", "content": s.text}] for s in samples]
        else:
            prompts = [s.prompt_text for s in samples]
            completions = [s.text for s in samples]
        columns = {key: [r.columns.get(key) for r in rows] for key in rows[0].columns if key != "completion"}
        out = self.fn(prompts=prompts, completions=completions, completion_ids=[s.ids for s in samples],
                      trainer_state=None, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None,
                      **columns, **self.kwargs)
        return [_number(v, self.where) for v in out]

    def _verl(self, samples: list[Sample]) -> list[float]:
        keywords = self.info.var_keyword or "solution_str" in self.info.params
        out = []
        for s in samples:
            if keywords:
                value = self.fn(data_source=s.row.data_source, solution_str=s.text, ground_truth=s.row.answer,
                                extra_info=s.row.extra_info, **self.kwargs)
            else:  # verl's default_compute_score calls its built-in scorers positionally
                value = self.fn(s.text, s.row.answer, **self.kwargs)
            if isinstance(value, dict):
                value = value.get("score")
            out.append(_number(value, self.where))
        return out

    def _easyr1(self, samples: list[Sample]) -> list[float]:
        inputs = [{"response": s.text, "response_length": len(s.ids), "ground_truth": s.row.answer} for s in samples]
        if self.reward_type == "sequential":
            results = [self.fn(item, **self.kwargs) for item in inputs]
        else:
            results = list(self.fn(inputs, **self.kwargs))
        out = []
        for result in results:
            if not isinstance(result, dict) or "overall" not in result:
                raise ConfigError(f"{self.where}: EasyR1 expects a dict with 'overall' per response, got {result!r}")
            out.append(_number(result["overall"], self.where))
        return out

    def _openrlhf(self, samples: list[Sample]) -> list[float]:
        out = []
        for s in samples:  # OpenRLHF calls the function once per query
            value = self.fn([s.prompt_text + s.text], [s.prompt_text], [s.row.answer])
            if isinstance(value, dict):
                value = value.get("rewards")
            if hasattr(value, "tolist"):
                value = value.tolist()
            if isinstance(value, (list, tuple)):
                if len(value) != 1:
                    raise ConfigError(f"{self.where}: returned {len(value)} rewards for one query")
                value = value[0]
            out.append(_number(value, self.where))
        return out


def load_scorer(engine: str, info: RewardInfo, *, kwargs: dict | None = None,
                extra_paths: list[Path] | None = None) -> Scorer:
    """Run the reward file and wrap its function for ``engine``."""
    fn, module = _load_function(info.file, info.function, list(extra_paths or []))
    if inspect.iscoroutinefunction(fn):
        raise ConfigError(f"{info.file}:{info.function} is async; vlforge calls reward functions synchronously")
    reward_type = str(getattr(module, "REWARD_TYPE", "batch"))
    return Scorer(engine=engine, fn=fn, info=info, kwargs=dict(kwargs or {}), reward_type=reward_type)
