"""An engine's launch command read as the settings it gives the run, in the engine's own grammar (no engine import).

Users start GRPO runs from a script: ``python3 -m verl.trainer.main_ppo data.train_files=... actor_rollout_ref.
model.path=...`` (Hydra overrides over verl's packaged config), ``python3 -m verl.trainer.main config=examples/
config.yaml worker.actor.model.model_path=...`` (EasyR1: OmegaConf's command line over the file ``config=``
names), ``trl grpo --config grpo.yaml --model_name_or_path ...`` (TRL's argument parser over its YAML). The same
words after ``vlforge rl check --`` give vlforge the run the script starts.

- The launcher is dropped: everything up to ``-m MODULE``, a ``*.py`` script or ``trl grpo`` (``ray job submit ...
  --``, environment assignments and ``python3`` included). Its module names the engine where it is one of
  :data:`LAUNCHERS`.
- ``verl``: ``KEY=VALUE``, ``+KEY=VALUE``, ``++KEY=VALUE`` (set), ``~KEY`` (delete); ``--config-path`` /
  ``--config-name`` (``-cp`` / ``-cn``) name the config file. Values in Hydra's grammar: ``null``, booleans
  (any case), numbers, ``[a,b]`` lists, ``{k:v}`` mappings, quoted strings.
- ``easyr1``: ``KEY=VALUE``; ``config=PATH`` is the file the rest overrides.
- ``trl``: ``--key value``, ``--key=value``, ``--flag`` (true), ``--key v1 v2`` (a list); ``--config FILE``.

Any other word is one line naming it.

Example:
    >>> launch = parse_launch("verl", ["python3", "-m", "verl.trainer.main_ppo", "actor_rollout_ref.rollout.n=5",
    ...                                "+data.apply_chat_template_kwargs.enable_thinking=False"])
    >>> launch.apply({"actor_rollout_ref": {"rollout": {"n": 1}}})
    {'actor_rollout_ref': {'rollout': {'n': 5}}, 'data': {'apply_chat_template_kwargs': {'enable_thinking': False}}}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlforge.errors import ConfigError

LAUNCHERS: dict[str, str] = {
    "verl.trainer.main_ppo": "verl",
    "verl.trainer.main": "easyr1",  # EasyR1 ships its trainer as the package ``verl`` too
    "trl.scripts.grpo": "trl",
    "trl grpo": "trl",
}
"""Launch modules (and TRL's command) whose engine is known."""

_DELETE = object()
_KEY = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)*$")
_NUMBER = re.compile(r"^[+-]?(\d[\d_]*)?(\.\d*)?([eE][+-]?\d+)?$")


@dataclass
class Launch:
    """What a launch command gives: the config file it names, its overrides in order, its engine (if its
    launcher says)."""

    engine: str | None = None
    launcher: str | None = None
    config: Path | None = None
    config_word: str | None = None
    """How the command named the config file (``config=``, ``--config-name``, ``--config``)."""
    overrides: list[tuple[str, Any]] = field(default_factory=list)

    def apply(self, data: dict) -> dict:
        """``data`` with the overrides applied (a copy: nested mappings are rebuilt along each key)."""
        out = _copy(data)
        for key, value in self.overrides:
            node = out
            *parents, last = key.split(".")
            for part in parents:
                child = node.get(part)
                if not isinstance(child, dict):
                    if value is _DELETE:
                        break
                    child = node[part] = {}
                node = child
            else:
                if value is _DELETE:
                    node.pop(last, None)
                else:
                    node[last] = value
        return out

    def keys(self) -> set[str]:
        """Every key an override set or deleted."""
        return {key for key, _ in self.overrides}


def _copy(data: Any) -> Any:
    return {k: _copy(v) for k, v in data.items()} if isinstance(data, dict) else data


def strip_launcher(args: list[str]) -> tuple[list[str], str | None]:
    """(the arguments after the launcher, the launcher's module / script / ``trl grpo``) - or all of them and None
    when no launcher is among them."""
    for i, word in enumerate(args):
        if word == "-m" and i + 1 < len(args):
            return args[i + 2:], args[i + 1]
        if word.endswith(".py") and "=" not in word and not word.startswith("-"):
            return args[i + 1:], word
        if word == "grpo" and i > 0 and Path(args[i - 1]).name == "trl":
            return args[i + 1:], "trl grpo"
    return list(args), None


def parse_launch(engine: str | None, args: list[str]) -> Launch:
    """The launch command ``args`` (with or without its launcher) in ``engine``'s grammar (None: the launcher's)."""
    rest, launcher = strip_launcher(args)
    known = LAUNCHERS.get(launcher or "")
    if engine is None:
        engine = known
    if engine is None:
        where = f"its launcher {launcher!r} is not one vlforge knows" if launcher else "it names no launcher"
        raise ConfigError(f"launch arguments: pass --engine (verl, easyr1 or trl): {where}")
    if engine == "verl":
        launch = _hydra(rest)
    elif engine == "easyr1":
        launch = _omegaconf(rest)
    elif engine == "trl":
        launch = _argparse(rest)
    else:
        raise ConfigError(f"launch arguments: {engine}'s are not read (its flags are argparse options vlforge does "
                          "not map); pass --model, --prompts and --reward")
    launch.engine, launch.launcher = engine, launcher
    return launch


