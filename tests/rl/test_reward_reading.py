"""What a reward file needs, read from its source (no code runs): only the checked function and what it reaches,
and how each tag is used there (a test, a regex, or text cut at it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vlforge.errors import ConfigError
from vlforge.rl.reading import inspect_reward

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


def _tags(file: Path, function: str, *, firm_only: bool = False) -> list[str]:
    """The tags ``rl check`` audits for ``function`` of ``file`` (no added tokens)."""
    from vlforge.rl.check import RewardPatterns

    return RewardPatterns.of("r", inspect_reward(file, function)).tags([], firm_only=firm_only)


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


MESSAGES_AND_ESCAPES = r'''import logging
import re

logger = logging.getLogger(__name__)


def boxed_only(data_source, solution_str, ground_truth, extra_info=None):
    m = re.search(r"\\boxed\{(.*)\}", solution_str)
    if m is None:
        logger.debug("no boxed answer after </think> in %r", solution_str[-200:])
        print(f"skipped: no </think> in {data_source}")
        return 0.0
    if m.group(1) == "":
        raise ValueError("empty answer after <think>")
    return float(m.group(1) == ground_truth)


def escaped(data_source, solution_str, ground_truth, extra_info=None):
    m = re.search(r"<\/think>\s*(.*)$", solution_str, re.S)
    return 0.0 if m is None else float(m.group(1).strip() == ground_truth)
'''


def test_logged_printed_and_raised_strings_are_messages_and_an_escaped_slash_is_a_tag(tmp_path):
    r"""A tag in a log line, a print or an exception message tests nothing; `<\/think>` (a common spelling in
    reward regexes) is `</think>`."""
    (tmp_path / "r.py").write_text(MESSAGES_AND_ESCAPES)
    info = inspect_reward(tmp_path / "r.py", "boxed_only")
    assert info.uses == ["message", "message", "message"] and info.needed == [], (info.patterns, info.uses)
    assert _needed(tmp_path / "r.py", "escaped") == [r"<\/think>\s*(.*)$"]
    from vlforge.rl.rewards import pattern_literals

    assert pattern_literals(r"<\/think>\s*(.*)$") == ["</think>"]


def test_reward_kwargs_the_function_cannot_take_are_refused(tmp_path):
    """verl merges reward_kwargs into its call and EasyR1 binds them with partial: a name the function does not take
    (and no **kwargs) is a TypeError at the first score."""
    from vlforge.rl.rewards import call_problem

    (tmp_path / "r.py").write_text(MESSAGES_AND_ESCAPES)
    info = inspect_reward(tmp_path / "r.py", "escaped")
    assert call_problem(info, "verl", keywords={"foo"}) == (
        "verl passes the reward kwargs foo: escaped(data_source, solution_str, ground_truth, extra_info) cannot take "
        "them (add **kwargs)")
    assert call_problem(info, "verl", keywords={"extra_info"}) is None


def test_a_function_defined_in_a_block_or_imported_is_read_where_it_is_defined(tmp_path):
    """verl and EasyR1 take the module attribute: a function defined under try / if, or re-exported from another
    module (relative, or on --reward-path), is read from its definition."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "scores.py").write_text(
        "import re\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(bool(re.match(r'<think>.*</think>', solution_str)))\n")
    (tmp_path / "pkg" / "entry.py").write_text("from .scores import compute_score\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "wrap.py").write_text("from pkg.scores import compute_score as score\n")
    (tmp_path / "blocks.py").write_text(
        "import re\ntry:\n    import math_verify\n    def compute_score(solution_str, **kw):\n"
        "        return float('<answer>' in solution_str)\nexcept ImportError:\n"
        "    def compute_score(solution_str, **kw):\n        return float(bool(re.search(r'<answer>.*</answer>', "
        "solution_str)))\n")
    relative = inspect_reward(tmp_path / "pkg" / "entry.py", "compute_score")
    assert relative.file == tmp_path / "pkg" / "scores.py" and relative.needed == [("<think>.*</think>", True)]
    assert inspect_reward(tmp_path / "elsewhere" / "wrap.py", "score", (tmp_path,)).file == relative.file
    assert _needed(tmp_path / "blocks.py", "compute_score") == ["<answer>.*</answer>"]  # its last definition
    from vlforge.errors import ConfigError

    with pytest.raises(ConfigError, match=r"'score' is imported from pkg.scores, whose file vlforge cannot find "
                                          r"\(add its directory with --reward-path\)"):
        inspect_reward(tmp_path / "elsewhere" / "wrap.py", "score")


def test_a_reward_module_with_relative_imports_is_loaded_as_part_of_its_package(tmp_path, monkeypatch):
    """open-r1's rewards.py (`from .utils import ...`): imported by its dotted name, as TRL imports it (verl and
    EasyR1 load the file by its path, where the import fails, as it does there)."""
    import sys

    from vlforge.errors import ConfigError
    from vlforge.rl.rewards import load_scorer

    monkeypatch.setattr(sys, "path", list(sys.path))  # the package's root is added for the import: undone after
    monkeypatch.setattr(sys, "modules", dict(sys.modules))

    pkg = tmp_path / "relpkg_vlforge_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "utils.py").write_text("BONUS = 0.5\n")
    (pkg / "rewards.py").write_text("from .utils import BONUS\n\ndef fmt(completions, **kwargs):\n"
                                    "    return [BONUS for _ in completions]\n")
    scorer = load_scorer("trl", inspect_reward(pkg / "rewards.py", "fmt"))
    assert scorer.fn(["a", "b"]) == [0.5, 0.5]
    with pytest.raises(ConfigError, match="attempted relative import"):
        load_scorer("verl", inspect_reward(pkg / "rewards.py", "fmt"))


def test_a_reward_regex_that_does_not_compile_is_bad_input(tmp_path):
    """The engine would raise at its first score; --format-regex is refused the same way."""
    from vlforge.errors import ConfigError

    (tmp_path / "r.py").write_text("import re\n\ndef f(completions, **kwargs):\n"
                                   "    return [float(bool(re.search(r'(<think>.*</think>', c))) for c in completions]\n")
    with pytest.raises(ConfigError, match=r"r\.py:4: the regex '\(<think>\.\*</think>' does not compile \(missing \)"):
        inspect_reward(tmp_path / "r.py", "f")


GUARDS = '''def cut_only(data_source, solution_str, ground_truth, extra_info=None):
    if "</think>" in solution_str:
        solution_str = solution_str.split("</think>")[-1]
    return float(solution_str.strip() == ground_truth)


def cut_or_zero(data_source, solution_str, ground_truth, extra_info=None):
    if "</think>" in solution_str:
        answer = solution_str.split("</think>")[-1]
    else:
        return 0.0
    return float(answer.strip() == ground_truth)


def cut_and_flag(completions, solution, **kwargs):
    rewards = []
    for content, sol in zip(completions, solution):
        complete = False
        if "</think>" in content:
            content = content.split("</think>")[-1]
            complete = True
        rewards.append(float(complete and content.strip() == sol))
    return rewards
'''


def test_a_tag_test_that_guards_a_cut_needs_the_tag_when_its_absence_scores_differently(tmp_path):
    """`if "</think>" in s: s = s.split(...)[-1]` only cuts; with `else: return 0.0` or a flag set beside the cut
    (TRL's reasoning_accuracy_reward), a completion without the tag scores 0: the tag is needed."""
    (tmp_path / "g.py").write_text(GUARDS)
    assert _needed(tmp_path / "g.py", "cut_only") == []
    assert _needed(tmp_path / "g.py", "cut_or_zero") == ["</think>"]
    assert _needed(tmp_path / "g.py", "cut_and_flag") == ["</think>"]


def test_a_positive_lookahead_requires_its_tags_a_negative_one_does_not():
    from vlforge.rl.rewards import pattern_literals

    assert pattern_literals(r"^(?=.*<think>)(?=.*</think>).*\\boxed\{.*\}") == ["<think>", "</think>", "\\boxed{", "}"]
    assert pattern_literals(r"^(?!.*<think>).*</think>") == ["</think>"]


REVIEWED = r'''import logging
import re

LETTERS = "ABCD"
logger = logging.getLogger(__name__)


def choice(completions, **kwargs):
    out = []
    for c in completions:
        m = re.search(rf"<answer>\s*([{LETTERS}])\s*</answer>", c)
        body = r"<answer>(" + "[A-D]" + r")</answer>"
        out.append(float(m is not None and re.search(body, c) is not None))
    return out


def fallback(data_source, solution_str, ground_truth, extra_info=None):
    if "</think>" in solution_str:
        answer = solution_str.split("</think>")[-1]
    else:
        answer = solution_str
    return float(answer.strip() == ground_truth)


def unread_flag(data_source, solution_str, ground_truth, extra_info=None):
    done = False
    if "</think>" in solution_str:
        solution_str = solution_str.split("</think>")[-1]
        done = True
    return float(solution_str.strip() == ground_truth)


def quiet(data_source, solution_str, ground_truth, extra_info=None):
    assert isinstance(solution_str, str), "expected <answer> text"
    print("missing <answer> in {}".format(data_source))
    logger.warning(msg="no </think> seen")
    return float(solution_str == ground_truth)
'''


def test_review_cases_of_reading_how_a_reward_uses_its_tags(tmp_path):
    """f-string and + pieces are no regex of their own; an else that keeps the text and a flag never read are cuts;
    assert messages, .format() messages and msg= keywords are messages."""
    (tmp_path / "r.py").write_text(REVIEWED)
    assert [text for text, _ in inspect_reward(tmp_path / "r.py", "choice").needed] == [
        r"<answer>\s*([", r"])\s*</answer>", "<answer>(", ")</answer>"]  # no compile error for the pieces
    assert _needed(tmp_path / "r.py", "fallback") == []
    assert _needed(tmp_path / "r.py", "unread_flag") == []
    assert inspect_reward(tmp_path / "r.py", "quiet").uses == ["message", "message", "message"]


def test_imports_followed_name_their_cycle_and_a_relative_one_is_refused_for_path_loading_engines(tmp_path):
    """verl and EasyR1 load the reward file by its path: its relative import fails when the run starts."""
    from vlforge.errors import ConfigError

    (tmp_path / "a.py").write_text("from b import f\n")
    (tmp_path / "b.py").write_text("from a import f\n")
    with pytest.raises(ConfigError, match=r"'f' is imported from a, which imports it back: the imports form a cycle"):
        inspect_reward(tmp_path / "a.py", "f")
    (tmp_path / "top.py").write_text("from ...........far import f\n")
    with pytest.raises(ConfigError, match="whose file vlforge cannot find"):
        inspect_reward(tmp_path / "top.py", "f")
    pkg = tmp_path / "rel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "scores.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                   "    return 1.0\n")
    (pkg / "entry.py").write_text("from .scores import compute_score\n")
    info = inspect_reward(pkg / "entry.py", "compute_score")
    assert info.via == "from .scores import compute_score" and info.file == pkg / "scores.py"
    from vlforge.rl.spec import RunRequest, resolve

    with pytest.raises(ConfigError, match=r"verl loads this file by its path, so its relative import \(from \.scores "
                                          r"import compute_score\) fails when the run starts"):
        resolve(RunRequest(engine="verl", model="tiny:qwen3_vl", reward=f"{pkg / 'entry.py'}:compute_score",
                           reads_prompts=False))


