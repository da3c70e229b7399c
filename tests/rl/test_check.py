"""``vlforge rl check`` on each failure mode, with the engines' own files: verl's config YAML and reward scorer
(its peer venv), TRL's own reward and config fields, EasyR1's config layout, OpenRLHF's reward signature."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from .conftest import invoke, trl_reward_file


def _problems(report: dict) -> dict:
    return {p["kind"]: p for p in report["problems"]}


def test_untrained_tags_of_trls_own_reward_are_dead_and_the_rewrite_passes(rewritten_trl, base) -> None:
    code, report, out = rewritten_trl
    assert code == 3 and report["exit_code"] == 3 and report["verdict"] == "dead"
    assert [(t["tag"], t["ids"], t["verdict"]) for t in report["tags"]] == [
        ("<think>", [151667], "untrained"), ("</think>", [151668], "untrained")]
    fix = _problems(report)["untrained"]["fix"]
    assert "vlforge tokens fix --model" in fix and "<think> -> <thinking>" in fix
    rewritten = out / "format_rewards.py"
    text = rewritten.read_text()
    assert r"^<thinking>(?!.*<thinking>)(.*?)</thinking>.*$" in text
    assert '"<think>"' in text  # the docstring is copied as it was: only the pattern changed
    code, stdout, _ = invoke("rl", "check", "--model", base, "--reward", f"{rewritten}:think_format_reward", "--json")
    again = json.loads(stdout)
    assert code == 0 and again["verdict"] == "ok" and again["engine"] == "trl"
    assert again["sources"]["engine"].startswith("the signature of think_format_reward")


def test_verl_own_config_and_geo3k_scorer(base, verl_parquet, verl_site, tmp_path) -> None:
    config = yaml.safe_load((verl_site / "verl/trainer/config/_generated_ppo_trainer.yaml").read_text())
    config["actor_rollout_ref"]["model"]["path"] = str(base)
    config["data"]["train_files"] = str(verl_parquet)
    config["actor_rollout_ref"]["rollout"]["n"] = 4
    path = tmp_path / "ppo.yaml"
    path.write_text(yaml.safe_dump(config))
    geo3k = verl_site / "verl/utils/reward_score/geo3k.py"
    argv = ["rl", "check", "--engine", "verl", "--config", path, "--reward-path", verl_site, "--json"]
    code, stdout, stderr = invoke(*argv)  # the config names no custom_reward_function: verl's built-in scorer
    assert code == 2 and "default_compute_score" in stderr
    custom = {**config, "reward": {**config["reward"], "custom_reward_function": {"path": str(geo3k),
                                                                                 "name": "compute_score"}}}
    (tmp_path / "custom.yaml").write_text(yaml.safe_dump(custom))  # verl would call it with keywords it lacks
    code, _, stderr = invoke("rl", "check", "--engine", "verl", "--config", tmp_path / "custom.yaml")
    assert code == 2 and "custom.yaml:reward.custom_reward_function.path: verl calls" in stderr
    code, stdout, stderr = invoke(*argv, "--reward", f"{geo3k}:compute_score", "--rewrite-out", tmp_path / "fix")
    report = json.loads(stdout)
    assert code == 3 and report["engine"] == "verl" and report["skip_special_tokens"] is True
    assert report["sources"]["model"] == "ppo.yaml:actor_rollout_ref.model.path"
    assert {t["tag"]: t["verdict"] for t in report["tags"]} == {"<think>": "untrained", "</think>": "untrained"}
    assert "error:" in stderr and "never trained" in stderr
    fixed = tmp_path / "fix" / "geo3k.py"
    assert r'"<thinking>.*</thinking>.*\\boxed\{.*\}.*"' in fixed.read_text()
    code, stdout, _ = invoke("rl", "check", "--engine", "verl", "--config", path, "--reward-path", verl_site,
                             "--reward", f"{fixed}:compute_score", "--json")
    assert code == 0, stdout


@pytest.mark.parametrize("scorer", ["gsm8k.py", "math_reward.py", "math_dapo.py", "search_r1_like_qa_em.py"])
def test_verls_built_in_scorers_named_on_the_command_line_are_called_positionally(base, verl_site, scorer) -> None:
    """verl's default_compute_score calls its scorers `compute_score(solution_str, ground_truth)`: each of them is
    accepted (was refused unless its first parameter was not named solution_str), and called that way."""
    from vlforge.rl.prompts import PromptRow
    from vlforge.rl.reading import inspect_reward
    from vlforge.rl.rewards import Sample, load_scorer

    path = verl_site / "verl/utils/reward_score" / scorer
    code, stdout, stderr = invoke("rl", "check", "--engine", "verl", "--model", base, "--reward",
                                  f"{path}:compute_score", "--reward-path", verl_site, "--json")
    assert code in (0, 1, 3) and json.loads(stdout)["engine"] == "verl", stderr
    if scorer == "gsm8k.py":
        info = inspect_reward(path, "compute_score")
        score = load_scorer("verl", info, extra_paths=[verl_site])
        row = PromptRow(index=0, messages=[], conversational=True, answer="42", data_source="openai/gsm8k")
        assert score([Sample("so #### 42", [], "", row), Sample("#### 41", [], "", row)]) == [1.0, 0.0]


def test_a_tag_read_with_a_fallback_to_the_whole_text_is_a_warning(base, tmp_path) -> None:
    """`m.group(1) if m else solution_str`: a completion without the tags is scored on its text, so untrained tags
    make the run weak, not dead; the rewrite still renames them in that regex."""
    (tmp_path / "r.py").write_text(
        "import re\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    m = re.search(r'<think>.*</think>(.*)', solution_str, re.S)\n"
        "    answer = m.group(1) if m else solution_str\n    return float(answer.strip() == ground_truth)\n")
    code, stdout, _ = invoke("rl", "check", "--engine", "verl", "--model", base, "--reward",
                             f"{tmp_path / 'r.py'}:compute_score", "--rewrite-out", tmp_path / "fix", "--json")
    report = json.loads(stdout)
    assert code == 1 and report["verdict"] == "weak", report["problems"]
    assert [(t["tag"], t["verdict"], t["scores_without"]) for t in report["tags"]] == [
        ("<think>", "untrained", True), ("</think>", "untrained", True)]
    untrained = _problems(report)["untrained"]
    assert untrained["severity"] == "warning" and "the run is weakened, not stopped" in untrained["message"]
    assert "r'<thinking>.*</thinking>(.*)'" in (tmp_path / "fix" / "r.py").read_text()


def test_a_wrapper_around_an_imported_scorer_is_checked_and_the_scorers_module_rewritten(base, tmp_path) -> None:
    """The tags of a scorer the named function calls (`from scores import think_score`) are the run's; the rewrite
    writes the module that holds them, not the wrapper."""
    (tmp_path / "scores.py").write_text("import re\n\ndef think_score(text):\n"
                                        "    return float(bool(re.search(r'<think>.*</think>', text, re.S)))\n")
    (tmp_path / "wrap.py").write_text("from scores import think_score\n\ndef compute_score(data_source, "
                                      "solution_str, ground_truth, extra_info=None):\n"
                                      "    return think_score(solution_str)\n")
    code, stdout, _ = invoke("rl", "check", "--engine", "verl", "--model", base, "--reward",
                             f"{tmp_path / 'wrap.py'}:compute_score", "--rewrite-out", tmp_path / "fix", "--json")
    report = json.loads(stdout)
    assert code == 3 and [t["tag"] for t in report["tags"]] == ["<think>", "</think>"], report["tags"]
    assert sorted(p.name for p in (tmp_path / "fix").glob("*.py")) == ["scores.py"]  # not the wrapper
    assert "r'<thinking>.*</thinking>'" in (tmp_path / "fix" / "scores.py").read_text()


def test_verls_older_top_level_reward_key_is_checked_with_a_note(tiny_checkpoint, tmp_path) -> None:
    """`custom_reward_function.path=...` of older verl scripts: verl 0.9.1's main_ppo no longer reads it."""
    (tmp_path / "r.py").write_text("import re\n\ndef compute_score(data_source, solution_str, ground_truth, "
                                   "extra_info=None):\n    return float(bool(re.search(r'<think>.*</think>', "
                                   "solution_str)))\n")
    (tmp_path / "v.yaml").write_text(yaml.safe_dump({
        "actor_rollout_ref": {"model": {"path": str(tiny_checkpoint("qwen3_vl"))}},
        "custom_reward_function": {"path": str(tmp_path / "r.py"), "name": "compute_score"}}))
    code, stdout, _ = invoke("rl", "check", "--engine", "verl", "--config", tmp_path / "v.yaml", "--json")
    report = json.loads(stdout)
    assert code == 0 and report["sources"]["reward_file"] == "v.yaml:custom_reward_function.path", report["sources"]
    assert any("verl's older key" in note and "reward.custom_reward_function" in note for note in report["notes"])


