"""Before anything loads: does every data file and media folder a training config names exist, and do its records
read as chat records?

``vlforge validate`` reports these as problems (exit 2) and ``vlforge train`` stops on them before the
model loads, instead of failing at the first batch. Paths are resolved as the data pipeline resolves
them: relative to the working directory, entries of a dataset YAML relative to that YAML. Each file's record
layout is decided here as the pipeline decides it (:func:`vlforge.data.layouts.file_format`); a file with no chat
record at its start is a problem. ``vlforge validate`` also reads the first :data:`CHECK_RECORDS` records of every
file (:func:`record_checks`): their layout, their media references (files that exist, no remote URL, no
escape from ``data_folder``; nothing is decoded) and each item's own options (``max_frames``, ``min_pixels``; under
the family's defaults and the config's keys, the checkpoint's pixel ceilings left to training), counted per reason
as training counts skipped samples.

Example:
    >>> from vlforge.config.schema import TrainConfig
    >>> cfg = TrainConfig(data={"datasets": [{"path": "/nonexistent/a.jsonl"}]},
    ...                   model={"load_from_pretrained_path": "tiny:qwen3_vl"})
    >>> [str(p) for p in data_file_problems(cfg, "run.yaml")]
    ['run.yaml: data.datasets.0.path: /nonexistent/a.jsonl: file not found']
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlforge.config.problems import Problem
from vlforge.config.schema import TrainConfig
from vlforge.data.config import ResolvedEntry
from vlforge.errors import ConfigError, DataError

if TYPE_CHECKING:
    from vlforge.data.errors import SkipLedger
    from vlforge.data.layouts import RecordFormat
    from vlforge.data.sources import Source
    from vlforge.data.vision_settings import VisionSettings

CHECK_RECORDS = 1000
"""Records ``vlforge validate`` reads from the start of each data file (of a directory or pattern entry: shared by
its files, at least :data:`SHARD_RECORDS` each)."""
SHARD_RECORDS = 20
"""The fewest records ``vlforge validate`` reads from each file of a directory or pattern entry."""
_NO_CEILING = 2**62
"""A pixel ceiling no item reaches: the checkpoint's own is unknown before it loads."""
SHOWN_FAILURES = 5
"""Failing records ``vlforge validate`` shows per data file."""


def path_problem(path: Path, kind: str) -> str | None:
    """What is wrong with ``path`` as a ``kind`` ("file" or "folder"), or None.

    Example:
        >>> path_problem(Path("/"), "file")
        '/: is a directory, not a data file'
    """
    if not path.exists():
        return f"{path}: {'file' if kind == 'file' else 'media folder'} not found"
    if kind == "file" and path.is_dir():
        return f"{path}: is a directory, not a data file"
    if kind == "folder" and not path.is_dir():
        return f"{path}: is a file, not a media folder"
    return None


@dataclass(frozen=True)
class NamedEntry:
    """A data file of the config that exists, and where the config names it (for problems)."""

    origin: str
    key: str
    entry: ResolvedEntry
    shown: str  # the path as the config names it (relative to the working directory or its dataset YAML)
    set_key: str  # the config key of the set it belongs to: data.dataset_path / data.datasets or data.eval_dataset_path


