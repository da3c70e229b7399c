"""Session fixtures of the rl tests: the stand-in base model (tests/rl/fixture.py), its prompts, a tiny checkpoint
whose ``<think>`` is a special token, and verl's own files from its peer venv (``scripts/peer_env.py``)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from .fixture import ANSWERS, QUESTIONS, build_base, write_prompts

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def base(tiny_checkpoint, tmp_path_factory) -> Path:
    return build_base(tiny_checkpoint("qwen3_vl"), tmp_path_factory.mktemp("rl-base") / "base")


@pytest.fixture(scope="session")
def prompts(tmp_path_factory) -> Path:
    return write_prompts(tmp_path_factory.mktemp("rl-prompts") / "prompts.jsonl")


@pytest.fixture(scope="session")
def verl_parquet(tmp_path_factory) -> Path:
    """The fixture prompts in verl's layout (its examples/data_preprocess scripts write these columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": "hiyouga/geometry3k", "prompt": [{"role": "user", "content": q}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": a}, "extra_info": {"index": i}}
            for i, (q, a) in enumerate(zip(QUESTIONS, ANSWERS, strict=True))]
    path = tmp_path_factory.mktemp("rl-verl") / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="session")
def special_think(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny checkpoint with ``<think>`` / ``</think>`` registered as special tokens (as a tokenizer that
    added them with ``add_special_tokens`` has them)."""
    src = tiny_checkpoint("qwen3_vl")
    dst = tmp_path_factory.mktemp("rl-special") / "ckpt"
    shutil.copytree(src, dst)
    data = json.loads((dst / "tokenizer.json").read_text())
    for entry in data["added_tokens"]:
        if entry["content"] in ("<think>", "</think>"):
            entry["special"] = True
    (dst / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    for entry in (cfg.get("added_tokens_decoder") or {}).values():
        if entry["content"] in ("<think>", "</think>"):
            entry["special"] = True
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=1))
    return dst


@pytest.fixture(scope="session")
def verl_site() -> Path:
    """site-packages of the verl peer venv (verl 0.9.1 --no-deps, mathruler), or a skip naming the script."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import peer_env
    finally:
        sys.path.pop(0)
    python = peer_env.peer_python(peer="verl")
    if python is None:
        pytest.skip("verl's peer venv is not built: python3 scripts/peer_env.py build --peer verl")
    why = peer_env.stale(peer_env.peer_record(peer="verl"), peer="verl")
    if why is not None:
        pytest.skip(f"verl's peer venv is out of date ({why}): python3 scripts/peer_env.py build --peer verl")
    found = sorted(python.parent.parent.glob("lib/python3*/site-packages"))
    assert found and (found[0] / "verl" / "utils" / "reward_score" / "geo3k.py").is_file()
    return found[0]


@pytest.fixture(scope="session")
def r1_template(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny chat template with an R1-style generation prompt that pre-fills ``<think>\\n``."""
    text = (tiny_checkpoint("qwen3_vl") / "chat_template.jinja").read_text()
    old = "{{- '<|im_start|>assistant\\n' -}}"
    assert old in text
    path = tmp_path_factory.mktemp("rl-template") / "r1.jinja"
    path.write_text(text.replace(old, "{{- '<|im_start|>assistant\\n<think>\\n' -}}"))
    return path


def trl_reward_file(name: str) -> Path:
    """A reward function's file inside the installed TRL package (its own code, not a copy)."""
    import inspect

    import trl.rewards

    return Path(inspect.getsourcefile(getattr(trl.rewards, name)))


def invoke(*argv: str):
    """``vlforge ARGV`` in this process: (exit code, stdout, stderr)."""
    from typer.testing import CliRunner

    from vlforge.cli import app
    from vlforge.errors import VlforgeError

    result = CliRunner().invoke(app, [str(a) for a in argv])
    if isinstance(result.exception, VlforgeError):  # vlforge.cli.main prints these as one line, exit 2
        return result.exception.exit_code, result.stdout, f"error: {result.exception}\n"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="session")
def rewritten_trl(base, tmp_path_factory) -> tuple[int, dict, Path]:
    """``rl check --json --rewrite-out`` on the stand-in base with TRL's own ``think_format_reward``."""
    out = tmp_path_factory.mktemp("rl-rewrite") / "fixed"
    code, stdout, _ = invoke("rl", "check", "--model", base, "--engine", "trl", "--reward",
                             f"{trl_reward_file('think_format_reward')}:think_format_reward", "--rewrite-out", out,
                             "--json")
    return code, json.loads(stdout), out