def test_a_rewrite_says_when_the_train_files_prompts_still_ask_for_the_old_tags(base, tmp_path) -> None:
    """verl's geo3k prompts end "... MUST BE enclosed within <think> </think> tags": the rewrite changes the reward
    and template, so the report says the data still asks for the untrained tags."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ask = "2+2? You FIRST think about the reasoning process as an internal monologue enclosed within <think> </think>"
    pq.write_table(pa.Table.from_pylist([{"prompt": [{"role": "user", "content": ask}]},
                                         {"prompt": [{"role": "user", "content": "3+5?"}]}]), tmp_path / "t.parquet")
    code, stdout, _ = invoke("rl", "check", "--engine", "verl", "--model", base, "--format-regex",
                             "<think>.*</think>", "--prompts", tmp_path / "t.parquet", "--rewrite-out", tmp_path / "fix",
                             "--json")
    report = json.loads(stdout)
    assert code == 3 and (tmp_path / "fix" / "format_regex.txt").is_file()
    assert f"{tmp_path / 't.parquet'}: 1 of its first 2 prompts still ask for <think>,</think>" in report["notes"][-1]


def test_special_tags_stripped_by_the_decode(special_think, tmp_path) -> None:
    regex = ["--format-regex", "^<think>.*</think>"]
    code, stdout, _ = invoke("rl", "check", "--model", special_think, "--engine", "verl", *regex,
                             "--rewrite-out", tmp_path / "fix", "--json")
    report = json.loads(stdout)
    assert code == 3 and set(_problems(report)) == {"stripped"}
    assert all(t["stripped"] and t["special"] == [True] for t in report["tags"])
    assert "always decodes with skip_special_tokens=True" in _problems(report)["stripped"]["fix"]
    code, stdout, _ = invoke("rl", "check", "--model", special_think, "--engine", "verl", "--format-regex",
                             r"^(?:<think>.*</think>|\\boxed\{.*\})", "--json")  # either form scores: nothing is needed
    either = json.loads(stdout)
    assert either["tags"] == [] and "stripped" not in _problems(either), either
    code, stdout, _ = invoke("rl", "check", "--model", special_think, "--engine", "verl", *regex,
                             "--keep-special-tokens", "--json")
    kept = json.loads(stdout)
    assert code == 0 and kept["sources"]["skip_special_tokens"] == "flag"
    assert any("verl's own code decodes completions with skip_special_tokens=True" in n for n in kept["notes"]), kept
    code, stdout, _ = invoke("rl", "check", "--model", special_think, "--engine", "openrlhf", *regex, "--json")
    assert code == 0 and json.loads(stdout)["skip_special_tokens"] is False  # OpenRLHF keeps special tokens
    tok = json.loads((tmp_path / "fix" / "tokenizer" / "tokenizer.json").read_text())
    assert {t["content"]: t["special"] for t in tok["added_tokens"]}["<think>"] is False
    code, stdout, _ = invoke("rl", "check", "--model", special_think, "--engine", "verl", *regex,
                             "--tokenizer", tmp_path / "fix" / "tokenizer", "--json")
    assert code == 0, stdout
    code, _, stderr = invoke("rl", "check", "--model", special_think, "--engine", "verl", *regex,
                             "--rewrite-out", tmp_path / "fix", "--json")  # the same command again replaces it
    assert code == 3, stderr


def test_prefilled_think_makes_trls_format_unsatisfiable(tiny_checkpoint, r1_template, tmp_path) -> None:
    model = tiny_checkpoint("qwen3_vl")
    reward = f"{trl_reward_file('think_format_reward')}:think_format_reward"
    code, stdout, _ = invoke("rl", "check", "--model", model, "--reward", reward, "--template", r1_template,
                             "--rewrite-out", tmp_path / "fix", "--json")
    report = json.loads(stdout)
    assert code == 3 and set(_problems(report)) == {"prefilled"}, report["problems"]
    assert report["prefill"].endswith("<think>\n")
    assert [(t["tag"], t["prefilled"]) for t in report["tags"]] == [("<think>", True), ("</think>", False)]
    fixed = tmp_path / "fix" / "format_rewards.py"
    assert r"^(?:<think>)?(?!.*<think>)(.*?)</think>.*$" in fixed.read_text()  # TRL issue 6966's fix
    code, stdout, _ = invoke("rl", "check", "--model", model, "--reward", f"{fixed}:think_format_reward",
                             "--template", r1_template, "--json")
    assert code == 0, stdout
    # with an all-prefilled format: Qwen3's enable_thinking=false through TRL's own config field
    config = tmp_path / "grpo.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(model), "reward_funcs": ["think_format_reward"],
                                      "num_generations": 4, "chat_template_kwargs": {"enable_thinking": False}}))
    code, stdout, _ = invoke("rl", "check", "--engine", "trl", "--config", config, "--json")
    report = json.loads(stdout)
    assert code == 3 and "pre-fills the whole format" in _problems(report)["prefilled"]["fix"]
    assert report["sources"]["template_vars"] == "grpo.yaml:chat_template_kwargs"


def test_trl_text_prompts_go_in_as_written_so_their_own_end_is_the_prefill(tiny_checkpoint, tmp_path) -> None:
    """TRL applies no chat template to a text prompt: the R1-Zero prompt ending in "Assistant: <think>" pre-fills
    the tag, and enable_thinking=false, which only a template reads, pre-fills nothing."""
    model = tiny_checkpoint("qwen3_vl")
    r1_zero = tmp_path / "r1zero.jsonl"
    r1_zero.write_text(json.dumps({"prompt": "A conversation between User and Assistant. User: 2+2?\nAssistant: "
                                             "<think>"}) + "\n")
    launch = ["--", "trl", "grpo", "--model_name_or_path", model, "--reward_funcs", "think_format_reward"]
    code, stdout, _ = invoke("rl", "check", "--json", *launch, "--dataset_name", r1_zero)
    report = json.loads(stdout)
    assert code == 3 and set(_problems(report)) == {"prefilled"} and report["prefill"] == "<think>", report
    assert any("TRL passes text prompts as they are" in note for note in report["notes"])
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"prompt": "What is 2+2?"}) + "\n")
    code, stdout, _ = invoke("rl", "check", "--json", *launch, "--dataset_name", plain, "--chat_template_kwargs",
                             '{"enable_thinking": false}')
    report = json.loads(stdout)
    assert code == 0 and report["prefill"] == "" and not report["problems"], report


def test_prefill_rewrite_makes_the_opening_tag_optional(tiny_checkpoint, r1_template, tmp_path) -> None:
    model = tiny_checkpoint("qwen3_vl")
    code, stdout, _ = invoke("rl", "check", "--model", model, "--format-regex", r"^<think>.*</think>",
                             "--template", r1_template, "--rewrite-out", tmp_path / "fix", "--json")
    assert code == 3 and set(_problems(json.loads(stdout))) == {"prefilled"}
    regex = (tmp_path / "fix" / "format_regex.txt").read_text().strip()
    assert regex == r"^(?:<think>)?.*</think>"
    code, stdout, _ = invoke("rl", "check", "--model", model, "--format-regex", regex, "--template", r1_template,
                             "--json")
    assert code == 0, stdout


@pytest.mark.parametrize(("variables", "completion"), [
    ([], "2+2 is 4.\n</think>\n<answer>\n4\n</answer>"),  # the R1 template pre-fills "<think>\n"
    (["--template-var", "enable_thinking=false"], "<answer>\n4\n</answer>"),  # and the whole think block after it
], ids=["r1-prefill", "thinking-off"])
def test_the_rewrite_makes_what_the_prefill_wrote_optional_whitespace_included(tiny_checkpoint, r1_template, tmp_path,
                                                                                variables, completion) -> None:
    """open-r1's format_reward regex: making `<think>` alone optional leaves the `\\n` the pre-fill also wrote
    required, and no completion matches; the span the pre-fill covers is made optional instead."""
    model = tiny_checkpoint("qwen3_vl")
    regex = r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$"
    template = [] if variables else ["--template", r1_template]
    code, stdout, _ = invoke("rl", "check", "--model", model, "--format-regex", regex, *template, *variables,
                             "--rewrite-out", tmp_path / "fix", "--json")
    report = json.loads(stdout)
    assert code == 3 and set(_problems(report)) == {"prefilled"}, report
    fixed = (tmp_path / "fix" / "format_regex.txt").read_text().strip()
    assert re.match(fixed, completion, re.S | re.M), (fixed, report["prefill"])
    assert not re.match(fixed, "4", re.S | re.M)  # the format is still required after the pre-fill


EASYR1_REWARD = '''import re

REWARD_NAME = "math"
REWARD_TYPE = "batch"


def compute_score(reward_inputs, format_weight=0.1):
    out = []
    for item in reward_inputs:
        fmt = 1.0 if re.fullmatch(r"<think>.*</think>.*\\\\boxed\\{.*\\}.*", item["response"], re.DOTALL) else 0.0
        out.append({"overall": format_weight * fmt, "format": fmt})
    return out
'''


def test_easyr1_config_layout(base, prompts, tmp_path) -> None:
    (tmp_path / "math.py").write_text(EASYR1_REWARD)
    (tmp_path / "math.jinja").write_text("{{ content | trim }} Think inside <think> </think> tags, then answer "
                                         "in \\boxed{}.")
    config = {"data": {"train_files": f"{prompts}@train", "prompt_key": "prompt", "answer_key": "answer",
                       "format_prompt": "math.jinja", "max_response_length": 64},
              "worker": {"actor": {"model": {"model_path": str(base)}}, "rollout": {"n": 4},
                         "reward": {"reward_function": "math.py:compute_score", "skip_special_tokens": False}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    code, stdout, _ = invoke("rl", "check", "--engine", "easyr1", "--config", tmp_path / "config.yaml",
                             "--rewrite-out", tmp_path / "fix", "--json")
    report = json.loads(stdout)
    assert code == 3 and set(_problems(report)) == {"untrained"}
    assert report["skip_special_tokens"] is False
    assert report["sources"]["skip_special_tokens"] == "config.yaml:worker.reward.skip_special_tokens"
    assert "<thinking> </thinking> tags" in (tmp_path / "fix" / "format_prompt.jinja").read_text()
    assert "<thinking>.*</thinking>" in (tmp_path / "fix" / "math.py").read_text()
    written = json.loads((tmp_path / "fix" / "rewrite.json").read_text())["files"]
    assert sorted(Path(p).name for p in written) == ["chat_template.jinja", "format_prompt.jinja", "math.py"]


def test_a_hub_dataset_the_config_names_does_not_stop_the_check(base, tmp_path) -> None:
    """EasyR1's own examples train on `hiyouga/geometry3k@train`, TRL's on `--dataset_name trl-lib/...`: the check
    reads no prompt, so it runs and says the file is not here; probe, which samples from prompts, refuses it."""
    (tmp_path / "math.py").write_text(EASYR1_REWARD)
    config = {"data": {"train_files": "hiyouga/geometry3k@train"},
              "worker": {"actor": {"model": {"model_path": str(base)}},
                         "reward": {"reward_function": f"{tmp_path / 'math.py'}:compute_score"}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    code, stdout, _ = invoke("rl", "check", "--engine", "easyr1", "--config", tmp_path / "config.yaml", "--json")
    report = json.loads(stdout)
    assert code == 3 and set(_problems(report)) == {"untrained"}
    assert any(note.startswith("train file hiyouga/geometry3k (config.yaml:data.train_files) is not on this machine")
               for note in report["notes"]), report["notes"]
    code, _, stderr = invoke("rl", "probe", "--engine", "easyr1", "--config", tmp_path / "config.yaml")
    assert code == 2 and "config.yaml:data.train_files: hiyouga/geometry3k: not found (a hub dataset name?" in stderr


def test_openrlhf_reward_signature_is_recognised(tiny_checkpoint, r1_template, tmp_path) -> None:
    (tmp_path / "rm.py").write_text(
        "import re\n\ndef reward_func(queries, prompts, labels):\n"
        "    return {'rewards': [float(bool(re.search(r'<think>.*</think>', q, re.S))) for q in queries]}\n")
    code, stdout, _ = invoke("rl", "check", "--model", tiny_checkpoint("qwen3_vl"), "--reward",
                             f"{tmp_path / 'rm.py'}:reward_func", "--template", r1_template, "--json")
    report = json.loads(stdout)
    assert code == 0 and report["engine"] == "openrlhf" and report["skip_special_tokens"] is False
    assert any("scores prompt + completion" in n for n in report["notes"])  # pre-filled <think> is in the query


STARTS_WITH = '''def format_reward(completions, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(t.startswith("<think>") and "</think>" in t) for t in texts]
'''
ONLY_CUTS = '''import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if "</think>" in solution_str:
        solution_str = solution_str.split("</think>")[-1]
    answer = re.sub(r"<think>.*?</think>", "", solution_str)
    return float(ground_truth in answer)
'''


def test_how_the_reward_uses_a_tag_decides_what_it_needs(tiny_checkpoint, r1_template, tmp_path) -> None:
    """A plain-text test needs the tag as it is (a regex rewrite there would never match); text cut at a tag does
    not need it; a healthy run with --rewrite-out writes nothing and keeps its verdict."""
    model = tiny_checkpoint("qwen3_vl")
    (tmp_path / "sw.py").write_text(STARTS_WITH)
    code, stdout, _ = invoke("rl", "check", "--model", model, "--reward", f"{tmp_path / 'sw.py'}:format_reward",
                             "--template", r1_template, "--rewrite-out", tmp_path / "fix", "--json")
    report = json.loads(stdout)
    assert code == 3 and set(_problems(report)) == {"prefilled"}
    assert 't.startswith("<think>")' in (tmp_path / "fix" / "sw.py").read_text()  # no regex syntax in a literal
    assert "line 3: a plain-text test of a pre-filled tag" in json.loads(
        (tmp_path / "fix" / "rewrite.json").read_text())["files"][str(tmp_path / "fix" / "sw.py")]
    code, _, _ = invoke("rl", "check", "--model", model, "--reward", f"{tmp_path / 'fix' / 'sw.py'}:format_reward",
                        "--template", r1_template, "--json")
    assert code == 3  # still pre-filled: it needs the hand edit the rewrite named
    (tmp_path / "cuts.py").write_text(ONLY_CUTS)
    code, stdout, _ = invoke("rl", "check", "--model", model, "--reward", f"{tmp_path / 'cuts.py'}:compute_score",
                             "--template", r1_template, "--rewrite-out", tmp_path / "healthy", "--json")
    report = json.loads(stdout)
    assert code == 0 and report["tags"] == [] and report["patterns"] == [], report
    assert any("--rewrite-out" in note and "nothing written" in note for note in report["notes"])
    assert not (tmp_path / "healthy").exists()


SIGNATURES = {
    "trl.py": "def format_reward(completions, **kwargs):\n    return [1.0 for _ in completions]\n",
    "verl.py": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n",
    "three.py": "def compute_score(x, y, z):\n    return 1.0\n",
    "two.py": "def compute_score(solution_str, ground_truth):\n    return 1.0\n",
    "none.py": "compute_score = None\n",
    "grpo.yaml": "model_name_or_path: x\nreward_funcs: [think_format_reward]\nlearning_rate: 1.0e-6\n",
    "e.yaml": "data:\n  format_prompt: '{{ content }} Think in <think> </think> tags.'\nworker:\n  reward:\n"
              "    reward_function: verl.py:compute_score\n",
}


@pytest.mark.parametrize(("argv", "message"), [
    (["--engine", "verl", "--reward", "trl.py:format_reward"],
     "--reward trl.py:format_reward: format_reward(completions, **kwargs) is trl's reward signature, not verl's"),
    (["--engine", "openrlhf", "--reward", "verl.py:compute_score"], "is verl's reward signature, not openrlhf's"),
    (["--engine", "verl", "--reward", "three.py:compute_score"],
     "verl calls compute_score(data_source=, solution_str=, ground_truth=, extra_info=): compute_score(x, y, z) "
     "cannot take data_source, solution_str, ground_truth, extra_info"),
    (["--engine", "verl", "--reward", "two.py:compute_score"],  # verl's built-in signature, outside reward_score/
     "compute_score(solution_str, ground_truth) cannot take data_source, extra_info"),
    (["--engine", "easyr1", "--reward", "three.py:compute_score"], "also requires y, z"),
    (["--engine", "trl", "--reward", "three.py:compute_score"], "needs **kwargs"),
    (["--engine", "verl", "--reward", "none.py:compute_score"], "'compute_score' is None, not a function"),
    (["--engine", "verl", "--reward", ".:compute_score"], "--reward .: is a directory"),
    (["--format-regex", ""], "matches the empty string"),

    (["--engine", "verl", "--config", "missing.yaml"], "--config missing.yaml: not found"),
    (["--engine", "trl", "--config", "."], "--config .: is a directory, not a config file"),
    (["--engine", "easyr1", "--config", "e.yaml"], "--format-prompt '{{ content }} Think in <think> </think> '..."
     ": is template text, not a file (the engine reads this key as a file path) (from e.yaml:data.format_prompt)"),
    (["--engine", "verl", "--config", "grpo.yaml"],
     "--config grpo.yaml: holds trl's keys (model_name_or_path, reward_funcs), none of verl's: pass --engine trl"),
    (["--format-regex", "(<think>"], "does not compile"),
    (["--reward", "nope.py:f"], "--reward nope.py: not found"),
])
def test_bad_input_is_one_line(argv, message, tiny_checkpoint, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name, text in SIGNATURES.items():
        (tmp_path / name).write_text(text)
    code, _, stderr = invoke("rl", "check", "--model", tiny_checkpoint("qwen3_vl"), *argv)
    assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1


def test_a_bad_value_from_the_engines_config_names_its_key(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.py").write_text(SIGNATURES["verl.py"])
    config = {"actor_rollout_ref": {"model": {"path": str(tmp_path / "nomodel")}},
              "custom_reward_function": {"path": "gone.py", "name": "compute_score"}}
    expected = []
    for change, message in ((None, "v.yaml:custom_reward_function.path: gone.py: not found"),
                            (("custom_reward_function", "path", "r.py"),
                             f"v.yaml:actor_rollout_ref.model.path: {tmp_path / 'nomodel'} does not exist"),
                            (("data", "train_files", "gone.parquet"), "v.yaml:data.train_files: gone.parquet: not found")):
        if change is not None:
            config.setdefault(change[0], {})[change[1]] = change[2]
        (tmp_path / "v.yaml").write_text(yaml.safe_dump(config))
        command = "probe" if "train_files" in message else "check"  # check reads no prompt (a hub name is fine)
        code, _, stderr = invoke("rl", command, "--engine", "verl", "--config", "v.yaml")
        expected.append((code, message in stderr, stderr))
    assert [(code, hit) for code, hit, _ in expected] == [(2, True)] * 3, expected
    code, _, stderr = invoke("rl", "check", "--engine", "verl", "--config", "v.yaml")
    assert code == 2 and "nomodel does not exist" in stderr and "train_files" not in stderr


def test_a_local_train_file_the_launch_names_is_read_by_the_check(tiny_checkpoint, tmp_path, monkeypatch) -> None:
    """A train file the run names and this machine has is read as the run will (a hub name is not: a note)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.py").write_text(SIGNATURES["verl.py"])
    (tmp_path / "bad.parquet").write_text("garbage\n")
    launch = ["--", "python3", "-m", "verl.trainer.main_ppo", f"actor_rollout_ref.model.path={tiny_checkpoint('qwen3_vl')}",
              "reward.custom_reward_function.path=r.py"]
    code, _, stderr = invoke("rl", "check", *launch, "data.train_files=bad.parquet")
    assert code == 2 and "bad.parquet: not a parquet file" in stderr and "data.train_files" in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