def test_the_rewrite_renames_an_escaped_slash_tag_and_names_a_capture_group_made_optional(tmp_path):
    from vlforge.rl.rewrite import rewrite_reward_file

    source = ('import re\n\ndef f(completions, **kwargs):\n'
              '    return [float(bool(re.match(r"^<think>\\n(.*?)\\n<\\/think>\\n<answer>", c))) for c in completions]\n')
    (tmp_path / "r.py").write_text(source)
    info = inspect_reward(tmp_path / "r.py", "f")
    renamed, manual = rewrite_reward_file(source, info.spans, info.uses, {"<think>": "<thinking>",
                                                                         "</think>": "</thinking>"}, [])
    assert r'r"^<thinking>\n(.*?)\n</thinking>\n<answer>"' in renamed and manual == []
    optional, manual = rewrite_reward_file(source, info.spans, info.uses, {}, ["<think>", "</think>"],
                                           "<think>\n\n</think>\n\n")
    assert r'r"^(?:<think>\n(.*?)\n</think>\n)?<answer>"' in optional
    assert manual == [(4, "a capture group is now inside the optional pre-filled part: where the reward reads it "
                          "(match.group(n)), allow None")]


def test_an_alternation_requires_only_the_tags_every_alternative_holds():
    """`(<think>|<reasoning>)` is matched by either tag: neither is required; a tag in every alternative is (the
    parser factors a shared prefix out of the alternatives, `<think>|<thinking>` shares `<think`)."""
    from vlforge.rl.check import required_tags

    def tags(pattern: str, added: tuple[str, ...] = ()) -> list[str]:
        return required_tags([(pattern, True)], list(added))

    assert tags(r"(<think>|<reasoning>).*</answer>") == ["</answer>"]
    assert tags(r"<think>.*</think>|<answer>.*</answer>") == []
    assert tags(r"<think>|<thinking>") == []
    assert tags(r"(<think>x|<think>y)</think>") == ["<think>", "</think>"]
    assert tags(r"(?:<think>.*</think>\n<answer>|<think>.*</think><answer>)") == ["<think>", "</think>", "<answer>"]
    assert tags(r"(◁think▷a|◁think▷b)", ("◁think▷",)) == ["◁think▷"]
    assert tags(r"^<think>.*</think>(?:<answer>|\\boxed)") == ["<think>", "</think>"]
    assert tags(r"<think>.*</think>", ()) == ["<think>", "</think>"]


