"""Every check of ``vlforge extract`` that needs no model and no torch: output, data, layers, model reference.

Run before anything heavy is imported, so a wrong ``--data``, ``--out``, ``--layers`` or ``--model`` is
one line and exit 2 in well under a second; ``run_extract`` runs the same checks.

Example:
    >>> from vlforge.extract.options import ExtractOptions
    >>> cfg, base = data_config("examples/data/train.jsonl", on_error="skip")
    >>> cfg.epochs, cfg.on_error
    (1, 'skip')
    >>> check_layers([0, -1], 13)
    >>> check_layers([13], 13)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    vlforge.errors.ConfigError: --layers 13: the model has 13 hidden states (0 = embeddings .. 12 = last)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from vlforge.config.data_check import path_problem
from vlforge.data.config import (
    COMPRESSED_SUFFIXES,
    DATA_SUFFIXES,
    DataConfig,
    ResolvedEntry,
    load_config,
    names_shards,
    resolve_entries,
    shard_files,
    unknown_suffix,
)
from vlforge.errors import ConfigError, DataError
from vlforge.models.families import names, supports
from vlforge.models.refs import check_model_ref, local_checkpoint, text_setting
from vlforge.outputs import check_output_dir

if TYPE_CHECKING:
    from vlforge.extract.options import ExtractOptions


def preflight(opts: ExtractOptions) -> tuple[Path, DataConfig, Path, list[ResolvedEntry]]:
    """All checks before work: ``(cache root, data config, its base dir, resolved entries)``, or one-line errors."""
    from vlforge.extract import manifest
    from vlforge.models.presets import PRESET_PREFIX, REAL_PREFIX

    root = check_output_dir(opts.out, flag="--out", mode="into")
    manifest.check_target(root)
    if not opts.overwrite:
        manifest.check_options(root, opts.cache_options())  # the rest of the cache's key needs the model
    cfg, base = data_config(opts.data, on_error=opts.on_error)
    entries = resolve_entries(cfg, base)
    check_entries(entries)
    check_model_ref(opts.model)
    if not str(opts.model).startswith((PRESET_PREFIX, REAL_PREFIX)) and (local := local_checkpoint(str(opts.model))) is not None:
        check_against_config(local / "config.json", opts)  # a preset or hub id: checked once resolved
    return root, cfg, base, entries


def data_config(data: str | Path, *, on_error: str) -> tuple[DataConfig, Path]:
    """A :class:`DataConfig` and its ``base_dir`` for ``--data``: a dataset file, dataset YAML or data config YAML.

    A YAML mapping with keys besides ``datasets`` is a data config (``vlforge.data.load_config``);
    otherwise it is an LMMS-style dataset list. ``on_error`` overrides the config's policy.
    """
    path = Path(data)
    shards = names_shards(path)
    problem = None if shards else path_problem(path, "file")
    if problem:
        raise ConfigError(f"--data {problem}")
    if shards:  # a directory or pattern of shards: one dataset entry, its files
        try:
            shard_files(Path("."), str(path))
        except DataError as error:
            raise ConfigError(f"--data {error}") from None
        cfg, base = DataConfig(datasets=[{"path": str(path)}]), Path(".")
    elif path.suffix.lower() in (".yaml", ".yml"):
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None
        if isinstance(raw, dict) and set(raw) - {"datasets"}:
            cfg = load_config(path)
        else:
            cfg = DataConfig(datasets=path.name)
        base = path.parent
    elif path.suffix.lower() in DATA_SUFFIXES:
        cfg, base = DataConfig(datasets=[{"path": os.path.abspath(path)}]), Path(".")
    elif path.suffix.lower() in COMPRESSED_SUFFIXES:
        raise ConfigError(f"--data {path}: {unknown_suffix(path)}")
    else:
        raise ConfigError(f"--data {path}: expected a .jsonl/.json/.parquet/.arrow dataset, a directory or glob "
                          "pattern of them, or a .yaml config")
    if cfg.epochs is None:
        raise ConfigError(f"{path}: epochs: null (repeat forever) cannot be extracted; use epochs: 1")
    # extract skips what it cannot use (--on-error skip): an over-long sample too, unless the file says otherwise
    drop_overlong = cfg.filter_overlong or ("filter_overlong" not in cfg.model_fields_set and on_error == "skip")
    return cfg.model_copy(update={"on_error": on_error, "epochs": 1, "error_report": None,
                                  "filter_overlong": drop_overlong}), base


def check_entries(entries: list[ResolvedEntry]) -> None:
    """Every data file and media folder of ``entries`` exists and every file's start holds a chat record in its
    layout (one-line ConfigError naming the first that does not)."""
    from vlforge.data.layouts import file_format

    for entry in entries:
        problem = path_problem(entry.path, "file") or path_problem(entry.data_folder, "folder")
        if problem:
            raise ConfigError(f"--data: {problem}")
        try:
            file_format(entry)
        except DataError as error:
            raise ConfigError(f"--data: {error}") from None


def check_against_config(config_path: Path, options: ExtractOptions) -> None:
    """``--layers`` and ``--features`` checked against the checkpoint's ``config.json``, before it loads.

    The same rules as :class:`FeatureExtractor` applies to the loaded model, read from the file alone.
    """
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{config_path}: cannot read the model config: {error}") from None
    family = str(config.get("model_type", ""))
    if "deepstack" in options.features and family and not supports(family, "deepstack"):
        raise ConfigError(f"--features deepstack: {family} has no deepstack features "
                          f"(only {', '.join(names(deepstack=True))})")
    layers = text_setting(config, "num_hidden_layers")
    if not isinstance(layers, int):
        return  # an unusual layout: the loaded model is checked by FeatureExtractor
    check_layers(options.layers, layers + 1)


def check_layers(layers: list[int], num_hidden: int) -> None:
    """Every index in ``layers`` addresses one of ``num_hidden`` hidden states (negative from the end)."""
    for layer in layers:
        if not -num_hidden <= layer < num_hidden:
            raise ConfigError(f"--layers {layer}: the model has {num_hidden} hidden states "
                              f"(0 = embeddings .. {num_hidden - 1} = last)")
