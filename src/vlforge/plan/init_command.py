"""``vlforge init`` as a :class:`~vlforge.command.Job`: a commented starter config for a model and a dataset that
``vlforge validate`` accepts and ``vlforge plan`` says fits the stated GPUs; exit 1 when nothing fits.

The config is written to ``--out`` (a new file, or one an earlier ``vlforge init`` wrote and nobody edited since:
a file of yours is never overwritten) or, without ``--out``, printed on stdout. How it is sized:
:mod:`vlforge.plan.starter`.

Example (CPU, seconds):
    vlforge init --model tiny:qwen3_vl --data examples/data/train.jsonl --gpus 1 --gpu-memory 24GB --out my.yaml
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from vlforge.command import Cli, Job
from vlforge.errors import ConfigError, DataError, ExitCode
from vlforge.flags import Flag
from vlforge.plan.options import check_layout, parse_memory
from vlforge.strict import StrictModel

if TYPE_CHECKING:
    from vlforge.plan.starter import Starter

WRITER = "init"


class InitFlags(StrictModel):
    """``vlforge init --model M --data FILE [--data-folder DIR] [--gpus N] [--nodes N] [--gpu-memory 80GB]
    [--out CONFIG]``."""

    model: Annotated[str, Flag("--model", "-m")]
    """Model to fine-tune: a checkpoint directory, a tiny:/real: preset or a hub id already in the cache."""
    data: Path
    """Training data: a .jsonl/.json/.parquet/.arrow file of chat records (docs/data.md), a directory or quoted glob
    pattern of such files (data/train-*.parquet), or a dataset YAML."""
    gpus: int = 1
    """GPUs (processes) per node the config must fit."""
    nodes: int = 1
    """Nodes."""
    gpu_memory: str | None = None
    """Memory of one GPU, e.g. 80GB or 24GiB (default: this machine's CUDA device, else 80GB)."""
    data_folder: Path | None = None
    """Folder the records' relative media paths start from (default: the data file's own; LLaVA's JSON beside
    a coco/ folder elsewhere). Not with a dataset YAML: its entries name their own."""
    out: Path | None = None
    """Write the config here (a new file, or one vlforge init wrote); default: print it on stdout."""
    sample: int = Field(64, ge=1)
    """Records sampled from the data to measure lengths and media."""


@dataclass(frozen=True)
class InitRun:
    flags: InitFlags
    gpu_memory: int | None
    as_json: bool


def from_flags(flags: InitFlags, as_json: bool) -> InitRun:
    return InitRun(flags, parse_memory(flags.gpu_memory) if flags.gpu_memory is not None else None, as_json)


def check(run: InitRun) -> None:
    """Sizes, the output path, the data file and the model reference, before torch is imported."""
    from vlforge.data.config import DATA_SUFFIXES, DATASET_LIST_SUFFIXES, names_shards, shard_files
    from vlforge.models.refs import check_model_ref
    from vlforge.outputs import check_output_file

    flags = run.flags
    check_layout(flags.gpus, flags.nodes)
    if flags.out is not None:
        check_output_file(flags.out, flag="--out")
    data = flags.data
    if flags.data_folder is not None:
        if data.suffix.lower() in DATASET_LIST_SUFFIXES:
            raise ConfigError(f"--data-folder: {data} is a dataset YAML; its entries name their own data_folder")
        if not flags.data_folder.is_dir():
            raise ConfigError(f"--data-folder {flags.data_folder}: not a directory")
    if names_shards(data, str(data)):  # a directory or pattern of shards: the data files it names
        try:
            shard_files(Path(), str(data))
        except DataError as error:
            raise ConfigError(f"--data {error}") from None
        check_model_ref(flags.model)
        return
    if not data.exists():
        raise ConfigError(f"--data {data}: file not found")
    if not data.is_file():
        raise ConfigError(f"--data {data}: not a file or directory")
    suffix = data.suffix.lower()
    if suffix not in DATA_SUFFIXES and suffix not in DATASET_LIST_SUFFIXES:
        known = ", ".join(sorted({*DATA_SUFFIXES, *DATASET_LIST_SUFFIXES}))
        raise ConfigError(f"--data {data}: cannot tell the format from the suffix {suffix or '(none)'!r}; "
                          f"use one of {known}")
    check_model_ref(flags.model)


def init(run: InitRun) -> Starter:
    from vlforge.config.validate import check as validate
    from vlforge.outputs import atomic_write_text
    from vlforge.plan.starter import make_starter, output_dir_for

    flags = run.flags
    name = str(flags.out) if flags.out is not None else "CONFIG"
    starter = make_starter(flags.model, str(flags.data), gpus=flags.gpus, nodes=flags.nodes,
                           gpu_memory=run.gpu_memory, gpu_memory_text=flags.gpu_memory, sample=flags.sample,
                           output_dir=output_dir_for(flags.out, str(flags.data)), config_name=name,
                           data_folder=str(flags.data_folder) if flags.data_folder is not None else None)
    with tempfile.TemporaryDirectory(prefix="vlforge-init-") as tmp:  # what vlforge validate will say of it
        probe = Path(tmp) / "config.yaml"
        probe.write_text(starter.text, encoding="utf-8")
        report = validate(probe)
    if not report.ok:
        raise ConfigError("the starter config does not validate: " + "; ".join(report.error_lines()))
    if flags.out is not None:
        atomic_write_text(flags.out, starter.text, writer=WRITER)
    return starter


def _summary(run: InitRun, starter: Starter) -> list[str]:
    from vlforge.memory.verdict import human
    from vlforge.plan.starter import unusable_line

    survey, flags = starter.survey, run.flags
    lines = [f"init: {survey.usable} of {survey.sampled} sampled records usable ({survey.records:,} in the data); "
             f"{min(survey.lengths)} to {survey.longest} tokens, median {survey.median}"]
    if survey.skipped:
        lines.append(f"init: warning: {unusable_line(survey)}")
    word = "fits" if starter.fits else "does NOT fit"
    lines.append(f"init: {human(starter.peak)} peak per rank ({human(starter.data_peak)} with this data's lengths); "
                 f"{word} in {human(starter.budget)} usable of {human(starter.device_bytes)} ({starter.device_note})")
    for step in starter.steps:
        lines.append(f"init: chose {step.change} ({step.why}; {human(step.peak_before)} before)")
    if not starter.fits:
        lines.append("init: nothing vlforge can change fits; the config holds the closest setting"
                     + (f"; vlforge plan suggests: {'; '.join(starter.suggestions)}" if starter.suggestions else ""))
    if flags.out is not None:
        lines += [f"wrote {flags.out}; next:", f"  vlforge validate {flags.out}", f"  {starter.plan_command}",
                  f"  vlforge train {flags.out}"]
    return lines


def render(run: InitRun, starter: Starter, console: Any) -> None:
    """With ``--out``: the summary; without: the config on stdout and the summary on stderr."""
    lines = _summary(run, starter)
    if run.flags.out is None:
        console.file.write(starter.text)
        console.file.flush()
        for line in lines:
            sys.stderr.write(line + "\n")
        return
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def to_json(starter: Starter) -> str:
    return json.dumps({**starter.to_dict(), "text": starter.text}, indent=2)


JOB: Job[InitRun, Starter] = Job(check=check, run=init, render=render, to_json=to_json,
                                  exit_code=lambda starter: ExitCode.OK if starter.fits and not starter.survey.skipped
                                  else ExitCode.WARNING)
CLI = Cli(flags=InitFlags, job=JOB, to_options=from_flags)
