"""A reward function called the way its engine calls it.

:func:`call_problem` says why an engine cannot call a function (:func:`vlforge.rl.reading.inspect_reward` read it);
:func:`load_scorer` runs the file (its imports resolve with ``--reward-path`` directories appended to ``sys.path``)
and returns a :class:`Scorer` that calls the function in its engine's signature (:mod:`vlforge.rl.engines`).

Example:
    >>> import tempfile, pathlib
    >>> from vlforge.rl.reading import inspect_reward
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "r.py"
    >>> _ = path.write_text("def f(completions, **kw):\\n    return [1.0 for _ in completions]\\n")
    >>> call_problem(inspect_reward(path, "f"), "trl", keywords=set()) is None
    True
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlforge.errors import ConfigError
from vlforge.rl.reading import RewardInfo, module_file
from vlforge.vocab.templates import TemplateError, regex_literals

VERL_KEYWORDS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""The keywords verl calls a ``custom_reward_function`` with (its ``reward_kwargs`` besides)."""
VERL_SCORERS = ("gsm8k", "math_reward", "math_dapo", "math_verify", "math_batch", "prime_math", "prime_code",
                "sandbox_fusion", "geo3k", "search_r1_like_qa_em", "rlla")
"""The modules of verl 0.9.1's ``verl/utils/reward_score`` that its default_compute_score calls positionally."""


def verl_scorer_file(file: Path) -> bool:
    """``file`` is one of verl's built-in scorers: in a ``reward_score`` package (verl's own, a fork's such as
    TinyZero's) or named as one of verl's (a copy, a rewrite)."""
    return "reward_score" in file.resolve().parts or file.stem in VERL_SCORERS


def call_problem(info: RewardInfo, engine: str, *, keywords: set[str], verl_positional: bool = False) -> str | None:
    """Why ``engine`` cannot call the function the way it calls reward functions, or None. ``keywords``: the extra
    keyword arguments the run passes (``reward_kwargs``); ``verl_positional``: the function may be one of verl's
    built-in scorers, which default_compute_score calls ``f(solution_str, ground_truth)`` (a ``--reward`` file in a
    ``reward_score`` package: verl's own, or a fork's such as TinyZero's)."""
    shown = f"{info.function}({', '.join(info.params)}{', **' if info.var_keyword else ''}"
    shown += "kwargs)" if info.var_keyword else ")"
    if "." in info.function and engine != "trl":
        return (f"{engine} looks its reward function up by name in the module, which cannot name the method "
                f"{info.function}: expose it as a module-level function")
    if info.signature is not None and info.signature != engine:
        return f"{shown} is {info.signature}'s reward signature, not {engine}'s: pass --engine {info.signature}"
    unfilled = [name for name in info.required if name not in keywords]
    unknown = sorted(keywords - set(info.params)) if not info.var_keyword else []
    if unknown:  # verl merges reward_kwargs into its call, EasyR1 binds them with functools.partial: a TypeError
        return f"{engine} passes the reward kwargs {', '.join(unknown)}: {shown} cannot take them (add **kwargs)"

    def positional(count: int, call: str) -> str | None:
        if not info.var_positional and info.positional < count:
            return f"{engine} calls {call}: {shown} takes fewer positional arguments"
        extra = unfilled[count:]
        return f"{engine} calls {call}: {shown} also requires {', '.join(extra)}" if extra else None

    if engine == "trl":
        if not info.var_keyword:
            return (f"TRL calls reward functions with keywords (prompts=, completions=, completion_ids=, "
                    f"trainer_state=, ... and the dataset's columns): {shown} needs **kwargs")
        return None
    if engine == "verl":
        missing, extra = _verl_keywords_unfit(info, keywords)
        if not missing and not extra:
            return None
        if verl_positional and "data_source" not in info.params:  # as default_compute_score calls its scorers
            return positional(2, f"{info.function}(solution_str, ground_truth)")
        return (f"verl calls {info.function}(data_source=, solution_str=, ground_truth=, extra_info=): {shown} "
                + (f"cannot take {', '.join(missing)}" if missing else f"also requires {', '.join(extra)}"))
    if engine == "easyr1":
        return positional(1, f"{info.function}(reward_inputs)")
    if engine == "openrlhf":
        return positional(3, f"{info.function}(queries, prompts, labels)")
    return None


