"""Read what a GRPO run will use from the engine's own config file (no torch, no engine import).

- ``verl`` (0.9): a Hydra YAML such as ``verl/trainer/config/_generated_ppo_trainer.yaml`` or a file of its keys:
  ``actor_rollout_ref.model.path``, ``actor_rollout_ref.model.custom_chat_template``, ``data.train_files``,
  ``data.prompt_key``, ``data.apply_chat_template_kwargs``, ``data.max_response_length``,
  ``actor_rollout_ref.rollout.n`` / ``.temperature``, ``reward.custom_reward_function.path`` / ``.name`` /
  ``.reward_kwargs`` (older: the top-level ``custom_reward_function``).
- ``easyr1``: ``examples/config.yaml``'s keys: ``worker.actor.model.model_path``, ``data.train_files``
  (``PATH[@split]``), ``data.prompt_key`` / ``answer_key`` / ``image_key``, ``data.format_prompt``,
  ``data.override_chat_template``, ``data.max_response_length``, ``worker.rollout.n`` / ``.temperature``,
  ``worker.reward.reward_function`` (``path:name``, name ``main`` when omitted), ``reward_function_kwargs``,
  ``skip_special_tokens``.
- ``trl``: the YAML or JSON of ``trl grpo --config``: ``model_name_or_path``, ``dataset_name`` (a local file),
  ``reward_funcs`` (``module.function`` or a name of ``trl.rewards``), ``num_generations``,
  ``max_completion_length``, ``chat_template_kwargs``, ``temperature``.

Only these keys are read; the rest of the file is the engine's business. Hydra interpolations ``${a.b}`` and
``${oc.select:a.b,default}`` are resolved inside the file; a key this reader needs that holds another
interpolation is one line naming it.

Example:
    >>> from vlforge.rl.configs import dotted
    >>> dotted({"data": {"prompt_key": "problem"}}, "data.prompt_key")
    'problem'
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from vlforge.errors import ConfigError
from vlforge.rl.launch import Launch

_MISSING = object()
_INTERP = re.compile(r"^\$\{(?:oc\.select:)?([\w.]+)(?:,(.*))?\}$")


def read_file(path: Path, label: str = "--config") -> dict:
    """A YAML or JSON mapping, or one line naming the file (as ``label`` gave it)."""
    import yaml

    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"{label} {path}: cannot read ({error.strerror})") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(f"{label} {path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} "
                          f"({first})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{label} {path}: expected a mapping of keys, got {type(data).__name__}")
    return data


def dotted(data: dict, key: str, default: Any = None, *, _depth: int = 0) -> Any:
    """``data["a"]["b"]`` for ``"a.b"`` (``default`` when absent), with Hydra interpolations resolved."""
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    if isinstance(node, str) and node.startswith("${"):
        match = _INTERP.match(node)
        if match is None or _depth > 8:
            raise ConfigError(f"{key}: {node!r} is an interpolation vlforge cannot resolve; write the value")
        target, fallback = match.group(1), match.group(2)
        value = dotted(data, target, _MISSING, _depth=_depth + 1)
        if value is _MISSING:
            if fallback is None and "." not in target and target.isupper():  # ${MODEL_PATH} of a shell script
                raise ConfigError(f"{key}: {node!r} is a shell variable the command was pasted without; write its "
                                  "value")
            if fallback is None:
                return default
            return None if fallback.strip() == "null" else _scalar(fallback.strip())
        return value
    return node


def _scalar(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def _typed(key: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if value is not None and not isinstance(value, kind):
        raise ConfigError(f"{key}: expected {what}, got {value!r}")
    return value


_TRL_TYPES = {"num_generations": int, "max_completion_length": int, "temperature": float}
"""The types TRL's argparse gives the numeric fields vlforge reads (command-line values arrive as text)."""


def _argparse_typed(key: str, value: Any) -> Any:
    """``value`` of TRL's field ``key`` as its parser types it: a number from its text, anything else as it is."""
    kind = _TRL_TYPES.get(key)
    if kind is None or not isinstance(value, str):
        return value
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"{key}: expected {'an integer' if kind is int else 'a number'}, got {value!r}") from None


def _first_file(key: str, value: Any) -> str | None:
    """verl's ``data.train_files`` may be a list: the first file is what the probe reads."""
    if isinstance(value, list):
        value = value[0] if value else None
    return _typed(key, value, str, "a file path")


