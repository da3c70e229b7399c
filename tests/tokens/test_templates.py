"""Template probing (generated vs prefilled), reward-regex parsing, built-in formats, rewrites."""

from __future__ import annotations

import re

import pytest

from vlforge.vocab.templates import (
    FORMATS,
    TemplateError,
    find_tags,
    probe_template,
    regex_literals,
    regex_tags,
    rewrite,
    template_tags,
)
from vlforge.vocab.tokenizer import added_tokens


def _added(tok) -> list[str]:
    return [c for c, _ in added_tokens(tok).values()]


def test_qwen3_non_thinking_prefills_think(qwen3_tok):
    uses, probe = template_tags(qwen3_tok, None, {"enable_thinking": False}, "template", _added(qwen3_tok))
    assert probe.prefill.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "<think>" not in probe.generated and probe.generated.endswith("<|im_end|>\n")
    assert uses["<think>"].role == "prefilled" and uses["</think>"].role == "prefilled"
    assert uses["<|im_end|>"].role == "generated"
    assert 151645 in uses["<|im_end|>"].context_ids
    assert uses["<|im_start|>"].role in ("prefilled", "prompt")
    assert uses["<tool_call>"].role == "unexercised"  # only rendered when tools are given


def test_qwen3_thinking_mode_generates_think(qwen3_tok):
    uses, probe = template_tags(qwen3_tok, None, {}, "template", _added(qwen3_tok))
    assert probe.prefill == "<|im_start|>assistant\n"
    assert probe.generated.startswith("<think>")
    assert uses["<think>"].role == "generated" and uses["<think>"].context_ids == [151667]
    assert uses["</think>"].role == "generated" and uses["</think>"].context_ids == [151668]


def test_custom_template_with_prefilled_open_tag(qwen3_tok):
    template = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant: <reasoning>{% endif %}")
    probe = probe_template(qwen3_tok, template)
    assert probe.prefill == "assistant: <reasoning>"
    uses, _ = template_tags(qwen3_tok, template, {}, "template", [])
    # the answer render has no <reasoning>: the common head "assistant: " is the only shared prefill
    assert uses["<reasoning>"].role == "prefilled"


def test_template_without_any_template_errors(qwen3_tok):
    saved = qwen3_tok.chat_template
    qwen3_tok.chat_template = None
    try:
        with pytest.raises(TemplateError, match="no chat template"):
            probe_template(qwen3_tok, None)
    finally:
        qwen3_tok.chat_template = saved


@pytest.mark.parametrize(("pattern", "tags"), [
    (r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", ["<think>", "</think>", "<answer>", "</answer>"]),
    (r"(?s)<think>(?:.|\n)*</think>|<\|im_end\|>", ["<think>", "</think>", "<|im_end|>"]),
    (r"^\s*<reasoning>(.+?)</reasoning>\s*\\boxed\{.+\}$", ["<reasoning>", "</reasoning>"]),
    (r"<answer>\d+</answer>", ["<answer>", "</answer>"]),
])
def test_regex_tags(pattern, tags):
    assert regex_tags(pattern, added=[]) == tags


def test_regex_literals_and_errors():
    assert regex_literals(r"\\boxed\{(.*)\}") == ["\\boxed{", "}"]
    with pytest.raises(TemplateError, match="does not compile"):
        regex_literals("<think>(")


def test_r1_format_and_rewrite():
    fmt = FORMATS["r1"]
    assert re.match(fmt.regex, fmt.sample, re.DOTALL)
    assert [t for _s, _e, t in find_tags(fmt.sample, [])] == ["<think>", "</think>", "<answer>", "</answer>"]
    mapping = {"<think>": "<thinking>", "</think>": "</thinking>"}
    new_sample, new_regex = rewrite(fmt.sample, mapping), rewrite(fmt.regex, mapping)
    assert "<think>" not in new_sample and new_sample.count("thinking>") == 2
    assert re.match(new_regex, new_sample, re.DOTALL) and not re.match(new_regex, fmt.sample, re.DOTALL)