def _verl_keywords_unfit(info: RewardInfo, keywords: set[str]) -> tuple[list[str], list[str]]:
    """What stops verl's keyword call (``data_source=, solution_str=, ground_truth=, extra_info=`` and the run's
    reward kwargs): the keywords ``info``'s function cannot take, and the parameters that call leaves unfilled."""
    taken = set(info.params) | keywords
    missing = [k for k in VERL_KEYWORDS if k not in taken] if not info.var_keyword else []
    return missing, [k for k in info.required if k not in keywords and k not in VERL_KEYWORDS]


def pattern_literals(pattern: str, *, regex: bool = True, added: list[str] | None = None) -> list[str]:
    """The literal runs every match of ``pattern`` holds (of an alternation, the tags every alternative holds;
    ``added``: the tokenizer's added-token contents), or the string itself when it is not (used as) a regex."""
    if not regex:
        return [pattern]
    try:
        return regex_literals(pattern, required_only=True, added=added)
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
    found = module_file(module.split("."), search)
    if found is not None:
        return found, function
    raise ConfigError(f"reward_funcs {ref!r}: no file for module {module!r} in the working directory, "
                      "--reward-path or sys.path")


def _package_name(file: Path) -> str | None:
    """``pkg.sub.mod`` for a file inside a package (directories with ``__init__.py``), its top package's parent
    put on ``sys.path``; None for a file outside one."""
    top = file.resolve().parent
    if not (top / "__init__.py").is_file():
        return None
    while (top.parent / "__init__.py").is_file():
        top = top.parent
    parts = file.resolve().relative_to(top.parent).with_suffix("").parts
    if str(top.parent) not in sys.path:
        sys.path.append(str(top.parent))
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _load_function(file: Path, function: str, extra_paths: list[Path], *, as_module: bool = False
                   ) -> tuple[Callable, Any]:
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
        package = _package_name(file) if as_module and isinstance(error, ImportError) else None
        try:  # relative imports: the module of its package, imported by its dotted name as TRL imports it
            module = importlib.import_module(package) if package is not None else None
        except Exception:  # the first error is the one to report
            module = None
        if module is not None and Path(getattr(module, "__file__", "") or "").resolve() != file.resolve():
            module = None  # another package of that name came first on sys.path
        if module is None:
            raise ConfigError(f"--reward {file}: importing it failed ({type(error).__name__}: {error}); "
                              "add the directories its imports need with --reward-path") from None
    fn: Any = module
    for part in function.split("."):  # ``Class.method``
        fn = getattr(fn, part, None)
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
        keywords = _verl_keywords_unfit(self.info, set(self.kwargs)) == ([], [])
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


def _awaited(fn: Callable) -> Callable:
    """``fn`` (a coroutine function) called to completion."""
    import asyncio
    import functools

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    return call


def load_scorer(engine: str, info: RewardInfo, *, kwargs: dict | None = None, extra_paths: list[Path] | None = None,
                reward_type: str | None = None, named: tuple[Path, str] | None = None) -> Scorer:
    """Run the reward file and wrap its function for ``engine``; ``reward_type`` (EasyR1's config key) over the
    file's ``REWARD_TYPE``, else batch. ``named``: the file and function the run names (default: where ``info``
    found the function), loaded as the engine loads it: by its path (verl, EasyR1), or as a module of its package
    where it is in one (TRL imports ``module.function``, so relative imports work)."""
    file, function = named or (info.file, info.function)
    fn, module = _load_function(file, function, list(extra_paths or []), as_module=engine == "trl")
    if inspect.iscoroutinefunction(fn):  # verl awaits an async compute_score: one event loop per call here
        fn = _awaited(fn)
    reward_type = reward_type or str(getattr(module, "REWARD_TYPE", "batch"))
    return Scorer(engine=engine, fn=fn, info=info, kwargs=dict(kwargs or {}), reward_type=reward_type)