def _path(base: Path | None, value: str | None) -> Path | None:
    """A path as the engine resolves it (the working directory), else next to the config file."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists() or base is None:
        return path
    beside = base.parent / path
    return beside if beside.exists() else path


def _config_file(path: Path | None, launch: Launch | None) -> tuple[Path | None, str]:
    """The config file and how it was named: ``--config``, or the one the launch command names (not both)."""
    if launch is None or launch.config is None:
        return path, "--config"
    label = f"the launch command's {launch.config_word}"
    if path is not None:
        raise ConfigError(f"--config {path} and {label} {launch.config}: give one")
    if not launch.config.is_file():
        raise ConfigError(f"{label} {launch.config}: not found")
    return launch.config, label


_TOP_KEYS = {"verl": {"actor_rollout_ref", "critic", "reward_model", "custom_reward_function"}, "easyr1": {"worker"},
             "trl": {"model_name_or_path", "reward_funcs", "num_generations", "dataset_name"}}
"""Top-level keys only one engine's config holds (a config given with another --engine is refused)."""


def read_engine_config(engine: str, path: Path | None, launch: Launch | None = None) -> dict[str, Any]:
    """The run's settings named in ``path`` and the ``launch`` command's overrides over it (keys of
    :class:`vlforge.rl.spec.RunSpec`), each with the config key it came from under ``sources`` (``FILE:key``, or
    ``launch:key`` for a value the command set)."""
    path, label = _config_file(path, launch)
    data = read_file(path, label) if path is not None else {}
    if path is not None and isinstance(data, dict):
        theirs = [name for name, keys in _TOP_KEYS.items() if name != engine and keys & set(data)]
        if not _TOP_KEYS.get(engine, set()) & set(data) and theirs:
            raise ConfigError(f"{label} {path}: holds {theirs[0]}'s keys ({', '.join(sorted(_TOP_KEYS[theirs[0]] & set(data)))}"
                              f"), none of {engine}'s: pass --engine {theirs[0]}")
    overridden = set()
    if launch is not None:
        data, overridden = launch.apply(data), launch.keys()
    out: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def origin(key: str) -> str:
        if any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in overridden):
            return f"launch:{key}"
        return f"{path.name if path is not None else 'launch'}:{key}"

    def put(field: str, key: str, value: Any) -> None:
        if value is not None:
            out[field] = value
            sources[field] = origin(key)

    if engine == "verl":
        put("model", "actor_rollout_ref.model.path",
            _typed("actor_rollout_ref.model.path", dotted(data, "actor_rollout_ref.model.path"), str, "a path"))
        template = _typed("actor_rollout_ref.model.custom_chat_template",
                          dotted(data, "actor_rollout_ref.model.custom_chat_template"), str, "a template")
        put("template_text", "actor_rollout_ref.model.custom_chat_template", template)
        put("prompts", "data.train_files", _path(path, _first_file("data.train_files", dotted(data, "data.train_files"))))
        put("prompt_key", "data.prompt_key", _typed("data.prompt_key", dotted(data, "data.prompt_key"), str, "a column"))
        put("image_key", "data.image_key", _typed("data.image_key", dotted(data, "data.image_key"), str, "a column"))
        put("template_vars", "data.apply_chat_template_kwargs",
            _typed("data.apply_chat_template_kwargs", dotted(data, "data.apply_chat_template_kwargs"), dict,
                   "a mapping") or None)
        put("max_new_tokens", "data.max_response_length",
            _typed("data.max_response_length", dotted(data, "data.max_response_length"), int, "an integer"))
        put("samples", "actor_rollout_ref.rollout.n",
            _typed("actor_rollout_ref.rollout.n", dotted(data, "actor_rollout_ref.rollout.n"), int, "an integer"))
        put("temperature", "actor_rollout_ref.rollout.temperature",
            _typed("actor_rollout_ref.rollout.temperature", dotted(data, "actor_rollout_ref.rollout.temperature"),
                   (int, float), "a number"))
        for prefix in ("reward.custom_reward_function", "custom_reward_function"):
            reward_path = _typed(f"{prefix}.path", dotted(data, f"{prefix}.path"), str, "a file path")
            if reward_path:
                put("reward_file", f"{prefix}.path", _path(path, reward_path))
                name = _typed(f"{prefix}.name", dotted(data, f"{prefix}.name"), str, "a function name")
                put("reward_function", f"{prefix}.name", name or "compute_score")
                if not name:
                    sources["reward_function"] = "verl's default name (compute_score)"
                put("reward_kwargs", f"{prefix}.reward_kwargs",
                    _typed(f"{prefix}.reward_kwargs", dotted(data, f"{prefix}.reward_kwargs"), dict, "a mapping")
                    or None)
                break
    elif engine == "easyr1":
        put("model", "worker.actor.model.model_path",
            _typed("worker.actor.model.model_path", dotted(data, "worker.actor.model.model_path"), str, "a path"))
        files = _typed("data.train_files", dotted(data, "data.train_files"), str, "a file path")
        if files:
            files, _, _split = files.partition("@")
            put("prompts", "data.train_files", _path(path, files))
        for field, key in (("prompt_key", "data.prompt_key"), ("answer_key", "data.answer_key"),
                           ("image_key", "data.image_key")):
            put(field, key, _typed(key, dotted(data, key), str, "a column"))
        put("image_dir", "data.image_dir", _path(path, _typed("data.image_dir", dotted(data, "data.image_dir"), str,
                                                               "a directory")))
        put("format_prompt", "data.format_prompt",
            _path(path, _typed("data.format_prompt", dotted(data, "data.format_prompt"), str, "a file path")))
        put("template", "data.override_chat_template",
            _path(path, _typed("data.override_chat_template", dotted(data, "data.override_chat_template"), str,
                               "a file path")))
        put("max_new_tokens", "data.max_response_length",
            _typed("data.max_response_length", dotted(data, "data.max_response_length"), int, "an integer"))
        put("samples", "worker.rollout.n", _typed("worker.rollout.n", dotted(data, "worker.rollout.n"), int, "an integer"))
        put("temperature", "worker.rollout.temperature",
            _typed("worker.rollout.temperature", dotted(data, "worker.rollout.temperature"), (int, float), "a number"))
        reward = _typed("worker.reward.reward_function", dotted(data, "worker.reward.reward_function"), str,
                        "'path:name'")
        if reward:
            file, _, name = reward.rpartition(":") if ":" in reward else (reward, "", "main")
            put("reward_file", "worker.reward.reward_function", _path(path, file))
            put("reward_function", "worker.reward.reward_function", name or "main")
        put("reward_kwargs", "worker.reward.reward_function_kwargs",
            _typed("worker.reward.reward_function_kwargs", dotted(data, "worker.reward.reward_function_kwargs"), dict,
                   "a mapping") or None)
        put("skip_special_tokens", "worker.reward.skip_special_tokens",
            _typed("worker.reward.skip_special_tokens", dotted(data, "worker.reward.skip_special_tokens"), bool,
                   "true or false"))
        reward_type = _typed("worker.reward.reward_type", dotted(data, "worker.reward.reward_type"), str,
                             "batch or sequential")
        if reward_type not in (None, "batch", "sequential"):
            raise ConfigError(f"{origin('worker.reward.reward_type')}: {reward_type!r}; expected batch or sequential")
        put("reward_type", "worker.reward.reward_type", reward_type)
    elif engine == "trl":
        data = {key: _argparse_typed(key, value) for key, value in data.items()}
        put("model", "model_name_or_path",
            _typed("model_name_or_path", dotted(data, "model_name_or_path"), str, "a path"))
        dataset = _typed("dataset_name", dotted(data, "dataset_name"), str, "a dataset file")
        put("prompts", "dataset_name", _path(path, dataset))
        funcs = dotted(data, "reward_funcs")
        if isinstance(funcs, str):
            funcs = [funcs]
        _typed("reward_funcs", funcs, list, "a list of reward functions")
        if funcs:
            put("reward_refs", "reward_funcs", [str(func) for func in funcs])
        put("samples", "num_generations", _typed("num_generations", dotted(data, "num_generations"), int, "an integer"))
        put("max_new_tokens", "max_completion_length",
            _typed("max_completion_length", dotted(data, "max_completion_length"), int, "an integer"))
        kwargs = dotted(data, "chat_template_kwargs")
        if isinstance(kwargs, str):  # GRPOConfig also takes it as a JSON string
            try:
                kwargs = json.loads(kwargs)
            except ValueError:
                raise ConfigError(f"chat_template_kwargs: {kwargs!r} is not a JSON mapping") from None
        put("template_vars", "chat_template_kwargs", _typed("chat_template_kwargs", kwargs, dict, "a mapping") or None)
        put("temperature", "temperature", _typed("temperature", dotted(data, "temperature"), (int, float), "a number"))
    else:
        raise ConfigError(f"--config: {engine} takes its settings as command-line flags, not a config file; pass "
                          "--model, --prompts and --reward")
    out["sources"] = sources
    return out