FALLBACKS = r'''import re

ANSWER = r"<answer>(.*?)</answer>"


def group_or_text(data_source, solution_str, ground_truth, extra_info=None):
    m = re.search(r"<answer>(.*?)</answer>", solution_str, re.S)
    answer = m.group(1).strip() if m else solution_str.strip()
    return float(answer == ground_truth)


def text_unless_found(completions, solution, **kwargs):
    out = []
    for content, sol in zip(completions, solution):
        found = re.findall(ANSWER, content)
        answer = content if not found else found[-1]
        out.append(float(answer == sol))
    return out


def walrus(data_source, solution_str, ground_truth, extra_info=None):
    answer = m.group(1) if (m := re.search(r"</think>(.*)", solution_str, re.S)) else solution_str
    return float(answer.strip() == ground_truth)


def if_else_text(data_source, solution_str, ground_truth, extra_info=None):
    match = re.search(r"<answer>(.*?)</answer>", solution_str)
    if match:
        answer = match.group(1)
    else:
        answer = solution_str
    return float(answer == ground_truth)


def group_or_empty(data_source, solution_str, ground_truth, extra_info=None):
    m = re.search(r"<answer>(.*?)</answer>", solution_str)
    answer = m.group(1) if m else ""
    return float(answer == ground_truth)


def none_scores_zero(data_source, solution_str, ground_truth, extra_info=None):
    m = re.search(r"<answer>(.*?)</answer>", solution_str)
    if m is None:
        return 0.0
    answer = m.group(1) if m else solution_str
    return float(answer == ground_truth)


def kept_unless_found(data_source, solution_str, ground_truth, extra_info=None):
    text = solution_str.strip()
    found = re.findall(r"<answer>(.*?)</answer>", text, re.S)
    if found:
        text = found[-1]
    return float(text == ground_truth)


def except_keeps_text(data_source, solution_str, ground_truth, extra_info=None):
    try:
        answer = re.search(r"<answer>(.*?)</answer>", solution_str).group(1)
    except AttributeError:
        answer = solution_str
    return float(answer == ground_truth)


def empty_unless_found(data_source, solution_str, ground_truth, extra_info=None):
    answer = ""
    m = re.search(r"<answer>(.*?)</answer>", solution_str)
    if m:
        answer = m.group(1)
    return float(answer == ground_truth)


def except_scores_zero(data_source, solution_str, ground_truth, extra_info=None):
    try:
        answer = re.search(r"<answer>(.*?)</answer>", solution_str).group(1)
    except AttributeError:
        return 0.0
    return float(answer == ground_truth)


def if_else_zero(data_source, solution_str, ground_truth, extra_info=None):
    match = re.search(r"<answer>(.*?)</answer>", solution_str)
    if match:
        answer = match.group(1)
    else:
        answer = None
    return float(answer == ground_truth)
'''


