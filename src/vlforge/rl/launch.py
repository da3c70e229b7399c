"""An engine's launch command read as the settings it gives the run, in the engine's own grammar (no engine import).

Users start GRPO runs from a script: ``python3 -m verl.trainer.main_ppo data.train_files=... actor_rollout_ref.
model.path=...`` (Hydra overrides over verl's packaged config), ``python3 -m verl.trainer.main config=examples/
config.yaml worker.actor.model.model_path=...`` (EasyR1: OmegaConf's command line over the file ``config=``
names), ``trl grpo --config grpo.yaml --model_name_or_path ...`` (TRL's argument parser over its YAML). The same
words after ``vlforge rl check --`` give vlforge the run the script starts.

- The launcher is dropped: everything up to the engine's module (``-m verl.trainer.main_ppo``, or the same module
  as a script path), ``trl grpo``, else the last ``-m MODULE`` / ``*.py`` script (``ray job submit ... --``,
  ``torchrun ...``, environment assignments and ``python3`` included). A known module names the engine
  (:data:`LAUNCHERS`); it must agree with ``--engine``.
- ``verl``: Hydra overrides ``KEY=VALUE``, ``+KEY=VALUE``, ``++KEY=VALUE`` (set; a mapping merges into the one
  there), ``~KEY`` (delete); ``--config-path`` / ``--config-name`` (``-cp`` / ``-cn``) name the config file
  (a relative path is relative to verl's module: absolute only, or beside a ``*.py`` launcher). Values in Hydra's
  grammar: ``null``, booleans (any case), ints, floats, ``[a,b]`` lists, ``{k:v}`` mappings, quoted strings,
  ``\\`` escapes, ``${...}`` kept as written; a sweep (``a,b``) is refused.
- ``easyr1``: ``KEY=VALUE`` with YAML values as OmegaConf reads them; ``config=PATH`` is the file the rest merges
  over.
- ``trl``: ``--key value`` / ``--key=value`` / ``--flag`` / ``--key v1 v2`` (values kept as text: the reader
  types the fields it uses, as TRL's argparse does); ``--config FILE`` (two words, as TRL takes it).

Any other word is one line naming it.

Example:
    >>> launch = parse_launch("verl", ["python3", "-m", "verl.trainer.main_ppo", "actor_rollout_ref.rollout.n=5",
    ...                                "+data.apply_chat_template_kwargs.enable_thinking=False"])
    >>> launch.apply({"actor_rollout_ref": {"rollout": {"n": 1}}})
    {'actor_rollout_ref': {'rollout': {'n': 5}}, 'data': {'apply_chat_template_kwargs': {'enable_thinking': False}}}
"""

from __future__ import annotations

import functools
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

VERL_CONFIG_NAME = "ppo_trainer"
"""The config ``verl.trainer.main_ppo`` composes when the command names none (its ``@hydra.main``)."""
VERL_PACKAGED = ("ppo_trainer", "ppo_megatron_trainer")
"""verl's packaged trainer configs (``verl/trainer/config``, the folder ``--config-path=config`` names beside
``main_ppo``) whose values vlforge reads are the engine's defaults (tests/rl/test_launch.py composes each)."""

_DELETE = object()
_KEY = re.compile(r"^[A-Za-z_$][\w$-]*(\.[\w$-]+)*$")
_INT = re.compile(r"^[+-]?(0|[1-9](_?\d)*)$")
_FLOAT = re.compile(r"^[+-]?((((0|[1-9](_?\d)*)\.)|((0|[1-9](_?\d)*)?\.\d(_?\d)*))([eE][+-]?\d(_?\d)*)?"
                    r"|(0|[1-9](_?\d)*)[eE][+-]?\d(_?\d)*|inf|nan)$", re.IGNORECASE)
_ESCAPED = "\\()[]{}:=, \t"
"""Characters a backslash escapes in an unquoted Hydra value."""


@dataclass
class Launch:
    """What a launch command gives: the config file it names, its overrides in order, its engine (if its
    launcher says)."""

    engine: str | None = None
    launcher: str | None = None
    config: Path | None = None
    config_word: str | None = None
    """How the command named the config file (``config=``, ``--config-name``, ``--config``)."""
    packaged: str | None = None
    """The engine's own packaged config the command composes (verl without ``--config-path``): its defaults."""
    overrides: list[tuple[str, Any]] = field(default_factory=list)

    def apply(self, data: dict) -> dict:
        """``data`` with the overrides applied, as the engines merge them (a mapping into a mapping)."""
        out = _merged({}, data)
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
                elif isinstance(value, dict) and isinstance(node.get(last), dict):
                    node[last] = _merged(node[last], value)
                else:
                    node[last] = value
        return out

    def keys(self) -> set[str]:
        """Every key an override set or deleted."""
        return {key for key, _ in self.overrides}


