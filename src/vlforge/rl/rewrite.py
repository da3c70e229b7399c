"""``--rewrite-out DIR``: the run's files rewritten so that its format can be learnt.

- tags whose rows are untrained -> the checked trained alternatives of the token audit (``<think>`` ->
  ``<thinking>``), in the reward file's regexes (or the ``--format-regex``), the chat template and the format
  prompt, together (the prompt must ask for the tags the reward checks);
- what the template pre-fills -> optional in the reward's regexes, from its first tag to its last and the
  whitespace it writes after (``^<think>\\n`` -> ``^(?:<think>\\n)?``), so the completion after the pre-fill can
  match; a plain-text test of it
  (``c.startswith("<think>")``) is listed for an edit by hand;
- a special tag the engine's decode strips -> a copy of the tokenizer files with that added token non-special.

Only the string constants that hold the patterns are edited in the reward file (found with :mod:`ast`); the
rest of the file is copied as it is. ``DIR/rewrite.json`` lists each file and what changed.

Example:
    >>> optional_first("^<think>(?!.*<think>)(.*?)</think>", "<think>")
    '^(?:<think>)?(?!.*<think>)(.*?)</think>'
    >>> optional_prefill(r"^<think>\\n.*?\\n</think>\\n<answer>", ["<think>"], "<think>\\n")
    '^(?:<think>\\\\n)?.*?\\\\n</think>\\\\n<answer>'
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from vlforge.errors import ConfigError
from vlforge.outputs import atomic_write_bytes, atomic_write_json, atomic_write_text, check_output_dir
from vlforge.rl.reading import read_source
from vlforge.rl.spec import RunSpec
from vlforge.vocab.templates import rewrite

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json")


def optional_first(pattern: str, tag: str) -> str:
    """``pattern`` with the first occurrence of ``tag`` made optional."""
    at = pattern.find(tag)
    if at < 0:
        return pattern
    return pattern[:at] + f"(?:{tag})?" + pattern[at + len(tag):]


_SPACE_TOKEN = re.compile(r"(?:\\[nrst]| |\n)(?:[*+?]|\{\d*,?\d*\})?\??")
"""One whitespace item of a regex source (``\\n``, ``\\s*``, a space), with its quantifier."""


def _self_contained(span: str) -> bool:
    """``span`` of a regex source can be wrapped in ``(?:...)?``: balanced parentheses, no ``|`` outside them."""
    depth, escaped = 0, False
    for char in span:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                return False
        elif char == "|" and depth == 0:
            return False
    return depth == 0


def optional_prefill(pattern: str, tags: list[str], prefill: str) -> str:
    """``pattern`` with what the pre-fill writes made optional, so the completion after it can match: from the
    first pre-filled tag to the last, and the whitespace after it when the pre-fill ends with whitespace
    (``^<think>\\n.*`` with the pre-fill ``<think>\\n`` -> ``^(?:<think>\\n)?.*``; Qwen3's ``<think>\\n\\n</think>\\n\\n``
    -> the whole think block). Each tag alone at its first place where that span does not stand as one group."""
    return _optional_prefill(pattern, tags, prefill)[0]


def _optional_prefill(pattern: str, tags: list[str], prefill: str) -> tuple[str, bool]:
    """:func:`optional_prefill`, and whether the span made optional holds a capture group (the reward's
    ``match.group(n)`` may then be None)."""
    for tag in (t for t in tags if t not in prefill):  # not written by the pre-fill (a renamed tag): alone
        pattern = optional_first(pattern, tag)
    ordered = sorted((t for t in tags if t in prefill), key=prefill.find)
    start = pattern.find(ordered[0]) if ordered else -1
    last = pattern.find(ordered[-1], start) if start >= 0 else -1
    end = last + len(ordered[-1]) if last >= 0 else -1
    if last >= 0 and prefill[prefill.rfind(ordered[-1]) + len(ordered[-1]):].isspace():
        while match := _SPACE_TOKEN.match(pattern, end):
            end = match.end()
    if last < 0 or not _self_contained(pattern[start:end]):
        for tag in ordered:
            pattern = optional_first(pattern, tag)
        return pattern, False
    span = pattern[start:end]
    return pattern[:start] + f"(?:{span})?" + pattern[end:], re.search(r"(?<!\\)\((?!\?)", span) is not None


def _edit_pattern(text: str, mapping: dict[str, str], optional: list[str], prefill: str = "") -> tuple[str, bool]:
    """``text`` with tags renamed and the pre-filled span optional, and whether that made a capture group optional."""
    text = rewrite(text, mapping)
    if not optional:
        return text, False
    return _optional_prefill(text, [mapping.get(tag, tag) for tag in optional], rewrite(prefill, mapping))


def _offset(lines: list[str], line: int, column: int) -> int:
    """Character offset of (1-based line, UTF-8 byte column) in the joined source."""
    before = sum(len(x) for x in lines[: line - 1])
    return before + len(lines[line - 1].encode()[:column].decode(errors="ignore"))


def rewrite_reward_file(source: str, spans: list[tuple[int, int, int, int]], uses: list[str],
                        mapping: dict[str, str], optional: list[str], prefill: str = ""
                        ) -> tuple[str, list[tuple[int, str]]]:
    """The reward file with only its pattern constants (``spans`` and ``uses`` from
    :func:`~vlforge.rl.reading.inspect_reward`) rewritten: renamed tags everywhere, the pre-filled part made optional
    in regexes only (regex syntax in a plain-text test would never match). Also returns ``(line, why)`` of the edits
    left to a hand: a plain-text test that holds a pre-filled tag (no string makes it pass), a capture group made
    optional."""
    lines = source.splitlines(keepends=True)
    out = source
    manual: list[tuple[int, str]] = []
    for (line, col, end_line, end_col), use in sorted(zip(spans, uses, strict=True), reverse=True):
        start, end = _offset(lines, line, col), _offset(lines, end_line, end_col)
        text = out[start:end]
        regex = use == "regex"
        if regex and text[:1] in "rR":  # r"<\/think>" is the regex r"</think>": the tag can be renamed
            text = text.replace("\\/", "/")
        edited, captures = _edit_pattern(text, mapping, optional if regex else [], prefill)
        if use == "literal" and any(tag in text for tag in optional):
            manual.append((line, "a plain-text test of a pre-filled tag (startswith, in, ==): edit it by hand, no "
                                 "string makes it pass"))
        if captures:
            manual.append((line, "a capture group is now inside the optional pre-filled part: where the reward reads "
                                 "it (match.group(n)), allow None"))
        out = out[:start] + edited + out[end:]
    return out, sorted(manual)


def non_special_tokenizer(src: Path, dst: Path, tags: list[str]) -> None:
    """Copy the tokenizer files of ``src`` to ``dst`` with the added tokens ``tags`` marked non-special."""
    dst.mkdir(parents=True, exist_ok=True)
    copied = False
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            atomic_write_bytes(dst / name, (src / name).read_bytes(), writer="rl check")
            copied = True
    if not copied:
        raise ConfigError(f"{src}: no tokenizer files to rewrite")
    tok = dst / "tokenizer.json"
    if tok.is_file():
        data = json.loads(tok.read_text())
        for entry in data.get("added_tokens", []):
            if entry.get("content") in tags:
                entry["special"] = False
        atomic_write_text(tok, json.dumps(data, ensure_ascii=False), writer="rl check")
    cfg = dst / "tokenizer_config.json"
    if cfg.is_file():
        data = json.loads(cfg.read_text())
        for entry in (data.get("added_tokens_decoder") or {}).values():
            if entry.get("content") in tags:
                entry["special"] = False
        for key in ("additional_special_tokens", "extra_special_tokens"):
            if isinstance(data.get(key), list):
                data[key] = [t for t in data[key] if (t.get("content") if isinstance(t, dict) else t) not in tags]
        atomic_write_text(cfg, json.dumps(data, ensure_ascii=False, indent=1), writer="rl check")
    smap = dst / "special_tokens_map.json"
    if smap.is_file():
        data = json.loads(smap.read_text())
        if isinstance(data.get("additional_special_tokens"), list):
            data["additional_special_tokens"] = [
                t for t in data["additional_special_tokens"] if (t.get("content") if isinstance(t, dict) else t) not in tags]
        atomic_write_text(smap, json.dumps(data, ensure_ascii=False, indent=1), writer="rl check")


def write_rewrites(out: Path, spec: RunSpec, *, tok_dir: Path, template_text: str | None, mapping: dict[str, str],
                   optional: list[str], non_special: list[str], prefill: str = "") -> dict[str, str]:
    """Write the rewritten files into ``out``; return ``{file: what changed}`` (also ``out/rewrite.json``); nothing
    is written when nothing needs a rewrite."""
    from vlforge.rl.reading import inspect_reward

    written: dict[str, str] = {}
    if not (mapping or optional or non_special):  # a healthy run, or one no file rewrite fixes: the report says
        return written
    check_output_dir(out, flag="--rewrite-out", mode="replace")
    out.mkdir(parents=True, exist_ok=True)
    change = "; ".join(filter(None, [
        ", ".join(f"{k} -> {v}" for k, v in mapping.items()),
        ", ".join(f"{mapping.get(t, t)} optional at its first place" for t in optional)]))
    if mapping or optional:
        if spec.format_regex is not None:
            path = out / "format_regex.txt"
            atomic_write_text(path, _edit_pattern(spec.format_regex, mapping, optional, prefill)[0] + "\n",
                              writer="rl check")
            written[str(path)] = change
        else:
            assert spec.reward_file is not None and spec.reward_function is not None
            info = inspect_reward(spec.reward_file, spec.reward_function, tuple(spec.reward_paths))
            names: set[str] = set()
            for file in dict.fromkeys(info.files):  # the function's own file, the modules whose scorers it calls
                mine = [i for i, other in enumerate(info.files) if other == file]
                name = file.name
                while name in names:  # two modules of one name (pkg_a/scores.py, pkg_b/scores.py)
                    name = f"{len(names)}_{file.name}"
                names.add(name)
                path = out / name
                source, encoding = read_source(file)
                text, manual = rewrite_reward_file(source, [info.spans[i] for i in mine], [info.uses[i] for i in mine],
                                                   mapping, optional, prefill)
                if text == source and not manual:
                    continue
                atomic_write_bytes(path, text.encode(encoding), writer="rl check")  # as the file was written
                written[str(path)] = change + "".join(f"; line {line}: {why}" for line, why in manual)
    if mapping and template_text is not None and any(k in template_text for k in mapping):
        path = out / "chat_template.jinja"
        atomic_write_text(path, rewrite(template_text, mapping), writer="rl check")
        written[str(path)] = ", ".join(f"{k} -> {v}" for k, v in mapping.items() if k in template_text)
    if mapping and spec.format_prompt is not None and any(k in spec.format_prompt for k in mapping):
        path = out / "format_prompt.jinja"
        atomic_write_text(path, rewrite(spec.format_prompt, mapping), writer="rl check")
        written[str(path)] = ", ".join(f"{k} -> {v}" for k, v in mapping.items() if k in spec.format_prompt)
    if non_special:
        non_special_tokenizer(tok_dir, out / "tokenizer", non_special)
        written[str(out / "tokenizer")] = f"{', '.join(non_special)} registered as non-special added tokens"
    atomic_write_json(out / "rewrite.json", {"files": written}, writer="rl check")
    return written
