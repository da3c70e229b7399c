"""Before anything loads: does every data file and media folder a training config names exist?

``vlforge validate`` reports these as problems (exit 2) and ``vlforge train`` stops on them before the
model loads, instead of failing at the first batch. Paths are resolved as the data pipeline resolves
them: relative to the working directory, entries of a dataset YAML relative to that YAML.

Example:
    >>> from vlforge.config.schema import TrainConfig
    >>> cfg = TrainConfig(data={"datasets": [{"path": "/nonexistent/a.jsonl"}]},
    ...                   model={"load_from_pretrained_path": "tiny:qwen3_vl"})
    >>> [str(p) for p in data_file_problems(cfg, "run.yaml")]
    ['run.yaml: data.datasets.0.path: /nonexistent/a.jsonl: file not found']
"""

from __future__ import annotations

from pathlib import Path

from vlforge.config.problems import Problem
from vlforge.config.schema import TrainConfig
from vlforge.errors import ConfigError


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


def data_file_problems(cfg: TrainConfig, origin: str, base_dir: str | Path = ".") -> list[Problem]:
    """One :class:`Problem` per missing or mistyped data file, dataset YAML or media folder of ``cfg``."""
    from vlforge.config.data import data_config
    from vlforge.data.config import read_dataset_yaml

    problems: list[Problem] = []
    base = Path(base_dir)
    sets = [("data", data_config(cfg))]
    if cfg.data.eval_dataset_path is not None:
        sets.append(("eval", data_config(cfg, eval_set=True)))
    for which, config in sets:
        key = "data.eval_dataset_path" if which == "eval" else "data.dataset_path"
        entries, entry_base, entry_origin, entry_key = config.datasets, base, origin, "data.datasets"
        if isinstance(entries, str):  # a dataset YAML: its entries are relative to it
            yaml_path = base / entries
            problem = path_problem(yaml_path, "file")
            if problem:
                problems.append(Problem(origin, None, key, problem))
                continue
            try:
                entries = [entry.model_dump() for entry in read_dataset_yaml(yaml_path)]
            except ConfigError as error:
                problems.append(Problem(origin, None, key, str(error)))
                continue
            entry_base, entry_origin, entry_key = yaml_path.parent, str(yaml_path), "datasets"
        elif which == "eval" or cfg.data.datasets is None:  # a single data file given as dataset_path
            entry_key = key
        for index, raw in enumerate(entries):
            entry = raw if isinstance(raw, dict) else raw.model_dump()
            where = entry_key if entry_key == key else f"{entry_key}.{index}"
            path = entry_base / entry["path"]
            problem = path_problem(path, "file")
            if problem:
                problems.append(Problem(entry_origin, None, where if where == key else f"{where}.path", problem))
            if entry.get("data_folder"):
                problem = path_problem(entry_base / entry["data_folder"], "folder")
                if problem:
                    problems.append(Problem(entry_origin, None, f"{where}.data_folder", problem))
    return problems
