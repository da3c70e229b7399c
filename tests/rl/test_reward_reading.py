"""What a reward file needs, read from its source (no code runs): only the checked function and what it reaches,
and how each tag is used there (a test, a regex, or text cut at it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlforge.rl.rewards import inspect_reward

OPEN_R1_STYLE = '''import re

reasoning_delimiters = ["</think>"]
THINK = r"^<think>\\n.*?\\n</think>\\n<answer>\\n.*?\\n</answer>$"


def format_reward(completions, **kwargs):
    return [1.0 if re.match(THINK, c[0]["content"], re.S) else 0.0 for c in completions]


def _boxed(text):
    return re.search(r"\\\\boxed\\{(.*)\\}", text)


def accuracy_reward(completions, solution, **kwargs):
    return [float(_boxed(c[0]["content"]) is not None) for c in completions]


def think_then_boxed(completions, **kwargs):
    return [float(bool(re.search(r"<think>.*</think>", c[0]["content"], re.S))) and float(_boxed(c) is not None)
            for c in completions]
'''

COUNTS = '''def tag_count_reward(completions, **kwargs):
    def count(text):
        return 0.5 * (text.count("<think>\\n") == 1) + 0.5 * (text.find("</think>") != -1)
    return [count(c) for c in completions]


def cut_after(completions, **kwargs):
    return [float("42" in c[c.find("</think>") + 8:]) for c in completions]
'''


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, text in (("open_r1.py", OPEN_R1_STYLE), ("counts.py", COUNTS)):
        (tmp_path / name).write_text(text)
        out[name] = tmp_path / name
    return out


def _needed(file: Path, function: str) -> list[str]:
    return [text for text, _regex in inspect_reward(file, function).needed]


def test_only_the_checked_function_and_what_it_reaches_count(files):
    """A tag-free accuracy reward beside a format reward in one file needs no tag (was: every tag of the file);
    a function reaches module constants and helpers it names."""
    assert _needed(files["open_r1.py"], "accuracy_reward") == []
    assert _needed(files["open_r1.py"], "format_reward") == [r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$"]
    assert _needed(files["open_r1.py"], "think_then_boxed") == [r"<think>.*</think>"]


def test_count_and_find_test_for_a_tag_and_a_slice_at_one_cuts_text(files):
    """open-r1's tag_count_reward style (`count(...) == 1`, `find(...) != -1`) needs the tags; a slice from
    `find("</think>")` only cuts the text there."""
    info = inspect_reward(files["counts.py"], "tag_count_reward")
    assert [(text, regex) for text, regex in info.needed] == [("<think>\n", False), ("</think>", False)]
    assert _needed(files["counts.py"], "cut_after") == []


def test_easyr1s_reward_type_key_wins_over_the_files_constant(tmp_path):
    """EasyR1's `worker.reward.reward_type=sequential` (its examples' config) over the file's REWARD_TYPE."""
    from vlforge.rl.rewards import load_scorer

    (tmp_path / "seq.py").write_text('REWARD_TYPE = "batch"\n\n\ndef compute_score(reward_input):\n'
                                     '    return {"overall": float("<think>" in reward_input["response"])}\n')
    info = inspect_reward(tmp_path / "seq.py", "compute_score")
    assert load_scorer("easyr1", info).reward_type == "batch"
    assert load_scorer("easyr1", info, reward_type="sequential").reward_type == "sequential"


def test_an_async_verl_reward_is_awaited(tmp_path):
    """verl 0.9.1 awaits an `async def compute_score`; the probe's scorer calls it to completion."""
    from vlforge.rl.rewards import load_scorer

    (tmp_path / "a.py").write_text("async def compute_score(data_source, solution_str, ground_truth, extra_info=None):"
                                   "\n    return float(solution_str == ground_truth)\n")
    scorer = load_scorer("verl", inspect_reward(tmp_path / "a.py", "compute_score"))
    assert scorer.fn(data_source="d", solution_str="4", ground_truth="4") == 1.0


GUARDED = '''import re

try:
    FMT = re.compile(r"^<think>.*?</think>\\s*<answer>.*?</answer>$")
except re.error:
    FMT = None

REWARDS = []
pattern = r"^<think>.*?</think>"


def register(fn):
    REWARDS.append(fn)
    return fn


@register
def _tagged(text):
    return re.fullmatch(r"<b>.*</b>.*", text) is not None


def format_reward(completions, **kw):
    return [float(FMT.match(c) is not None and re.match(pattern, c) is not None) for c in completions]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(f(solution_str) for f in REWARDS)


def accuracy_reward(completions, **kw):
    pattern = r"\\\\boxed\\{(.*)\\}"
    return [float(re.search(pattern, c) is not None) for c in completions]


def cut_by_offset(completions, **kw):
    out = []
    for c in completions:
        i = c.rfind("</think>")
        out.append(float("42" in (c[i + len("</think>"):] if i >= 0 else c)))
    return out
'''


def test_what_a_reward_reaches_through_blocks_registries_and_its_own_names(tmp_path):
    """A pattern bound inside a module-level try block; a registry a decorator fills and the reward iterates; a
    local name shadowing a module pattern; a find result cut at through a name and len()."""
    (tmp_path / "g.py").write_text(GUARDED)
    assert _needed(tmp_path / "g.py", "format_reward") == [r"^<think>.*?</think>\s*<answer>.*?</answer>$",
                                                          r"^<think>.*?</think>"]
    assert _needed(tmp_path / "g.py", "compute_score") == [r"<b>.*</b>.*"]
    assert _needed(tmp_path / "g.py", "accuracy_reward") == []
    assert _needed(tmp_path / "g.py", "cut_by_offset") == []
