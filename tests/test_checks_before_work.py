"""Every command refuses bad input before it imports torch or transformers (issue 17, deliverable 6).

Each case runs the real CLI in a fresh interpreter in which importing ``torch`` or ``transformers``
raises; a command that checks its input first still exits 2 with its one-line error, one that loads
first fails on the blocked import instead. This is what makes a typo cost well under a second (the
seconds themselves are measured by ``benchmarks/cli_latency.py``, not here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

BLOCK_HEAVY = """
import sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"{name} imported before the input was checked")
sys.meta_path.insert(0, Blocked())
from vlforge.cli import main
sys.argv = ["vlforge", *sys.argv[1:]]
main()
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("early")
    (root / "cut.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    (root / "good.jsonl").write_text(json.dumps({"messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}) + "\n")
    (root / "rows.json").write_text(json.dumps([{"text": "not a chat"}]))
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2_vl", "text_config": {"num_hidden_layers": 2}}))
    (root / "a_file").write_text("not a directory")
    (root / "w.gguf").write_bytes(b"GGUF" + b"\0" * 60)

    def config(name: str, **sections: dict) -> None:
        cfg = {"data": {"dataset_path": "good.jsonl"}, "model": {"load_from_pretrained_path": "tiny:qwen3_vl"},
               "training": {"max_steps": 1}, "checkpointing": {"output_dir": "out"}}
        for section, values in sections.items():
            cfg[section].update(values) if section in cfg else cfg.update({section: values})
        (root / name).write_text(yaml.safe_dump(cfg))

    (root / "reward.py").write_text("def f(completions, **kw):\n    return [0.0 for _ in completions]\n")
    (root / "broken.py").write_text("def f(completions:\n")
    (root / "verl.yaml").write_text("data:\n  prompt_key: [1]\n")
    config("bad_model.yaml", model={"load_from_pretrained_path": "tiny:nope"})
    config("lmms_qwen2.yaml", model={"load_from_pretrained_path": str(model)}, data={"label_mode": "lmms"})
    config("out_under_file.yaml", checkpointing={"output_dir": "a_file/run"})
    config("missing_data.yaml", data={"dataset_path": "gone.jsonl"})
    config("no_chat.yaml", data={"dataset_path": "rows.json"})
    return root


CASES = {
    "profile: unknown preset": (["profile", "--model", "tiny:nope"], "unknown model family 'nope'"),
    "profile: truncated image": (["profile", "--model", "tiny:qwen3_vl", "--image", "cut.png"], "--image cut.png"),
    "profile: trace dir under a file": (["profile", "--model", "tiny:qwen3_vl", "--trace", "a_file/t"], "--trace"),
    "verify: missing model dir": (["verify", "--model", "./gone"], "gone does not exist"),
    "verify: bad dtype": (["verify", "--model", "tiny:qwen3_vl", "--dtype", "int3"], "int3"),
    "extract: missing data": (["extract", "--model", "tiny:qwen3_vl", "--data", "gone.jsonl", "--out", "c"],
                              "--data gone.jsonl"),
    "extract: layer out of range": (["extract", "--model", "model", "--data", "good.jsonl", "--out", "c",
                                     "--features", "hidden_mean", "--layers", "7"], "--layers 7"),
    "extract: model without config": (["extract", "--model", ".", "--data", "good.jsonl", "--out", "c"],
                                      "no config.json"),
    "tokens audit: unknown preset": (["tokens", "audit", "--model", "tiny:nope"], "unknown model family"),
    "tokens audit: missing template": (["tokens", "audit", "--model", "tiny:qwen3_vl", "--template", "g.jinja"],
                                       "--template g.jinja"),
    "tokens scan: a GGUF file": (["tokens", "scan", "--model", "w.gguf"], "w.gguf: a GGUF file"),
    "tokens scan: --top 0": (["tokens", "scan", "--model", "tiny:qwen3_vl", "--top", "0"], "--top 0"),
    "tokens scan: unknown threshold": (["tokens", "scan", "--model", "tiny:qwen3_vl", "--threshold", "x=1"],
                                       "--threshold x"),
    "tokens fix: missing model": (["tokens", "fix", "--model", "./gone", "--out", "fixed"], "gone does not exist"),
    "rl check: unknown engine": (["rl", "check", "--model", "model", "--engine", "vrl", "--format-regex", "x"],
                                 "did you mean 'verl'"),
    "rl check: bad regex": (["rl", "check", "--model", "model", "--format-regex", "(<think>"], "does not compile"),
    "rl check: unloadable reward file": (["rl", "check", "--model", "model", "--reward", "broken.py:f"],
                                         "broken.py:1: not valid Python"),
    "rl check: missing reward function": (["rl", "check", "--model", "model", "--reward", "reward.py:g"],
                                          "no function 'g'"),
    "rl check: bad config key": (["rl", "check", "--engine", "verl", "--config", "verl.yaml", "--model", "model",
                                  "--format-regex", "x"], "data.prompt_key: expected a column"),
    "rl probe: missing prompts": (["rl", "probe", "--model", "model", "--reward", "reward.py:f", "--prompts",
                                   "gone.jsonl"], "--prompts gone.jsonl: not found"),
    "train: missing config": (["train", "nope.yaml"], "nope.yaml"),
    "train: unknown preset": (["train", "bad_model.yaml"], "unknown model family 'nope'"),
    "train: lmms labels on qwen2_vl": (["train", "lmms_qwen2.yaml"], "label_mode"),
    "train: output under a file": (["train", "out_under_file.yaml"], "a_file"),
    "train: missing dataset": (["train", "missing_data.yaml"], "gone.jsonl"),
    "train: no chat record in the data": (["train", "no_chat.yaml"], "rows.json:item 1: no chat record"),
    "extract: no chat record in the data": (["extract", "--model", "tiny:qwen3_vl", "--data", "rows.json", "--out",
                                             "c"], "rows.json:item 1: no chat record"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_refused_before_torch_is_imported(name: str, root: Path) -> None:
    argv, expected = CASES[name]
    proc = subprocess.run([sys.executable, "-c", BLOCK_HEAVY, *argv], cwd=root, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "imported before the input was checked" not in proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], proc.stderr[-2000:]


def test_the_early_check_modules_import_nothing_heavy_and_their_examples_hold() -> None:
    import doctest
    import importlib

    modules = ["vlforge.models.refs", "vlforge.models.input_checks", "vlforge.profile.options", "vlforge.vocab.thresholds",
               "vlforge.verify.options", "vlforge.extract.preflight", "vlforge.config.preflight",
               "vlforge.config.data_check", "vlforge.data.layouts", "vlforge.data.vision_settings", "vlforge.rl.spec", "vlforge.rl.engines",
               "vlforge.rl.configs", "vlforge.rl.stats", "vlforge.rl.prompts", "vlforge.rl.rewards", "vlforge.rl.reading", "vlforge.rl.uses",
               "vlforge.rl.rewrite"]
    probe = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
             + "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
    for name in modules:
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted >= 1, name