def _entries(cfg: TrainConfig, origin: str, base: Path) -> tuple[list[NamedEntry], list[Problem]]:
    """Every data file the config names (training and eval sets) whose file and media folder exist, and one
    :class:`Problem` per missing or mistyped data file, dataset YAML or media folder."""
    from vlforge.config.data import data_config
    from vlforge.data.config import (
        DatasetEntry,
        names_shards,
        read_dataset_yaml,
        resolve_entry,
        resolve_entry_files,
    )

    problems: list[Problem] = []
    found: list[NamedEntry] = []
    sets = [("data", data_config(cfg))]
    if cfg.data.eval_dataset_path is not None:
        sets.append(("eval", data_config(cfg, eval_set=True)))
    for which, config in sets:
        key = "data.eval_dataset_path" if which == "eval" else "data.dataset_path"
        set_key = "data.datasets" if which == "data" and cfg.data.datasets is not None else key
        entries, entry_base, entry_origin, entry_key = config.datasets, base, origin, "data.datasets"
        if isinstance(entries, str):  # a dataset YAML: its entries are relative to it
            yaml_path = base / entries
            problem = path_problem(yaml_path, "file")
            if problem:
                problems.append(Problem(origin, None, key, problem))
                continue
            try:
                entries = read_dataset_yaml(yaml_path)
            except ConfigError as error:
                problems.append(Problem(origin, None, key, str(error)))
                continue
            entry_base, entry_origin, entry_key = yaml_path.parent, str(yaml_path), "datasets"
        elif which == "eval" or cfg.data.datasets is None:  # a single data file given as dataset_path
            entry_key = key
        for index, raw in enumerate(entries):
            entry = raw if isinstance(raw, DatasetEntry) else DatasetEntry.model_validate(raw)
            where = entry_key if entry_key == key else f"{entry_key}.{index}"
            path_key = where if where == key else f"{where}.path"
            resolved: list[ResolvedEntry] = []
            if names_shards(entry_base / entry.path, entry.path):  # a directory or pattern: its data files
                try:
                    resolved = resolve_entry_files(entry, entry_base, index)
                    problem = None
                except DataError as error:
                    problem = str(error)
            else:
                problem = path_problem(entry_base / entry.path, "file")
            if problem:
                problems.append(Problem(entry_origin, None, path_key, problem))
            folder_problem = path_problem(entry_base / entry.data_folder, "folder") if entry.data_folder else None
            if folder_problem:
                problems.append(Problem(entry_origin, None, f"{where}.data_folder", folder_problem))
            if not problem and not folder_problem:
                for one in resolved or [resolve_entry(entry, entry_base)]:
                    shown = str(entry_base / entry.path) if not resolved else str(one.path)
                    found.append(NamedEntry(entry_origin, path_key, one, shown, set_key))
    return found, problems


def data_file_problems(cfg: TrainConfig, origin: str, base_dir: str | Path = ".") -> list[Problem]:
    """One :class:`Problem` per missing or mistyped data file, dataset YAML or media folder of ``cfg``, and per
    data file whose start holds no chat record in its layout (the record and what was expected)."""
    from vlforge.data.layouts import EMPTY_FILE, file_format

    found, problems = _entries(cfg, origin, Path(base_dir))
    empty: dict[str, list[str]] = {}
    records: set[str] = set()
    for named in found:
        try:
            fmt = file_format(named.entry)
        except DataError as error:
            problems.append(Problem(named.origin, None, named.key, str(error)))
            records.add(named.set_key)
            continue
        if fmt.origin == EMPTY_FILE:
            empty.setdefault(named.set_key, []).append(named.shown)
        else:
            records.add(named.set_key)
    for set_key, paths in empty.items():  # training would stop at its first batch; one empty file of several reads
        if set_key not in records:
            problems.append(Problem(origin, None, set_key, f"the datasets hold no records: {', '.join(paths)}"))
    return problems


@dataclass
class RecordCheck:
    """The first records of one data file as ``vlforge validate`` read them."""

    path: str
    layout: dict[str, Any] | None  # RecordFormat.to_dict(), None when the file's layout cannot be decided
    describe: str
    records: int  # in the file (metadata or a byte scan)
    read: int
    skipped: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)  # the first failing records, ``FILE:line N: reason: detail``
    warnings: list[str] = field(default_factory=list)  # what the data pipeline warned of while reading them

    @property
    def failed(self) -> int:
        return sum(self.skipped.values())

    def line(self) -> str:
        """``PATH: LAYOUT; READ of N records read, F fail`` (``PATH: unreadable: WHY`` when no record was read).

        Example:
            >>> RecordCheck("d.json", None, "unreadable: invalid JSON file", 0, 0).line()
            'd.json: unreadable: invalid JSON file'
        """
        if self.layout is None:
            return f"{self.path}: {self.describe}"
        fails = f", {self.failed} fail ({', '.join(f'{k}={v}' for k, v in sorted(self.skipped.items()))})" \
            if self.failed else ", none fails"
        return f"{self.path}: {self.describe}; {self.read} of {self.records} records read{fails}"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "layout": self.layout, "records": self.records, "read": self.read,
                "failed": self.failed, "skipped": dict(sorted(self.skipped.items())), "examples": list(self.examples),
                "warnings": list(self.warnings)}


@contextmanager
def _warnings_logged(name: str) -> Iterator[list[str]]:
    """The messages of the warnings logged under ``name`` inside the block (they are logged as well)."""
    caught: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(record.getMessage())

    handler, logger = Keep(logging.WARNING), logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield caught
    finally:
        logger.removeHandler(handler)


