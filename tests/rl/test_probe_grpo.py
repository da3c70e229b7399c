"""``vlforge rl probe`` and a real TRL ``GRPOTrainer`` on the stand-in base (tests/rl/fixture.py): with TRL's own
``think_format_reward`` (the untrained ``<think>``) the probe finds no spread and a GRPO step changes no weight;
with the reward ``rl check --rewrite-out`` wrote (``<thinking>``) the probe finds spread and the step changes
weights; the PreflightCallback stops the dead run before its first step."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from .conftest import invoke, trl_reward_file

PROBE = ["--samples", "4", "--max-prompts", "4", "--max-new-tokens", "20", "--seed", "0"]


def _load(path, name):
    spec = importlib.util.spec_from_file_location(f"rl_test_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def test_probe_dead_then_spread_after_the_rewrite(base, prompts, rewritten_trl) -> None:
    own = f"{trl_reward_file('think_format_reward')}:think_format_reward"
    code, stdout, stderr = invoke("rl", "probe", "--model", base, "--prompts", prompts, "--reward", own, *PROBE, "--json")
    dead = json.loads(stdout)
    assert code == 3 and dead["verdict"] == "dead" and dead["zero_spread_share"] == 1.0
    assert all(r == 0.0 for g in dead["groups"] for r in g["rewards"]) and len(dead["groups"]) == 4
    assert [t["as_ids"] for t in dead["tags"]] == [0, 0] and "error: no group" in stderr
    fixed = f"{rewritten_trl[2] / 'format_rewards.py'}:think_format_reward"
    code, stdout, _ = invoke("rl", "probe", "--model", base, "--prompts", prompts, "--reward", fixed, *PROBE, "--json")
    alive = json.loads(stdout)
    assert code in (0, 1) and alive["verdict"] != "dead" and alive["zero_spread_share"] < 1.0
    assert alive["format_hit_rate"] > 0 and alive["tags"][0]["as_pieces"] > 0
    _, again, _ = invoke("rl", "probe", "--model", base, "--prompts", prompts, "--reward", fixed, *PROBE[:2],
                         "--max-prompts", "2", *PROBE[4:], "--json")  # the same seed: the same first two groups
    assert [g["rewards"] for g in json.loads(again)["groups"]] == [g["rewards"] for g in alive["groups"][:2]]


def test_probe_with_verls_own_geo3k(base, verl_parquet, verl_site, tmp_path) -> None:
    geo3k = verl_site / "verl/utils/reward_score/geo3k.py"
    code, stdout, _ = invoke("rl", "probe", "--engine", "verl", "--model", base, "--prompts", verl_parquet,
                             "--reward", f"{geo3k}:compute_score", "--reward-path", verl_site, *PROBE, "--json")
    base_report = json.loads(stdout)  # geo3k = 0.9 accuracy (mathruler on \\boxed{}) + 0.1 format: the accuracy
    rewards = [r for g in base_report["groups"] for r in g["rewards"]]  # part has spread, the format part none
    assert base_report["format_hit_rate"] == 0.0 and max(rewards) == pytest.approx(0.9)
    fixed = tmp_path / "geo3k.py"
    fixed.write_text(geo3k.read_text().replace("<think>", "<thinking>").replace("</think>", "</thinking>"))
    code, stdout, _ = invoke("rl", "probe", "--engine", "verl", "--model", base, "--prompts", verl_parquet,
                             "--reward", f"{fixed}:compute_score", "--reward-path", verl_site, *PROBE, "--json")
    report = json.loads(stdout)
    rewards = [r for g in report["groups"] for r in g["rewards"]]
    assert code in (0, 1) and report["format_hit_rate"] > 0 and max(rewards) == pytest.approx(1.0)


def _grpo(model_dir, reward, tmp_path, callbacks=()):
    """One GRPO step of TRL's own trainer; returns (trainer, changed parameter names)."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from vlforge.models import load

    from .fixture import ANSWERS, QUESTIONS

    loaded = load(model_dir, processor=False)
    before = {n: p.detach().clone() for n, p in loaded.model.named_parameters()}
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "answer": a}
                              for q, a in zip(QUESTIONS, ANSWERS, strict=True)])
    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=16, max_steps=1, learning_rate=1e-3, beta=0.0, logging_steps=1,
                      report_to=[], save_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0)
    torch.manual_seed(0)
    trainer = GRPOTrainer(model=loaded.model, reward_funcs=[reward], args=args, train_dataset=data,
                          processing_class=loaded.tokenizer, callbacks=list(callbacks))
    try:
        trainer.train()
    finally:
        changed = [n for n, p in loaded.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    return trainer, changed


def test_grpo_changes_weights_only_when_the_probe_sees_spread(base, rewritten_trl, tmp_path) -> None:
    own = _load(trl_reward_file("think_format_reward"), "think_format_reward")
    trainer, changed = _grpo(base, own, tmp_path / "dead")
    logged = trainer.state.log_history[0]
    assert changed == [] and logged["reward_std"] == 0.0 and logged["frac_reward_zero_std"] == 1.0
    fixed = _load(rewritten_trl[2] / "format_rewards.py", "think_format_reward")
    trainer, changed = _grpo(base, fixed, tmp_path / "alive")
    assert len(changed) > 10 and trainer.state.log_history[0]["frac_reward_zero_std"] < 1.0


def test_preflight_callback_stops_the_dead_run_before_its_first_step(base, tmp_path) -> None:
    from datasets import Dataset

    from vlforge.rl.callback import PreflightCallback, RunCannotLearn

    from .fixture import QUESTIONS

    own = _load(trl_reward_file("think_format_reward"), "think_format_reward")
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS])
    callback = PreflightCallback(reward_funcs=[own], train_dataset=data, samples=4, max_prompts=2, max_new_tokens=16)
    with pytest.raises(RunCannotLearn, match="cannot learn: no group of completions has any reward spread"):
        _grpo(base, own, tmp_path, callbacks=[callback])
    assert callback.report["verdict"] == "dead" and callback.report["zero_spread_share"] == 1.0


