"""What a GRPO run will use, resolved once before any work: the flags over the engine's config file over the
engine's defaults, each value with where it came from. No torch, no transformers.

Example:
    >>> spec = resolve(RunRequest(model="tiny:qwen3_vl", format_regex=r"^<think>.*</think>"))
    >>> spec.engine, spec.skip_special_tokens, spec.sources["skip_special_tokens"]
    ('trl', True, 'trl decodes with skip_special_tokens=True')
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from vlforge.errors import ConfigError, VlforgeError
from vlforge.rl.engines import ENGINES, engine
from vlforge.strict import StrictModel


class RunRequest(StrictModel):
    """The run as the flags give it (None: from --config, else the engine's default)."""

    engine: str | None = None
    config: Path | None = None
    launch: list[str] = Field(default_factory=list)
    """The engine's launch command (or its arguments): its overrides go over the config file."""
    model: str | None = None
    tokenizer: Path | None = None
    template: Path | None = None
    template_vars: dict[str, Any] = Field(default_factory=dict)
    format_prompt: Path | None = None
    prompts: Path | None = None
    prompt_key: str | None = None
    answer_key: str | None = None
    reward: str | None = None
    reward_paths: list[Path] = Field(default_factory=list)
    reward_kwargs: dict[str, Any] = Field(default_factory=dict)
    format_regex: str | None = None
    skip_special_tokens: bool | None = None
    reads_prompts: bool = True
    """False for ``rl check``, which reads no prompt: a train file the engine's config names (a hub dataset name,
    EasyR1's ``hiyouga/geometry3k@train``) is then not looked for."""


class RunSpec(StrictModel):
    """The run, resolved."""

    engine: str
    model: str
    tokenizer: Path | None = None
    template: Path | None = None
    template_text: str | None = None
    """The chat template to use (None: the tokenizer's own)."""
    template_vars: dict[str, Any] = Field(default_factory=dict)
    format_prompt: str | None = None
    """EasyR1's format prompt (jinja, rendered with ``content``)."""
    prompts: Path | None = None
    prompt_key: str | None = None
    answer_key: str | None = None
    image_key: str | None = None
    image_dir: Path | None = None
    """EasyR1's ``data.image_dir``: the root of the rows' relative image paths."""
    reward_file: Path | None = None
    reward_function: str | None = None
    reward_kwargs: dict[str, Any] = Field(default_factory=dict)
    reward_type: Literal["batch", "sequential"] | None = None
    """EasyR1's ``worker.reward.reward_type`` (None: the file's ``REWARD_TYPE``, else batch)."""
    reward_paths: list[Path] = Field(default_factory=list)
    format_regex: str | None = None
    skip_special_tokens: bool
    samples: int | None = None
    max_new_tokens: int | None = None
    temperature: float = 1.0
    sources: dict[str, str] = Field(default_factory=dict)
    """Where each value came from: a flag, ``FILE:key`` of the config, or the engine's default."""


@contextlib.contextmanager
def _named_by(sources: dict[str, str], key: str, flag: str = "") -> Iterator[None]:
    """An error about a value the engine's config gave names that config key (instead of the ``flag``)."""
    try:
        yield
    except VlforgeError as error:
        origin = sources.get(key, "flag")
        if origin == "flag" or ":" not in origin:
            raise
        raise type(error)(f"{origin}: {str(error).removeprefix(flag + ' ') if flag else error}") from None


def _reward_ref(text: str, default_function: str | None) -> tuple[Path, str]:
    """``FILE:FUNCTION`` (FUNCTION: the engine's default name when omitted)."""
    file, sep, function = text.rpartition(":")
    if not sep or "/" in function or function.endswith(".py"):
        file, function = text, default_function or ""
    if not function:
        raise ConfigError(f"--reward {text!r}: name the function, FILE:FUNCTION")
    return Path(file).expanduser(), function


def _format_reward(refs: list[str], origin: str, search: list[Path]) -> tuple[Path, str, str]:
    """The one of TRL's ``reward_funcs`` that names a tag (``accuracy_reward think_format_reward``: the format one),
    as ``(file, function, source)``; several that do are one line asking for ``--reward``."""
    from vlforge.rl.reading import inspect_reward
    from vlforge.rl.rewards import resolve_module_function

    found = [(ref, *resolve_module_function(ref, search)) for ref in refs]
    if len(found) == 1:
        return found[0][1], found[0][2], origin
    tagged = [item for item in found if inspect_reward(item[1], item[2], tuple(search)).needed]
    if len(tagged) > 1:
        names = ", ".join(ref for ref, _file, _function in tagged)
        raise ConfigError(f"{origin}: {len(tagged)} of its functions name tags ({names}); vlforge checks one at a "
                          "time: pass --reward FILE:FUNCTION for the one to check")
    _ref, file, function = (tagged or found)[0]
    which = f"the one of {len(refs)} that names a tag" if tagged else f"the first of {len(refs)}: none names a tag"
    return file, function, f"{origin} ({which})"


def resolve(request: RunRequest) -> RunSpec:
    """Flags over the config file over the engine's defaults; the files named are checked here (no torch)."""
    from vlforge.rl.reading import inspect_reward

    found: dict[str, Any] = {}
    sources: dict[str, str] = {}
    name = request.engine
    launch = None
    if request.launch:
        from vlforge.rl.launch import parse_launch

        launch = parse_launch(name, request.launch)
        if name is None:
            name = launch.engine
            sources["engine"] = f"the launch command ({launch.launcher})"
    if request.config is not None or launch is not None:
        if name is None:
            raise ConfigError("--config needs --engine (verl, easyr1 or trl): the keys mean different things in each")
        if request.config is not None and not request.config.is_file():
            raise ConfigError(f"--config {request.config}: " + ("is a directory, not a config file"
                                                                 if request.config.is_dir() else "not found"))
        engine(name)
        from vlforge.rl.configs import read_engine_config

        found = read_engine_config(name, request.config, launch)
        sources.update(found.pop("sources"))
    flags = {"model": request.model, "tokenizer": request.tokenizer, "template": request.template,
             "prompts": request.prompts, "prompt_key": request.prompt_key, "answer_key": request.answer_key,
             "format_regex": request.format_regex, "skip_special_tokens": request.skip_special_tokens}
    for key, value in flags.items():
        if value is not None:
            found[key] = value
            sources[key] = "flag"
    if request.template_vars:
        found["template_vars"] = {**found.get("template_vars", {}), **request.template_vars}
        sources["template_vars"] = "flag"
    if request.template is not None:
        found.pop("template_text", None)
    if request.format_prompt is not None:
        found["format_prompt"] = request.format_prompt
        sources["format_prompt"] = "flag"
    if request.reward is not None and request.format_regex is not None:
        raise ConfigError("--reward and --format-regex: give one (the reward file's own regexes are read from it)")
    if request.reward_kwargs:
        found["reward_kwargs"] = {**found.get("reward_kwargs", {}), **request.reward_kwargs}
        sources["reward_kwargs"] = "flag"

    # the reward: a flag, the config's file:function, or TRL's reward_funcs references
    reward_refs, refs_origin = found.pop("reward_refs", None), sources.pop("reward_refs", "flag")
    if request.reward is not None:
        file, function = _reward_ref(request.reward, ENGINES[name].default_function if name in ENGINES else None)
        found["reward_file"], found["reward_function"] = file, function
        sources["reward_file"] = sources["reward_function"] = "flag"
    elif reward_refs and "format_regex" not in found:
        found["reward_file"], found["reward_function"], sources["reward_file"] = _format_reward(
            reward_refs, refs_origin, [Path.cwd(), *request.reward_paths])
    if found.get("reward_file") is not None and found.get("format_regex") is not None and request.reward is None:
        found.pop("reward_file"), found.pop("reward_function", None)  # --format-regex replaces the config's reward
    info = None
    if found.get("reward_file") is not None:
        with _named_by(sources, "reward_file", "--reward"):
            info = inspect_reward(Path(found["reward_file"]), found["reward_function"], tuple(request.reward_paths))
        if name is None:
            name = info.signature
            if name is None:
                raise ConfigError(f"--reward {info.file}:{info.function}: its parameters ({', '.join(info.params)}) "
                                  "match no engine's reward signature; pass --engine")
            sources["engine"] = f"the signature of {info.function}({', '.join(info.params)})"
    if name is None:
        name = "trl"
        sources["engine"] = "default (trl: the engine that shares vlforge's environment)"
    else:
        sources.setdefault("engine", "flag")
    record = engine(name)
    if "model" not in found:
        raise ConfigError("no model: pass --model (a checkpoint directory or tiny:FAMILY)"
                          + (" or name it in --config" if request.config else "")
                          + (" or in the launch command" if launch is not None else ""))
    if found.get("reward_file") is None and found.get("format_regex") is None:
        hint = (" (verl's config names no custom_reward_function: verl then scores with its built-in "
                "default_compute_score by data_source; pass that scorer's file, e.g. --reward "
                "SITE-PACKAGES/verl/utils/reward_score/geo3k.py:compute_score)" if name == "verl" else "")
        raise ConfigError("no reward: pass --reward FILE:FUNCTION or --format-regex RE" + hint)
    if found.get("format_regex") is not None:
        try:
            re.compile(found["format_regex"])
        except re.error as error:
            raise ConfigError(f"--format-regex {found['format_regex']!r}: does not compile ({error})") from None
        if re.search(found["format_regex"], "") is not None:
            raise ConfigError(f"--format-regex {found['format_regex']!r}: matches the empty string, so every "
                              "completion: the reward could never tell two completions apart")
    if "skip_special_tokens" not in found:
        found["skip_special_tokens"] = record.skip_special_tokens
        sources["skip_special_tokens"] = f"{name} decodes with skip_special_tokens={record.skip_special_tokens}"
    for key in ("template", "format_prompt"):
        path = found.get(key)
        if path is not None and not Path(path).is_file():
            text = "{{" in str(path) or "\n" in str(path)  # a template's text where its file is expected
            shown = f"{str(path)[:40]!r}...: is template text, not a file (the engine reads this key as a file path)" \
                if text else f"{path}: not found"
            raise ConfigError(f"--{key.replace('_', '-')} {shown}"
                              + (f" (from {sources[key]})" if sources.get(key, "flag") != "flag" else ""))
    if found.get("format_prompt") is not None:
        found["format_prompt"] = Path(found["format_prompt"]).read_text()
    if found.get("template") is not None:
        found["template_text"] = Path(found["template"]).read_text()
    if found.get("tokenizer") is not None and not Path(found["tokenizer"]).is_dir():
        raise ConfigError(f"--tokenizer {found['tokenizer']}: not a directory")
    if found.get("prompts") is not None and (request.reads_prompts or sources.get("prompts") == "flag"
                                             or Path(found["prompts"]).is_file()):  # a local train file: read as the run will
        from vlforge.rl.prompts import PROMPT_KEYS, check_prompts_file

        with _named_by(sources, "prompts", "--prompts"):
            check_prompts_file(Path(found["prompts"]), found.get("prompt_key") or PROMPT_KEYS[name])
    if info is not None:
        from vlforge.rl.rewards import call_problem, verl_scorer_file

        from_flag = sources.get("reward_file", "flag") == "flag"
        problem = call_problem(info, name, keywords=set(found.get("reward_kwargs", {})),
                               verl_positional=from_flag and verl_scorer_file(info.file))
        if problem is None and info.via is not None and info.via.startswith("from .") and name in ("verl", "easyr1"):
            problem = (f"{name} loads this file by its path, so its relative import ({info.via}) fails when the run "
                       f"starts: import it absolutely, or name {info.file} itself")
        if problem is not None:
            where = f"--reward {found['reward_file']}:{found['reward_function']}" if from_flag else sources["reward_file"]
            raise ConfigError(f"{where}: {problem}")
    from vlforge.models.refs import check_model_ref

    with _named_by(sources, "model"):
        check_model_ref(found["model"])
    found.setdefault("samples", None)
    spec = RunSpec(engine=name, sources=sources, reward_paths=request.reward_paths,
                   **{k: v for k, v in found.items() if k in RunSpec.model_fields and v is not None})
    return spec