def _run_settings(cfg: TrainConfig) -> VisionSettings | None:
    """The run's vision settings as far as its config tells: the family's defaults under the config's pixel and
    frame keys, with no pixel ceiling where the config sets none (training starts from the checkpoint's image
    processor, whose ceilings may be higher than the family's: Qwen2.5-VL's ship 12,845,056). None when the family is
    unknown or the config's keys do not hold (the config checks name those)."""
    from pydantic import ValidationError

    from vlforge.config.data import data_config
    from vlforge.config.preflight import run_family
    from vlforge.data.vision_settings import VisionSettings

    family = run_family(cfg)
    try:
        open_ceilings = {"max_pixels": _NO_CEILING, "video_max_pixels": _NO_CEILING}
        return VisionSettings.for_family(family, **{**open_ceilings, **data_config(cfg).vision_overrides()}) \
            if family else None
    except ValidationError:
        return None


def _read_head(source: Source, count: int, fmt: RecordFormat, entry: ResolvedEntry, settings: VisionSettings | None,
               escape: bool) -> tuple[SkipLedger, list[str]]:
    """The first ``count`` records of ``source`` read as training reads them (nothing decoded): the ledger of their
    failures and the first :data:`SHOWN_FAILURES` failures' lines."""
    from vlforge.data.errors import SampleError, SkipLedger
    from vlforge.data.media import FrameFiles, resolve_item
    from vlforge.data.schema import parse_conversation
    from vlforge.data.vision_settings import item_settings

    ledger, examples = SkipLedger(), []
    for raw in source.head(count):
        ledger.seen += 1
        try:
            if raw.error is not None:
                raise raw.error
            conv = parse_conversation(raw.record, raw.source, raw.location, fmt)
            for part in conv.media:
                found = resolve_item(part.kind, part.ref, part.options, entry.data_folder, source=raw.source,
                                     location=raw.location, allow_path_escape=escape)
                for i in range(len(found) if isinstance(found, FrameFiles) else 0):
                    found.frame(i)  # every frame of a frame list exists (training reads those it keeps)
                if settings is not None and part.options:
                    item_settings(settings, part.options, part.kind, source=raw.source, location=raw.location)
        except SampleError as error:
            ledger.record(error)
            if len(examples) < SHOWN_FAILURES:
                examples.append(str(error))
    return ledger, examples


def record_checks(cfg: TrainConfig, origin: str, base_dir: str | Path = ".", limit: int = CHECK_RECORDS
                  ) -> tuple[list[RecordCheck], list[Problem]]:
    """Read the first ``limit`` records of every data file as training reads them (layout, turns, media references;
    nothing decoded); the files of one directory or pattern entry share ``limit``, at least :data:`SHARD_RECORDS`
    each. Problems: a failing record when ``data.on_error`` is ``raise`` (training would stop at it), or
    more failing records than ``data.max_skip_fraction`` allows when it is ``skip``."""
    from vlforge.data.errors import limit_error, over_limit
    from vlforge.data.layouts import file_format
    from vlforge.data.sources import open_source

    found, _ = _entries(cfg, origin, Path(base_dir))
    settings = _run_settings(cfg)
    checks: list[RecordCheck] = []
    problems: list[Problem] = []
    escape = cfg.data.allow_path_escape
    files = Counter((named.origin, named.key) for named in found)  # an entry naming a directory: its shards
    for named in found:
        entry = named.entry
        per_file = max(min(limit, SHARD_RECORDS), limit // files[named.origin, named.key])
        try:
            fmt = file_format(entry)
            source = open_source(entry.path, entry.data_type)
            total = source.records()
        except DataError as error:  # an unreadable file (a JSON array that does not parse to its end, ...)
            checks.append(RecordCheck(named.shown, None, f"unreadable: {error}", 0, 0))
            problems.append(Problem(named.origin, None, named.key, str(error)))
            continue
        with _warnings_logged("vlforge.data") as warned:
            try:
                ledger, examples = _read_head(source, per_file, fmt, entry, settings, escape)
            finally:
                source.close()
        checks.append(RecordCheck(named.shown, fmt.to_dict(), fmt.describe(), total, ledger.seen,
                                  dict(ledger.counts), examples, warned))
        if not ledger.total:
            continue
        if cfg.data.on_error == "raise":
            problems.append(Problem(named.origin, None, named.key, f"{examples[0]} (data.on_error: raise stops "
                                    f"training at the first such record; {ledger.total} of the first {ledger.seen} "
                                    "fail)"))
        elif over_limit(ledger.seen, ledger.total, cfg.data.max_skip_fraction, final=True):
            error = limit_error(ledger, cfg.data.max_skip_fraction, what=f"the first {ledger.seen} records",
                                key="data.max_skip_fraction", report=None)
            problems.append(Problem(named.origin, None, named.key, str(error)))
    return checks, problems