def test_no_trl_or_torch_import_until_used() -> None:
    code = ("import sys, vlforge.rl, vlforge.rl.command, vlforge.rl.callback, vlforge.rl.spec\n"
            "print(sorted(m for m in ('trl', 'torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_probe_reads_image_prompts_as_verl_does(tiny_checkpoint, tmp_path) -> None:
    """A verl row with an image (bytes) and ``<image>`` in its text goes through the model's processor."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(png, format="PNG")
    rows = [{"data_source": "hiyouga/geometry3k", "images": [{"bytes": png.getvalue(), "path": None}],
             "prompt": [{"role": "user", "content": "<image>What colour is this?"}],
             "reward_model": {"style": "rule", "ground_truth": "red"}}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "img.parquet")
    from vlforge.rl.prompts import read_prompts

    row = read_prompts(tmp_path / "img.parquet", engine="verl")[0]
    assert row.messages[0]["content"] == [{"type": "image"}, {"type": "text", "text": "What colour is this?"}]
    assert row.answer == "red" and len(row.images) == 1
    code, stdout, _ = invoke("rl", "probe", "--engine", "verl", "--model", tiny_checkpoint("qwen3_vl"), "--prompts",
                             tmp_path / "img.parquet", "--format-regex", "<think>", "--samples", "2",
                             "--max-new-tokens", "4", "--json")
    report = json.loads(stdout)
    assert code == 3 and report["prompts"] == 1 and len(report["groups"][0]["rewards"]) == 2
    rows[0]["images"] = [{"bytes": b"not a png", "path": None}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    code, _, stderr = invoke("rl", "probe", "--engine", "verl", "--model", tiny_checkpoint("qwen3_vl"), "--prompts",
                             tmp_path / "bad.parquet", "--format-regex", "<think>", "--samples", "2")
    assert code == 2 and f"error: {tmp_path / 'bad.parquet'}: prompt 0: cannot read its image (cannot identify image " \
        "file (in memory))" in stderr, stderr
    assert "loaded" not in stderr  # before the model
    (tmp_path / "ds").mkdir()
    code, _, stderr = invoke("rl", "probe", "--engine", "verl", "--model", tiny_checkpoint("qwen3_vl"), "--prompts",
                             tmp_path / "ds", "--format-regex", "<think>", "--samples", "2")
    assert code == 2 and "is a directory (EasyR1 and TRL load one with the datasets library)" in stderr, stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the device exists here")
def test_a_cuda_device_this_torch_has_not_is_one_line(base, prompts) -> None:
    own = f"{trl_reward_file('think_format_reward')}:think_format_reward"
    code, _stdout, stderr = invoke("rl", "probe", "--model", base, "--prompts", prompts, "--reward", own, *PROBE,
                                   "--device", "cuda")
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and lines == ["error: --device cuda: CUDA is not available here"], stderr[-2000:]
    assert "Traceback" not in stderr