def test_a_match_read_with_a_fallback_to_the_text_is_not_a_firm_requirement(tmp_path):
    """`m.group(1) if m else text` (or an `else:` that keeps the text, an `if m:` that replaces a text it holds
    already, an `except AttributeError:` that keeps it) scores a completion without the tags on its whole text: whether that scores depends on the grader (`rl check` warns, not errs). A fallback to a constant (`""`, `None`) or a test that returns a score
    still needs the tags."""
    (tmp_path / "f.py").write_text(FALLBACKS)
    for function in ("group_or_text", "text_unless_found", "walrus", "if_else_text", "kept_unless_found",
                     "except_keeps_text"):
        info = inspect_reward(tmp_path / "f.py", function)
        assert info.uses == ["regex"] and info.soft == [True] and info.firm == [], (function, info.uses)
    for function in ("group_or_empty", "none_scores_zero", "if_else_zero", "empty_unless_found", "except_scores_zero"):
        info = inspect_reward(tmp_path / "f.py", function)
        assert info.uses == ["regex"] and info.firm == [(r"<answer>(.*?)</answer>", True)], (function, info.uses)


def test_a_file_in_another_encoding_is_read_as_python_reads_it_and_rewritten_in_it(tmp_path):
    """A UTF-8 BOM or a `# -*- coding: latin-1 -*-` line: Python imports both; so does the check (was: not valid
    Python / cannot read), and a rewrite keeps the file's encoding."""
    from vlforge.rl.reading import read_source
    from vlforge.rl.rewrite import rewrite_reward_file

    body = 'import re\n\ndef f(completions, **kw):\n    # r\u00e9ponse\n    return [float(bool(re.search(r"<think>.*</think>", c))) for c in completions]\n'
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbf" + body.encode("utf-8"))
    (tmp_path / "latin.py").write_bytes(("# -*- coding: latin-1 -*-\n" + body).encode("latin-1"))
    (tmp_path / "bad.py").write_bytes(b"# -*- coding: no-such-codec -*-\n" + body.encode())
    for name, encoding in (("bom.py", "utf-8-sig"), ("latin.py", "iso-8859-1")):
        info = inspect_reward(tmp_path / name, "f")
        assert info.patterns == ["<think>.*</think>"], name
        source, found = read_source(tmp_path / name)
        assert found == encoding and "r\u00e9ponse" in source
        text, _ = rewrite_reward_file(source, info.spans, info.uses, {"<think>": "<thinking>"}, [])
        assert 'r"<thinking>.*</think>"' in text and text.encode(found).decode(found) == text
    with pytest.raises(ConfigError, match=r"bad.py: not valid Python \(unknown encoding"):
        inspect_reward(tmp_path / "bad.py", "f")


METHODS = r'''import re

PATTERN = r"<think>.*?</think>\s*<answer>.*?</answer>"


class VisionModule:
    @staticmethod
    def format_reward(completions, **kwargs):
        return [1.0 if re.fullmatch(PATTERN, c[0]["content"], re.S) else 0.0 for c in completions]

    @classmethod
    def answer_reward(cls, completions, **kwargs):
        return [float("<answer>" in c[0]["content"]) for c in completions]

    def instance_reward(self, completions, **kwargs):
        return [0.0 for _ in completions]
'''


