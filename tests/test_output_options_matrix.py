"""Every output option of every command, given a path it cannot use: a one-line OutputError (exit 2 from the
CLI, see tests/test_user_files_survive.py for the subprocess form) naming the option and the path, nothing
created, and before any model loads (the model given does not exist, so an error that names the output
proves the output was checked first). In-process through typer's runner: 27 cases in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from vlforge.cli import app
from vlforge.errors import OutputError

REPO = Path(__file__).resolve().parents[1]
DATASET = REPO / "examples" / "data" / "dataset.yaml"
MISSING = "/nonexistent/model-dir"
UNWRITABLE = "/proc/vlforge-no-such-dir/out"  # /proc refuses new entries, even to root


def _train_config(tmp: Path, output_dir: str) -> str:
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump({
        "data": {"dataset_path": str(DATASET)}, "model": {"load_from_pretrained_path": MISSING},
        "training": {"max_steps": 1}, "checkpointing": {"output_dir": output_dir}}))
    return str(path)


def _checkpoint(tmp: Path) -> str:
    ckpt = tmp / "checkpoint-1"
    ckpt.mkdir(exist_ok=True)
    (ckpt / "trainer_state.json").write_text(f'{{"model_path": "{MISSING}"}}')
    return str(ckpt)


#: (name, option named in the error, kind of output, argv builder taking (tmp, output path))
COMMANDS = [
    ("tiny", "OUT_DIR", "dir", lambda tmp, out: ["tiny", "qwen3_vl", out]),
    ("train", "output_dir", "dir", lambda tmp, out: ["train", _train_config(tmp, out)]),
    ("export", "export directory", "dir", lambda tmp, out: ["export", _checkpoint(tmp), out]),
    ("extract", "--out", "dir", lambda tmp, out: ["extract", "--model", MISSING, "--data", str(DATASET),
                                                  "--out", out]),
    ("tokens fix", "--out", "dir", lambda tmp, out: ["tokens", "fix", "--model", "tiny:qwen3_vl", "--out", out,
                                                     "--ids", "151667"]),
    ("tokens fix rows", "--trainable-rows", "file",
     lambda tmp, out: ["tokens", "fix", "--model", "tiny:qwen3_vl", "--out", str(tmp / "new"), "--ids", "151667",
                       "--trainable-rows", out]),
    ("tokens audit", "--rewrite-out", "file",
     lambda tmp, out: ["tokens", "audit", "--model", "tiny:qwen3_vl", "--format", "r1", "--rewrite-out", out]),
    ("rl check", "--rewrite-out", "dir",
     lambda tmp, out: ["rl", "check", "--model", "tiny:qwen3_vl", "--format-regex", "<think>", "--rewrite-out", out]),
    ("profile trace", "--trace", "dir", lambda tmp, out: ["profile", "--model", MISSING, "--trace", out]),
    ("profile plot", "--plot", "file", lambda tmp, out: ["profile", "--model", MISSING, "--plot", out]),
    ("init", "--out", "file", lambda tmp, out: ["init", "--model", MISSING, "--data", str(DATASET), "--out", out]),
]

#: (case, how to make the bad path, words the error must hold)
CASES = [
    ("under a file", lambda tmp: str(tmp / "a_file" / "sub" / "out"), "is a file, not a directory"),
    ("unwritable", lambda tmp: UNWRITABLE, "cannot write"),
    ("wrong type", None, None),  # a file where a directory goes, a directory where a file goes
]


@pytest.mark.parametrize("case", [c[0] for c in CASES])
@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_bad_output_path_is_one_line_before_work(tmp_path: Path, command, case: str) -> None:
    _name, option, kind, argv = command
    (tmp_path / "a_file").write_text("user data")
    if case == "wrong type":
        if kind == "dir":
            out, words = str(tmp_path / "a_file"), "exists and is not a directory"
        else:
            (tmp_path / "a_dir").mkdir()
            out, words = str(tmp_path / "a_dir"), "is a directory"
    else:
        _, make, words = next(c for c in CASES if c[0] == case)
        out = make(tmp_path)
    args = argv(tmp_path, out)
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    result = CliRunner().invoke(app, args)
    error = result.exception
    assert isinstance(error, OutputError), (result.exception, result.output[-2000:])
    message = str(error)
    assert "\n" not in message and option in message and words in message, message
    assert out in message or str(Path(out).absolute()) in message, message
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "a_file").read_text() == "user data"
