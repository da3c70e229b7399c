"""Alternatives for problem tags, accepted only when every piece they encode into is ``trained``.

A tag family is the set of audited tags sharing a name (``<think>`` and ``</think>``). Each candidate
name is substituted into every member and encoded alone, between newlines and after a space; the
candidate is kept when every id of the tag alone has the verdict ``trained`` and no id of the
contexts is ``untrained``.

Example:
    >>> from vlforge.vocab.suggest import tag_parts, candidate_names
    >>> tag_parts("</think>")
    ('</', 'think', '>')
    >>> candidate_names("think")[:3]
    ['thinking', 'reasoning', 'reason']
"""

from __future__ import annotations

import re

from vlforge.vocab.detect import TRAINED

ALTERNATIVES: dict[str, list[str]] = {
    "think": ["thinking", "reasoning", "reason", "thought", "thoughts", "analysis", "scratchpad"],
    "thinking": ["reasoning", "thought", "analysis"],
    "reasoning": ["thinking", "reason", "thought", "analysis"],
    "answer": ["answer_text", "final_answer", "final", "response", "solution", "result"],
    "tool_call": ["function_call", "tool_use", "call", "action"],
    "tool_response": ["tool_result", "function_result", "observation"],
    "reflection": ["review", "check", "verify"],
    "summary": ["summarize", "conclusion", "recap"],
}
_PARTS = re.compile(r"^(<\|?/?)(.+?)(\|?>)$")
CONTEXTS = ("{}", "\n{}\n", " {}")


def tag_parts(tag: str) -> tuple[str, str, str]:
    """Split a tag into its opening, name and closing parts (``('', tag, '')`` if not tag-shaped)."""
    m = _PARTS.match(tag)
    return (m.group(1), m.group(2), m.group(3)) if m else ("", tag, "")


def candidate_names(name: str) -> list[str]:
    """Alternative names to try for a tag name, most natural first."""
    base = name.lower()
    out = [*ALTERNATIVES.get(base, []), f"{base}ing" if not base.endswith("ing") else f"{base}_text",
           f"{base}_text", f"final_{base}", f"{base}s", f"my_{base}"]
    seen: list[str] = []
    for cand in out:
        if cand != base and cand not in seen:
            seen.append(cand)
    return seen


def _plain(prefix: str, suffix: str) -> tuple[str, str]:
    """Special-token style ``<|x|>`` becomes plain ``<x>``: the ``|`` forms are usually added tokens."""
    return prefix.replace("|", ""), suffix.replace("|", "")


def check_encoding(tok, text: str, verdicts: list[str]) -> dict:
    """Ids, pieces and verdicts of ``text`` alone and in each context.

    ``ok`` when every id of the text alone is ``trained`` and no id of the contexts (newline / space
    merges such as ``>\\n``) is ``untrained``; weak context ids are listed in ``context_weak``.
    """
    def verdict(i: int) -> str:
        return verdicts[i] if i < len(verdicts) else "untrained"

    alone = list(tok.encode(text, add_special_tokens=False))
    ids: list[int] = []
    for ctx in CONTEXTS:
        for i in tok.encode(ctx.format(text), add_special_tokens=False):
            if i not in ids:
                ids.append(i)
    marks = [verdict(i) for i in ids]
    ok = all(verdict(i) == TRAINED for i in alone) and "untrained" not in marks
    return {
        "tag": text, "ids": alone, "pieces": [str(p) for p in tok.convert_ids_to_tokens(alone)],
        "checked_ids": ids, "verdicts": marks, "ok": ok,
        "context_weak": [i for i, m in zip(ids, marks, strict=True) if m != TRAINED],
    }


def suggest(tok, problem_tags: list[str], all_tags: list[str], verdicts: list[str],
            limit: int = 3) -> list[dict]:
    """For each problem tag family, up to ``limit`` checked alternatives (``{old: new}`` per member)."""
    families: dict[str, list[str]] = {}
    for tag in all_tags:
        families.setdefault(tag_parts(tag)[1], []).append(tag)
    out = []
    done: set[str] = set()
    for tag in problem_tags:
        name = tag_parts(tag)[1]
        if name in done:
            continue
        done.add(name)
        members = families.get(name, [tag])
        accepted = []
        for cand in candidate_names(name):
            mapping, checks = {}, []
            for member in members:
                prefix, _, suffix = tag_parts(member)
                prefix, suffix = _plain(prefix, suffix)
                mapping[member] = f"{prefix}{cand}{suffix}"
                checks.append(check_encoding(tok, mapping[member], verdicts))
            if all(c["ok"] for c in checks) and all(
                c["ids"] != list(tok.encode(m, add_special_tokens=False)) for c, m in zip(checks, members, strict=True)
            ):
                accepted.append({"name": cand, "mapping": mapping, "checks": checks})
            if len(accepted) >= limit:
                break
        out.append({"family": name, "tags": members, "alternatives": accepted})
    return out