def test_a_static_or_class_method_is_named_class_dot_method(tmp_path):
    """VLM-R1 keeps its rewards as static methods of a module class (`Qwen2VLModule.format_reward_rec`) and passes
    them to TRL: `FILE:Class.method` reads and calls them; an instance method, a missing one, and an engine that
    looks the name up in the module (verl) are one line each."""
    from vlforge.rl.rewards import call_problem, load_scorer

    (tmp_path / "m.py").write_text(METHODS)
    info = inspect_reward(tmp_path / "m.py", "VisionModule.format_reward")
    assert info.params == ["completions"] and info.signature == "trl" and info.needed == [(info.patterns[0], True)]
    assert inspect_reward(tmp_path / "m.py", "VisionModule.answer_reward").params == ["completions"]  # cls bound
    assert call_problem(info, "trl", keywords=set()) is None
    assert "cannot name the method VisionModule.format_reward" in call_problem(info, "verl", keywords=set())
    fn = load_scorer("trl", info).fn
    assert fn([[{"content": "<think>a</think><answer>b</answer>"}], [{"content": "b"}]]) == [1.0, 0.0]
    for name, message in (("VisionModule.instance_reward", "is an instance method"),
                          ("VisionModule.formt_reward", "did you mean 'format_reward'"),
                          ("Module.format_reward", "no class 'Module'"),
                          ("format_reward", "functions: VisionModule.format_reward, VisionModule.answer_reward")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            inspect_reward(tmp_path / "m.py", name)


PARTIAL = r'''import re


def count_tags(completions, **kwargs):
    def count(text):
        score = 0.0
        if text.count("<think>\n") == 1:
            score += 0.25
        if text.count("\n</think>\n") == 1:
            score += 0.25
        return score
    return [count(c[0]["content"]) for c in completions]


def summed(completions, **kwargs):
    return [0.5 * float("<think>" in c) + 0.5 * float(bool(re.search(r"<answer>.*</answer>", c))) for c in completions]


def added(completions, **kwargs):
    out = []
    for c in completions:
        score = 0.0
        score += 0.5 if re.search(r"<think>.*</think>", c, re.S) else 0.0
        score += 0.5 if c.strip() else 0.0
        out.append(score)
    return out


def all_or_nothing(completions, **kwargs):
    return [1.0 if "<think>" in c else 0.0 for c in completions]


def added_or_zero(completions, **kwargs):
    out = []
    for c in completions:
        score = 0.0
        if "<think>" in c:
            score += 1.0
        else:
            score = -1.0
        out.append(score)
    return out
'''


def test_a_tag_that_earns_partial_credit_is_soft(tmp_path):
    """open-r1's tag_count_reward (0.25 per tag), a sum of terms, a `score += ...` of a match: a completion without
    one tag still scores from the others, so no tag is firmly required; an all-or-nothing test, or an `if` whose
    `else` sets the score, keeps it required."""
    path = tmp_path / "p.py"
    path.write_text(PARTIAL)
    for function in ("count_tags", "summed", "added"):
        info = inspect_reward(path, function)
        assert info.needed and all(info.soft) and info.firm == [], (function, info.uses, info.soft)
    for function in ("all_or_nothing", "added_or_zero"):
        info = inspect_reward(path, function)
        assert info.firm == [("<think>", False)], (function, info.uses, info.soft)


SUPPLIED = r'''import re


def prepended(completions, target, **kwargs):
    rewards = []
    for completion in completions:
        completion = "<think>" + completion
        regex = r"^<think>([^<]*(?:<(?!/?think>)[^<]*)*)<\/think>\n<answer>([\s\S]*?)<\/answer>$"
        match = re.search(regex, completion, re.DOTALL)
        rewards.append(1.0 if match is not None and len(match.groups()) == 2 else 0.0)
    return rewards


def searched_with_it(completions, **kwargs):
    return [float(bool(re.match(r"<think>.*</think>", f"<think>{c}", re.S))) for c in completions]


def pattern_built(completions, **kwargs):
    body = r".*?"
    pattern = "<think>" + body + "</think>"
    return [float(bool(re.match(pattern, c, re.S))) for c in completions]
'''


def test_a_tag_the_reward_adds_to_the_text_itself_is_not_needed_from_the_completion(tmp_path):
    """philschmid's mini-R1 reward (copied widely): the prompt pre-fills `<think>` and the reward puts it back,
    `completion = "<think>" + completion`, before matching `^<think>...`: the completion needs `</think>`,
    `<answer>`, `</answer>`, not `<think>`. A pattern built with `+` still requires its tags."""
    (tmp_path / "s.py").write_text(SUPPLIED)

    def tags(function: str) -> list[str]:
        return _tags(tmp_path / "s.py", function)

    assert tags("prepended") == ["</think>", "<answer>", "</answer>"]
    assert tags("searched_with_it") == ["</think>"]
    assert tags("pattern_built") == ["<think>", "</think>"]


CHAINS = r'''import re


def either_block(completions, **kwargs):
    out = []
    for c in completions:
        if "<reasoning>" in c:
            ok = re.fullmatch(r"<reasoning>.*?</reasoning>\s*\d+", c, re.S)
        elif "<think>" in c:
            ok = re.fullmatch(r"<think>.*?</think>\s*\d+", c, re.S)
        else:
            ok = None
        out.append(1.0 if ok else 0.0)
    return out


def extract_solution(solution_str):
    if "Assistant:" in solution_str:
        solution_str = solution_str.split("Assistant:", 1)[1]
    elif "<|im_start|>assistant" in solution_str:
        solution_str = solution_str.split("<|im_start|>assistant", 1)[1]
    else:
        return None
    m = re.findall(r"<answer>(.*?)</answer>", solution_str)
    return m[-1] if m else None


def compute_score(solution_str, ground_truth, format_score=0.1, score=1.0):
    answer = extract_solution(solution_str)
    return 0.0 if answer is None else score if answer == ground_truth else format_score


def each_needed(completions, **kwargs):
    out = []
    for c in completions:
        if "<think>" not in c:
            out.append(0.0)
        elif "</think>" not in c:
            out.append(0.0)
        else:
            out.append(1.0)
    return out
'''


def test_an_if_elif_chain_of_presence_tests_needs_one_branch_not_each(tmp_path):
    """`if "<reasoning>" in c: ... elif "<think>" in c: ...` (Visual-ARFT), TinyZero's `if "Assistant:" in s ... elif
    "<|im_start|>assistant" in s ...`: a completion takes one branch, so neither branch's tags are needed alone (they
    were all required: TinyZero's `<|im_start|>` was even reported stripped and pre-filled); a tag outside the chain
    still is. A chain of absence tests (`not in`) needs every tag."""
    (tmp_path / "c.py").write_text(CHAINS)

    def tags(function: str) -> list[str]:
        return _tags(tmp_path / "c.py", function)

    assert tags("either_block") == []
    assert tags("compute_score") == ["<answer>", "</answer>"]
    assert tags("each_needed") == ["<think>", "</think>"]


def test_a_call_to_a_scorer_imported_from_a_module_beside_the_file_is_read(tmp_path):
    """`from qa_em import compute_score as em` ... `return em(solution_str, ground_truth)`: the tags the called
    scorer needs are the wrapper's (was: none, so a dead run read ok); `import qa_em` ... `qa_em.compute_score(...)`
    too; the rewrite edits the module that holds the pattern. A module that cannot be found (an installed package
    vlforge does not read) adds nothing."""
    from vlforge.rl.rewrite import rewrite_reward_file

    (tmp_path / "qa_em.py").write_text(
        "import re\n\ndef compute_score(solution_str, ground_truth):\n"
        "    m = re.search(r'<answer>(.*?)</answer>', solution_str)\n"
        "    return 1.0 if m and m.group(1) == ground_truth else 0.0\n")
    (tmp_path / "wrap.py").write_text(
        "from qa_em import compute_score as em\nimport qa_em\nfrom math_verify_absent import verify\n\n"
        "def by_name(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
        "    return em(solution_str, ground_truth)\n\n"
        "def by_module(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
        "    return qa_em.compute_score(solution_str, ground_truth) + verify(solution_str)\n")
    for function in ("by_name", "by_module"):
        info = inspect_reward(tmp_path / "wrap.py", function)
        assert info.needed == [("<answer>(.*?)</answer>", True)], function
        assert info.files == [tmp_path / "qa_em.py"], function
    source = (tmp_path / "qa_em.py").read_text()
    text, _ = rewrite_reward_file(source, info.spans, info.uses, {"<answer>": "<ans>"}, [])
    assert "r'<ans>(.*?)</answer>'" in text


OTHER_DATA = r'''import re


def answer_in_solution(completions, solution, **kwargs):
    contents = [completion[0]["content"] for completion in completions]
    rewards = []
    for content, sol in zip(contents, solution):
        if "<answer>" in sol:
            sol = sol.split("<answer>")[1]
        gt = re.search(r"<answer>(.*?)</answer>", sol)
        rewards.append(float(content.strip() == (gt.group(1) if gt else sol)))
    return rewards


def truth_tagged(data_source, solution_str, ground_truth, extra_info=None):
    truth = re.search(r"<answer>(.*?)</answer>", ground_truth).group(1)
    return float(truth in solution_str)


def from_kwargs(completions, **kwargs):
    answers = kwargs["answer"]
    return [float("<answer>" in a and a in c) for c, a in zip(completions, answers)]


def completion_tagged(completions, solution, **kwargs):
    return [float(bool(re.search(r"<answer>(.*?)</answer>", c)) and s in c) for c, s in zip(completions, solution)]


def helper(text):
    return "<answer>" in text


def truth_helper(text):
    return "<answer>" in text


def through_a_helper(completions, solution, **kwargs):
    return [float(truth_helper(s)) for s in solution]


def helper_on_the_completion(completions, **kwargs):
    return [float(helper(c)) for c in completions]
'''


def test_a_tag_tested_on_the_ground_truth_or_another_column_is_not_needed_from_the_completion(tmp_path):
    """Visual-ARFT's `"<answer>" in sol`, a regex over verl's ground_truth, a TRL column read from kwargs: the test
    reads the data, not the completion, also in a helper the function calls with the data. A test on the completion
    stays required, in a helper called with it too."""
    (tmp_path / "o.py").write_text(OTHER_DATA)
    for function in ("answer_in_solution", "truth_tagged", "from_kwargs", "through_a_helper"):
        assert _needed(tmp_path / "o.py", function) == [], function
    assert _needed(tmp_path / "o.py", "completion_tagged") == [r"<answer>(.*?)</answer>"]
    assert _needed(tmp_path / "o.py", "helper_on_the_completion") == ["<answer>"]


REVIEWED_SHAPES = r'''import re

FMT = r"<think>.*?</think>\s*<answer>.*?</answer>"
INVALID = "[invalid]"


def one_addition(completions, **kwargs):
    out = []
    for c in completions:
        reward = 0.0
        if re.fullmatch(FMT, c, re.S):
            reward += 1.0
        out.append(reward)
    return out


def counted_pair(completions, **kwargs):
    return [0.0 if c.count("<answer>") + c.count("</answer>") != 2 else 1.0 for c in completions]


def by_source(data_source, solution_str, ground_truth, extra_info=None):
    if "geo3k" in data_source:
        return float(bool(re.fullmatch(r"<think>.*</think>.*\\boxed\{.*\}.*", solution_str, re.S)))
    elif "gsm8k" in data_source:
        return float(bool(re.search(r"<think>.*</think>\s*<answer>(.*)</answer>", solution_str, re.S)))
    return 0.0


def shared_by_branches(completions, **kwargs):
    out = []
    for c in completions:
        if "<think>" in c:
            ok = re.fullmatch(r"<think>.*</think>\s*<answer>.*</answer>", c, re.S)
        elif "<reasoning>" in c:
            ok = re.fullmatch(r"<reasoning>.*</reasoning>\s*<answer>.*</answer>", c, re.S)
        else:
            ok = None
        out.append(1.0 if ok else 0.0)
    return out


def grown_pattern(completions, **kwargs):
    pattern = r"<answer>.*?</answer>"
    pattern = r"<think>.*?</think>\s*" + pattern
    return [float(bool(re.fullmatch(pattern, c, re.S))) for c in completions]


def tagged_truth(completions, solution, **kwargs):
    out = []
    for content, sol in zip(completions, solution):
        sol = f"<answer>{sol.strip()}</answer>"
        out.append(1.0 if sol in content else 0.0)
    return out


def read_directly(data_source, solution_str, ground_truth, extra_info=None):
    m = re.search(r"<answer>(.*?)</answer>", solution_str)
    pred = m.group(1) if m else solution_str
    if m and pred.strip() == ground_truth:
        return 1.0
    return 0.0


def named_constant(data_source, solution_str, ground_truth, extra_info=None):
    m = re.search(r"<answer>(.*?)</answer>", solution_str)
    pred = m.group(1) if m else INVALID
    return float(pred == ground_truth)


def another_name(completions, **kwargs):
    out = []
    for completion in completions:
        text = "<think>" + completion
        out.append(float(bool(re.search(r"^<think>.*</think>", text, re.S))))
    return out


COMPILED = re.compile(r"^<think>.*</think>", re.S)


def compiled_match(completions, **kwargs):
    return [float(bool(COMPILED.match("<think>" + c))) for c in completions]


def logged(completions, **kwargs):
    out = []
    for content in completions:
        ok = re.fullmatch(r"<think>.*?</think>\s*<answer>.*?</answer>", content, re.S)
        if not ok:
            print(f"no <think>/<answer> format in: {content}")
            raise ValueError("missing </answer> in " + content) if content is None else None
        out.append(1.0 if ok else 0.0)
    return out


def extract_answer(s):
    m = re.search(r"<answer>(.*?)</answer>", s)
    return m.group(1) if m else None


def extract_pred(s):
    return extract_answer(s.strip())


def via_helpers(data_source, solution_str, ground_truth, extra_info=None):
    truth = extract_answer(ground_truth) or ground_truth
    return float(extract_pred(solution_str) == truth)


def from_kwargs_only(**kwargs):
    completions = kwargs["completions"]
    return [float(bool(re.fullmatch(r"<answer>.*</answer>", c, re.S))) for c in completions]


def penalty_first(data_source, solution_str, ground_truth, extra_info=None):
    if "<|im_start|>" in solution_str:
        return -1.0
    elif "<answer>" in solution_str:
        return float(solution_str.split("<answer>")[-1].strip() == ground_truth)
    else:
        return 0.0


def exclusive_additions(completions, kind, **kwargs):
    out = []
    for c, k in zip(completions, kind):
        reward = 0.0
        if k == "grounding":
            if re.fullmatch(r"<think>.*</think><answer>\[.*\]</answer>", c, re.S):
                reward += 1.0
        else:
            if re.fullmatch(r"<think>.*</think><answer>.*</answer>", c, re.S):
                reward += 1.0
        out.append(reward)
    return out


def with_a_penalty(completions, **kwargs):
    out = []
    for c in completions:
        score = 0.0
        if re.fullmatch(r"<think>.*</think>", c, re.S):
            score += 1.0
        if len(c) > 2000:
            score -= 0.5
        out.append(score)
    return out


def box_or_zeros(completions, **kwargs):
    out = []
    for c in completions:
        m = re.search(r"<answer>(.*?)</answer>", c)
        box = m.group(1) if m else [0, 0, 0, 0]
        out.append(float(box != [0, 0, 0, 0]))
    return out


def stop_string_put_back(completions, **kwargs):
    out = []
    for text in completions:
        text += "</answer>"
        out.append(float(bool(re.fullmatch(r"<answer>.*</answer>", text, re.S))))
    return out


def normalised_then_chain(data_source, solution_str, ground_truth, extra_info=None):
    text = re.sub(r"\s+", " ", solution_str)
    if "<think>" in text:
        return float(text.endswith("</think> " + ground_truth))
    elif "<reasoning>" in text:
        return float(text.endswith("</reasoning> " + ground_truth))
    return 0.0


def index_loop(completions, solution, **kwargs):
    out = []
    for i in range(len(completions)):
        m = re.search(r"<answer>(.*?)</answer>", solution[i])
        out.append(float(m is not None and m.group(1) in completions[i]))
    return out


class Rewards:
    FORMAT = r"<think>.*</think>"

    @classmethod
    def format_reward(cls, completions, **kwargs):
        return [float(bool(re.fullmatch(cls.FORMAT, c, re.S))) for c in completions]

    @staticmethod
    def clean(text):
        return text.strip()

    @staticmethod
    def accuracy(completions, solution, **kwargs):
        return [float(Rewards.clean(c) == s) for c, s in zip(completions, solution)]
'''


@pytest.mark.parametrize(("function", "tags", "firm"), [
    ("one_addition", ["<think>", "</think>", "<answer>", "</answer>"], True),  # the only term: no partial credit
    ("counted_pair", ["<answer>", "</answer>"], True),  # a sum compared: one test
    ("by_source", ["<think>", "</think>", "<answer>", "</answer>"], True),  # a chain on the data, not the completion
    ("shared_by_branches", ["<answer>", "</answer>"], True),  # what every branch needs
    ("grown_pattern", ["<answer>", "</answer>", "<think>", "</think>"], True),  # a pattern grown, not the completion
    ("tagged_truth", ["<answer>", "</answer>"], True),  # the tags around the answer the completion must hold
    ("read_directly", ["<answer>", "</answer>"], True),  # `if m and ...` reads the match itself
    ("named_constant", ["<answer>", "</answer>"], True),  # a fallback to a module constant
    ("another_name", ["</think>"], True),  # `text = "<think>" + completion`
    ("compiled_match", ["</think>"], True),  # a compiled pattern's match of `"<think>" + c`
    ("Rewards.format_reward", ["<think>", "</think>"], True),  # `cls.FORMAT`
    ("Rewards.accuracy", [], True),  # calls `Rewards.clean`, not the whole class
    ("logged", ["<think>", "</think>", "<answer>", "</answer>"], True),  # a message built from it supplies nothing
    ("via_helpers", ["<answer>", "</answer>"], True),  # extract_answer is also reached with the completion
    ("from_kwargs_only", ["<answer>", "</answer>"], True),  # the completions come in kwargs
    ("penalty_first", ["<answer>"], True),  # a branch that returns a penalty is not a way to score
    ("exclusive_additions", ["<think>", "</think>", "<answer>", "</answer>"], True),  # either branch adds, not both
    ("with_a_penalty", ["<think>", "</think>"], True),  # a penalty is not another term of credit
    ("box_or_zeros", ["<answer>", "</answer>"], True),  # a fallback to a literal list is a constant
    ("stop_string_put_back", ["<answer>"], True),  # text += "</answer>" writes it into the completion
    ("normalised_then_chain", [], True),  # re.sub keeps the completion's origin: a chain on it
    ("index_loop", [], True),  # solution[i] is the data, whatever the index comes from
])
def test_shapes_a_review_found_misread(tmp_path, function, tags, firm):
    (tmp_path / "r.py").write_text(REVIEWED_SHAPES)
    assert _tags(tmp_path / "r.py", function) == tags
    assert (_tags(tmp_path / "r.py", function, firm_only=True) == tags) == firm


def test_a_function_of_no_engines_signature_takes_none_of_its_parameters_for_data(tmp_path):
    """`reward(prompts, completions_text, **kwargs)`: which parameter is the completion is not known, so a tag test of
    any of them stays required; a `(text, ground_truth)` scorer's second parameter is the data."""
    (tmp_path / "u.py").write_text(
        "import re\n\ndef unknown(prompts, completions_text, **kwargs):\n"
        "    return [float(bool(re.search(r'<answer>.*</answer>', c))) for c in completions_text]\n\n"
        "def scorer(predict_str, ground_truth):\n"
        "    return float(bool(re.search(r'<answer>.*</answer>', ground_truth)))\n")
    assert _needed(tmp_path / "u.py", "unknown") == ["<answer>.*</answer>"]
    assert _needed(tmp_path / "u.py", "scorer") == []


def test_a_tag_constant_imported_from_a_module_beside_the_reward_is_read(tmp_path):
    """DeepScaleR's reward (and Skywork-OR1's, rllm's copies) tests `THOUGHT_DELIMITER_END` imported from its
    globals module: the tag is needed (was: none, a dead run read ok), and the rewrite edits the module that holds
    it; a constant loaded twice is one pattern."""
    from vlforge.rl.check import RewardPatterns
    from vlforge.rl.rewrite import rewrite_reward_file

    (tmp_path / "consts.py").write_text('THINK_END = "</think>"\nNOTE = "<b>not a test</b>"\n')
    (tmp_path / "score.py").write_text(
        "from consts import THINK_END, NOTE\nimport consts\n\n"
        "def by_name(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if THINK_END not in solution_str:\n        return 0.0\n"
        "    answer = solution_str.split(THINK_END)[1]\n    print(NOTE)\n"
        "    return float(answer.strip() == ground_truth)\n\n"
        "def by_module(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(consts.THINK_END in solution_str and solution_str.endswith(ground_truth))\n")
    for function in ("by_name", "by_module"):
        info = inspect_reward(tmp_path / "score.py", function)
        assert RewardPatterns.of("r", info).tags([]) == ["</think>"], function
        assert info.files[0] == tmp_path / "consts.py" and info.patterns[0] == "</think>", (function, info.patterns)
    assert inspect_reward(tmp_path / "score.py", "by_name").uses == ["literal", "message"]  # print(NOTE) tests nothing
    source = (tmp_path / "consts.py").read_text()
    text, _ = rewrite_reward_file(source, info.spans, info.uses, {"</think>": "</thinking>"}, [])
    assert text.startswith('THINK_END = "</thinking>"')


FAILING_CUTS = r'''def falls_through(data_source, solution_str, ground_truth, extra_info=None):
    if "</think>" in solution_str:
        return 1.0 if solution_str.split("</think>")[-1].strip() == ground_truth else 0.0
    return 0.0


def cut_in_try(data_source, solution_str, ground_truth, extra_info=None):
    try:
        answer = solution_str.split("<answer>")[1]
    except IndexError:
        return 0.0
    return float(answer.strip() == ground_truth)


def cut_kept(data_source, solution_str, ground_truth, extra_info=None):
    if "</think>" in solution_str:
        return float(solution_str.split("</think>")[-1].strip() == ground_truth)
    return float(solution_str.strip() == ground_truth)
'''


def test_a_cut_whose_failure_scores_is_a_requirement(tmp_path):
    """`if "</think>" in s: return ...` then `return 0.0` (the statements after an `if` that returns are its `else`),
    and a split inside `try` / `except IndexError: return 0.0`: a completion without the tag scores 0. A fall-through
    that scores the whole text keeps it a cut."""
    (tmp_path / "f.py").write_text(FAILING_CUTS)
    assert _needed(tmp_path / "f.py", "falls_through") == ["</think>"]
    assert _needed(tmp_path / "f.py", "cut_in_try") == ["<answer>"]
    assert _needed(tmp_path / "f.py", "cut_kept") == []


EITHER = r'''import re


def absent_both(data_source, solution_str, ground_truth, extra_info=None):
    if "</think>" not in solution_str and "</reasoning>" not in solution_str:
        return 0.0
    return float(solution_str.strip().endswith(ground_truth))


def either_match(completions, **kwargs):
    return [1.0 if re.search(r"<think>.*</think>", c) or re.search(r"<reasoning>.*</reasoning>", c) else 0.0
            for c in completions]


def absent_either(data_source, solution_str, ground_truth, extra_info=None):
    if "<think>" not in solution_str or "</think>" not in solution_str:
        return 0.0
    return 1.0


def present_both(completions, **kwargs):
    return [1.0 if "<think>" in c and "</think>" in c else 0.0 for c in completions]
'''


def test_tests_joined_by_or_need_one_of_their_tags(tmp_path):
    """`if "</think>" not in s and "</reasoning>" not in s: return 0.0` (LIMR, DeepEyes) and `re.search(A) or
    re.search(B)` pass with either tag: neither is needed alone. `not in ... or not in` and `in ... and in` need
    both."""
    (tmp_path / "e.py").write_text(EITHER)

    def tags(function: str) -> list[str]:
        return _tags(tmp_path / "e.py", function)

    assert tags("absent_both") == []
    assert tags("either_match") == []
    assert tags("absent_either") == ["<think>", "</think>"]
    assert tags("present_both") == ["<think>", "</think>"]