def _merged(base: dict, top: dict) -> dict:
    """``top`` merged into a copy of ``base`` (mappings recursively, anything else replaced)."""
    out = {k: _merged({}, v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in top.items():
        if isinstance(value, dict):
            out[key] = _merged(out[key] if isinstance(out.get(key), dict) else {}, value)
        else:
            out[key] = value
    return out


def _script_module(word: str) -> str | None:
    """The module a script path is (``.../verl/trainer/main_ppo.py`` -> ``verl.trainer.main_ppo``), if known."""
    parts = Path(word).with_suffix("").parts
    return next((name for name in LAUNCHERS if " " not in name and
                 tuple(parts[-len(name.split(".")):]) == tuple(name.split("."))), None)


def strip_launcher(args: list[str]) -> tuple[list[str], str | None, Path | None]:
    """(the arguments after the launcher, the launcher's module / script / ``trl grpo``, the launcher script's
    path) - or all of them, None, None when no launcher is among them. A known launcher wins; else the last
    ``-m MODULE`` or ``*.py`` script (not a ``--flag``'s value)."""
    found: list[tuple[int, str, Path | None]] = []  # (index of its last word, name, script)
    for i, word in enumerate(args):
        if word == "-m" and i + 1 < len(args):
            found.append((i + 1, args[i + 1], None))
        elif (word.endswith(".py") and "=" not in word and not word.startswith("-")
              and not (i and args[i - 1].startswith("--") and "=" not in args[i - 1])):
            found.append((i, _script_module(word) or word, Path(word)))
        elif word == "grpo" and i > 0 and Path(args[i - 1]).name == "trl":
            found.append((i, "trl grpo", None))
    if not found:
        return list(args), None, None
    known = [entry for entry in found if entry[1] in LAUNCHERS]
    end, name, script = (known or found)[0 if known else -1]
    return args[end + 1:], name, script


def parse_launch(engine: str | None, args: list[str]) -> Launch:
    """The launch command ``args`` (with or without its launcher) in ``engine``'s grammar (None: the launcher's)."""
    from vlforge.rl.engines import engine as engine_record

    rest, launcher, script = strip_launcher(args)
    shell = next((word for word in args if word.endswith(".sh") and not word.startswith("-")), None)
    if launcher is None and shell is not None:  # bash -x run.sh
        raise ConfigError(f"launch arguments: {shell} is a shell script, which vlforge does not run or read: pass the "
                          "command it launches (its python3 -m ... / trl grpo ... line, variables expanded)")
    known = LAUNCHERS.get(launcher or "")
    if engine is not None:
        engine_record(engine)
        if known is not None and known != engine:
            raise ConfigError(f"launch arguments: --engine {engine} but the launcher {launcher} is {known}'s")
    engine = engine or known
    if engine is None:
        where = f"its launcher {launcher!r} is not one vlforge knows" if launcher else "it names no launcher"
        raise ConfigError(f"launch arguments: pass --engine (verl, easyr1 or trl): {where}")
    if engine == "verl":
        launch = _hydra(rest, script, launcher)
    elif engine == "easyr1":
        launch = _omegaconf(rest)
    elif engine == "trl":
        launch = _argparse(rest)
    else:
        raise ConfigError(f"launch arguments: {engine}'s are not read (its flags are argparse options vlforge does "
                          "not map); pass --model, --prompts and --reward")
    launch.engine, launch.launcher = engine, launcher
    return launch


def _hydra(args: list[str], script: Path | None, launcher: str | None) -> Launch:
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
        key, sep, raw = word.removeprefix("++").removeprefix("+").partition("=")
        if not sep:
            raise ConfigError(f"launch argument {word!r}: expected KEY=VALUE (a Hydra override)")
        launch.overrides.append((_key(key, word), hydra_value(raw, word)))
    stem = (name or VERL_CONFIG_NAME).removesuffix(".yaml").removesuffix(".yml")
    own = launcher == "verl.trainer.main_ppo" and directory is not None and Path(directory) == Path("config")
    if directory is None or own:  # verl's own config folder, inside its package
        if stem not in VERL_PACKAGED:
            raise ConfigError(f"launch argument --config-name {name}: verl reads it from its own package; pass "
                              "that file with --config (e.g. verl/trainer/config/_generated_ppo_trainer.yaml, the "
                              "flattened ppo_trainer)")
        launch.packaged = stem
        return launch
    folder = Path(directory).expanduser()
    if not folder.is_absolute():
        if script is None:
            raise ConfigError(f"launch argument --config-path {directory}: Hydra reads a relative path beside the "
                              "launched module's file; give it absolute")
        folder = script.parent / folder
    launch.config, launch.config_word = folder / f"{stem}.yaml", "--config-path/--config-name"
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
        launch.overrides.append((_key(key, word), yaml_value(raw, word)))
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
            if sep or len(values) != 1:
                raise ConfigError(f"launch argument {word!r}: TRL reads its config file as --config FILE (two words)")
            if launch.config is None:  # TRL takes the first
                launch.config, launch.config_word = Path(values[0]).expanduser(), "--config"
            continue
        value: Any = True if not values else values[0] if len(values) == 1 else values
        launch.overrides.append((_key(key, word), value))
    return launch


def _key(key: str, word: str) -> str:
    if not _KEY.match(key):
        raise ConfigError(f"launch argument {word!r}: {key!r} is not a config key")
    return key


def yaml_value(raw: str, word: str = "") -> Any:
    """A value as OmegaConf's command line reads it: YAML, with ``1e-6`` a float.

    >>> yaml_value("yes"), yaml_value("1e-6"), yaml_value("{format_weight: 0.5}")
    (True, 1e-06, {'format_weight': 0.5})
    """
    import yaml

    try:
        return yaml.load(raw, Loader=_yaml_loader())  # a SafeLoader subclass
    except yaml.YAMLError as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(f"launch argument {word or raw!r}: not a YAML value ({first})") from None


@functools.cache
def _yaml_loader() -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        """PyYAML's safe loader, with the float forms YAML 1.2 and OmegaConf read (``1e-6``)."""

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(\d[\d_]*\.[\d_]*([eE][-+]?\d+)?|\d[\d_]*[eE][-+]?\d+|\.\d[\d_]*([eE][-+]?\d+)?"
                   r"|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN))$"),
        list("-+0123456789."))
    return Loader


def hydra_value(raw: str, word: str = "") -> Any:
    """A value as Hydra's override grammar reads it.

    >>> hydra_value("[a.parquet, 'b c']"), hydra_value("{enable_thinking:False}"), hydra_value("1e-6")
    (['a.parquet', 'b c'], {'enable_thinking': False}, 1e-06)
    >>> hydra_value("./reward_function/math.py:compute_score"), hydra_value("[hdfs://x/y.parquet]")
    ('./reward_function/math.py:compute_score', ['hdfs://x/y.parquet'])
    """
    text = raw.strip(" \t")
    value, end = _parse(text, 0, word or raw, "")
    if end != len(text):
        if text[end] == ",":
            raise ConfigError(f"launch argument {word or raw!r}: a sweep ({text}); vlforge reads one run: give one "
                              "value")
        raise ConfigError(f"launch argument {word or raw!r}: cannot read the value {raw!r}")
    return value


def _parse(text: str, at: int, word: str, stops: str) -> tuple[Any, int]:
    """One value of ``text`` from ``at``, up to the first of ``stops`` outside brackets, quotes and ``${...}``."""
    if text.startswith("[", at):
        return _sequence(text, at + 1, "]", word)
    if text.startswith("{", at):
        return _sequence(text, at + 1, "}", word)
    if at < len(text) and text[at] in "'\"":
        return _quoted(text, at, word)
    chars: list[str] = []
    end, depth = at, 0
    while end < len(text):
        char = text[end]
        if char == "\\" and end + 1 < len(text) and text[end + 1] in _ESCAPED:
            chars.append(text[end + 1])
            end += 2
            continue
        if text.startswith("${", end):
            close = text.find("}", end)
            if close < 0:
                raise ConfigError(f"launch argument {word!r}: unterminated ${{")
            chars.append(text[end:close + 1])
            end = close + 1
            continue
        if char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif depth == 0 and (char in stops or (not stops and char == ",")):
            break
        chars.append(char)
        end += 1
    return _scalar("".join(chars).strip(" \t")), end


def _quoted(text: str, at: int, word: str) -> tuple[str, int]:
    quote, chars, end = text[at], [], at + 1
    while end < len(text):
        char = text[end]
        if char == "\\" and end + 1 < len(text) and text[end + 1] in (quote, "\\"):
            chars.append(text[end + 1])
            end += 2
            continue
        if char == quote:
            return "".join(chars), end + 1
        chars.append(char)
        end += 1
    raise ConfigError(f"launch argument {word!r}: unterminated quote")


def _sequence(text: str, at: int, close: str, word: str) -> tuple[Any, int]:
    items: list[Any] = []
    pairs: dict[str, Any] = {}
    at = _skip(text, at)
    while at < len(text) and text[at] != close:
        before = at
        if close == "}":
            key, at = _parse(text, at, word, ":,}")
            at = _skip(text, at)
            if at >= len(text) or text[at] != ":":
                raise ConfigError(f"launch argument {word!r}: a mapping needs key:value items")
            value, at = _parse(text, _skip(text, at + 1), word, ",}")
            pairs[str(key)] = value
        else:
            value, at = _parse(text, at, word, ",]")
            items.append(value)
        at = _skip(text, at)
        if at < len(text) and text[at] == ",":
            at = _skip(text, at + 1)
        elif (at < len(text) and text[at] != close) or at == before:
            raise ConfigError(f"launch argument {word!r}: cannot read the value at {text[at:at + 20]!r}")
    if at >= len(text):
        raise ConfigError(f"launch argument {word!r}: missing {close!r}")
    return (pairs if close == "}" else items), at + 1


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t":
        at += 1
    return at


def _scalar(text: str) -> Any:
    lowered = text.lower()
    if lowered == "null":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if _INT.match(text):
        return int(text.replace("_", ""))
    if _FLOAT.match(text):
        return float(text.replace("_", ""))
    return text