def _hydra(args: list[str]) -> Launch:
    launch, directory, name = Launch(), None, None
    words = iter(args)
    for word in words:
        option, sep, inline = word.partition("=")
        if option in ("--config-path", "-cp", "--config-name", "-cn"):
            value = inline if sep else next(words, None)
            if not value:
                raise ConfigError(f"launch argument {option}: needs a value")
            if option in ("--config-path", "-cp"):
                directory = value
            else:
                name = value
            continue
        if word.startswith("-"):
            raise ConfigError(f"launch argument {word!r}: not a Hydra override vlforge reads (KEY=VALUE, +KEY=VALUE, "
                              "++KEY=VALUE, ~KEY, --config-path, --config-name)")
        if word.startswith("~"):
            key = word[1:].partition("=")[0]
            launch.overrides.append((_key(key, word), _DELETE))
            continue
        key, sep, raw = word.lstrip("+").partition("=")
        if not sep:
            raise ConfigError(f"launch argument {word!r}: expected KEY=VALUE (a Hydra override)")
        launch.overrides.append((_key(key, word), hydra_value(raw, word)))
    if name is not None:
        file = Path(directory or ".") / name
        launch.config = file if file.suffix in (".yaml", ".yml") else file.with_name(file.name + ".yaml")
        launch.config_word = "--config-name"
    elif directory is not None:
        raise ConfigError("launch argument --config-path without --config-name: name the config file too")
    return launch


def _omegaconf(args: list[str]) -> Launch:
    launch = Launch()
    for word in args:
        key, sep, raw = word.partition("=")
        if not sep or word.startswith("-"):
            raise ConfigError(f"launch argument {word!r}: expected KEY=VALUE (EasyR1's OmegaConf command line)")
        if key == "config":
            launch.config, launch.config_word = Path(raw).expanduser(), "config="
            continue
        launch.overrides.append((_key(key, word), hydra_value(raw, word)))
    return launch


def _argparse(args: list[str]) -> Launch:
    launch = Launch()
    i = 0
    while i < len(args):
        word = args[i]
        if not word.startswith("--") or len(word) == 2:
            raise ConfigError(f"launch argument {word!r}: expected --key value (TRL's command line)")
        key, sep, inline = word[2:].partition("=")
        key = key.replace("-", "_")
        values = [inline] if sep else []
        i += 1
        while not sep and i < len(args) and not (args[i].startswith("--") and len(args[i]) > 2):
            values.append(args[i])
            i += 1
        if key == "config":
            if len(values) != 1:
                raise ConfigError("launch argument --config: needs one file")
            launch.config, launch.config_word = Path(values[0]).expanduser(), "--config"
            continue
        parsed = [hydra_value(v, word) for v in values]
        value: Any = True if not parsed else parsed[0] if len(parsed) == 1 else parsed
        launch.overrides.append((_key(key, word), value))
    return launch


def _key(key: str, word: str) -> str:
    if not _KEY.match(key):
        raise ConfigError(f"launch argument {word!r}: {key!r} is not a config key")
    return key


def hydra_value(raw: str, word: str = "") -> Any:
    """A value as Hydra's override grammar reads it (OmegaConf's command line and argparse values are read the same:
    numbers, booleans, null, lists, mappings, quoted or plain strings).

    >>> hydra_value("[a.parquet, 'b c']"), hydra_value("{enable_thinking:False}"), hydra_value("1e-6")
    (['a.parquet', 'b c'], {'enable_thinking': False}, 1e-06)
    >>> hydra_value("./reward_function/math.py:compute_score")
    './reward_function/math.py:compute_score'
    """
    text = raw.strip()
    if not text.startswith(("[", "{", "'", '"')):
        return _scalar(text)  # a plain value is read whole (``path.py:function``, ``a,b``)
    value, end = _parse(text, 0, word or raw)
    if end != len(text):
        raise ConfigError(f"launch argument {word or raw!r}: cannot read the value {raw!r}")
    return value


def _parse(text: str, at: int, word: str) -> tuple[Any, int]:
    """One value of ``text`` from ``at`` (inside a list or mapping: up to its next ``,`` / closing bracket)."""
    if text.startswith("[", at):
        return _sequence(text, at + 1, "]", word)
    if text.startswith("{", at):
        return _sequence(text, at + 1, "}", word)
    if at < len(text) and text[at] in "'\"":
        close = text.find(text[at], at + 1)
        if close < 0:
            raise ConfigError(f"launch argument {word!r}: unterminated quote")
        return text[at + 1:close], close + 1
    end, depth = at, 0
    while end < len(text):
        char = text[end]
        if char in "[{(" or text.startswith("${", end):
            depth += 1
        elif char in "]})" and depth:
            depth -= 1
        elif depth == 0 and char in ",]}:":
            break
        end += 1
    return _scalar(text[at:end].strip()), end


def _sequence(text: str, at: int, close: str, word: str) -> tuple[Any, int]:
    items: list[Any] = []
    pairs: dict[str, Any] = {}
    at = _skip(text, at)
    while at < len(text) and text[at] != close:
        value, at = _parse(text, at, word)
        at = _skip(text, at)
        if close == "}":
            if at >= len(text) or text[at] != ":":
                raise ConfigError(f"launch argument {word!r}: a mapping needs key:value items")
            item, at = _parse(text, _skip(text, at + 1), word)
            pairs[str(value)] = item
            at = _skip(text, at)
        else:
            items.append(value)
        if at < len(text) and text[at] == ",":
            at = _skip(text, at + 1)
    if at >= len(text):
        raise ConfigError(f"launch argument {word!r}: missing {close!r}")
    return (pairs if close == "}" else items), at + 1


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] == " ":
        at += 1
    return at


def _scalar(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("null", "~", ""):
        return None if lowered != "" else ""
    if lowered in ("true", "false"):
        return lowered == "true"
    if _NUMBER.match(text) and any(c.isdigit() for c in text):
        try:
            return int(text.replace("_", ""))
        except ValueError:
            return float(text.replace("_", ""))
    if lowered in ("inf", "+inf", "-inf", "nan"):
        return float(lowered)
    return text
