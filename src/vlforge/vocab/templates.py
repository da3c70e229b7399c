"""Where tags come from: chat templates (generated vs prefilled parts), reward regexes, built-in formats.

A chat template is probed by rendering one user turn three ways: without a generation prompt (the
context), with one (what the template *prefills* for the assistant), and with an assistant answer (what
the policy must *generate*: the answer minus the prefill). Tags are ``<name>``, ``</name>``, ``<|name|>``
or any added token of the tokenizer.

Example:
    >>> from vlforge.vocab.templates import regex_tags
    >>> regex_tags(r"^<think>\\n.*?</think>\\s*<answer>(.*?)</answer>$", added=[])
    ['<think>', '</think>', '<answer>', '</answer>']
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from vlforge.errors import VlforgeError

try:  # the regex parser of the standard library
    import re._constants as _constants
    import re._parser as _parser
except ImportError:  # Python 3.10
    import sre_constants as _constants  # type: ignore[no-redef]
    import sre_parse as _parser  # type: ignore[no-redef]

TAG_RE = re.compile(r"<\|[^<>|\s]{1,64}\|>|</?[A-Za-z_][\w\-.:]{0,63}>")
PROBE_USER = "VLFORGE_PROBE_QUESTION"
PROBE_ANSWER = "VLFORGE_PROBE_ANSWER"
ROLE_ORDER = ("generated", "prefilled", "prompt", "unexercised")


class TemplateError(VlforgeError, ValueError):
    """A chat template, reward regex or format name cannot be used."""


@dataclass(frozen=True)
class Format:
    """A built-in response format: its tags, a sample response and the reward regex that checks it."""

    name: str
    description: str
    sample: str
    regex: str


FORMATS: dict[str, Format] = {
    "r1": Format(
        name="r1",
        description="DeepSeek-R1 / Zero-RL style: <think>reasoning</think><answer>answer</answer>",
        sample="<think>\nLet me work it out step by step.\n</think>\n<answer>\n42\n</answer>",
        regex=r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$",
    ),
}


@dataclass
class TagUse:
    """One tag, where it was found and the ids it occupies in context (generated or prefilled text)."""

    tag: str
    roles: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    context_ids: list[int] = field(default_factory=list)

    @property
    def role(self) -> str:
        return min(self.roles, key=ROLE_ORDER.index) if self.roles else "generated"

    def add(self, role: str, source: str, ids: list[int] | None = None) -> None:
        if role not in self.roles:
            self.roles.append(role)
        if source not in self.sources:
            self.sources.append(source)
        for i in ids or []:
            if i not in self.context_ids:
                self.context_ids.append(i)


def find_tags(text: str, added: list[str]) -> list[tuple[int, int, str]]:
    """``(start, end, tag)`` of every tag in ``text``: added-token contents first, then tag-shaped text."""
    spans: list[tuple[int, int, str]] = []
    taken = [False] * len(text)
    for content in sorted({a for a in added if a}, key=len, reverse=True):
        for m in re.finditer(re.escape(content), text):
            if not any(taken[m.start():m.end()]):
                spans.append((m.start(), m.end(), content))
                taken[m.start():m.end()] = [True] * (m.end() - m.start())
    for m in TAG_RE.finditer(text):
        if not any(taken[m.start():m.end()]):
            spans.append((m.start(), m.end(), m.group(0)))
    return sorted(spans)


def context_ids(tok, text: str, spans: list[tuple[int, int, str]]) -> dict[str, list[int]]:
    """Ids of the tokens overlapping each tag span when ``text`` is tokenized as a whole."""
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    out: dict[str, list[int]] = {}
    for start, end, tag in spans:
        ids = [i for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
               if a < end and b > start]
        bucket = out.setdefault(tag, [])
        bucket.extend(i for i in ids if i not in bucket)
    return out


def _render(tok, template: str | None, messages: list[dict], generation: bool, variables: dict) -> str:
    try:
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation,
                                       chat_template=template, **variables)
    except Exception as error:  # jinja raises many types; the user needs the message, not the class
        raise TemplateError(f"chat template cannot be rendered ({type(error).__name__}: {error})") from error


@dataclass
class TemplateProbe:
    """The three renders of a template and the split between prompt, prefill and generated text."""

    context: str
    prefill: str
    generated: str
    full: str


def probe_template(tok, template: str | None, variables: dict | None = None) -> TemplateProbe:
    """Render the template around one user turn and split off what the policy must generate."""
    variables = variables or {}
    if template is None and not getattr(tok, "chat_template", None):
        raise TemplateError("the tokenizer has no chat template; pass --template FILE, --tags or --format")
    user = [{"role": "user", "content": PROBE_USER}]
    context = _render(tok, template, user, False, variables)
    prompt = _render(tok, template, user, True, variables)
    full = _render(tok, template, [*user, {"role": "assistant", "content": PROBE_ANSWER}], False, variables)
    if not prompt.startswith(context) or not full.startswith(context):
        raise TemplateError("chat template renders the conversation differently once an answer is added")
    prefill = prompt[len(context):]
    answer = full[len(context):]
    if answer.startswith(prefill):
        generated = answer[len(prefill):]
    else:  # the answer render differs from the prefill: only the shared head is prefilled
        common = 0
        while common < min(len(prefill), len(answer)) and prefill[common] == answer[common]:
            common += 1
        generated = answer[common:]
    return TemplateProbe(context=context, prefill=prefill, generated=generated, full=full)


def template_tags(tok, template: str | None, variables: dict | None, source: str,
                  added: list[str]) -> tuple[dict[str, TagUse], TemplateProbe]:
    """Tags of a chat template with their roles (generated / prefilled / prompt / unexercised)."""
    probe = probe_template(tok, template, variables)
    uses: dict[str, TagUse] = {}
    full = probe.full
    gen_start = len(full) - len(probe.generated)
    prefill_start = len(probe.context)
    spans = find_tags(full, added)
    ids = context_ids(tok, full, spans)
    for start, _end, tag in spans:
        if start >= gen_start:
            role = "generated"
        elif start >= prefill_start:
            role = "prefilled"
        else:
            role = "prompt"
        uses.setdefault(tag, TagUse(tag)).add(role, source, ids.get(tag) if role != "prompt" else None)
    # the prefill as the generation prompt renders it (it may differ from the answer's head)
    for _start, _end, tag in find_tags(probe.prefill, added):
        uses.setdefault(tag, TagUse(tag)).add("prefilled", source)
    source_text = template if template is not None else tok.chat_template
    for _start, _end, tag in find_tags(source_text if isinstance(source_text, str) else "", added):
        uses.setdefault(tag, TagUse(tag)).add("unexercised", source)
    return uses, probe


def _literal_runs(parsed, runs: list[str], current: list[str], required_only: bool = False,
                  added: list[str] | None = None) -> None:
    c = _constants
    repeats = tuple(getattr(c, n) for n in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(c, n))
    for op, av in parsed:
        if op is c.LITERAL:
            current.append(chr(av))
            continue
        if op is c.AT:  # anchors produce no text
            continue
        if op is c.BRANCH:  # the parser factors a common prefix out of the branches: carry it into each
            prefix = list(current)
            current.clear()
            alternatives: list[list[str]] = []
            for branch in av[1]:
                own: list[str] = []
                carried = list(prefix)
                _literal_runs(branch, own, carried, required_only, added)
                if carried:
                    own.append("".join(carried))
                alternatives.append(own)
            runs.extend(_shared_tags(alternatives, added or []) if required_only else
                        [run for own in alternatives for run in own])
            continue
        if current:
            runs.append("".join(current))
            current.clear()
        if op is c.SUBPATTERN:
            _literal_runs(av[-1], runs, current, required_only, added)
        elif op in repeats:
            if not (required_only and av[0] == 0):  # ``(?:<think>)?``: a match need not hold it
                _literal_runs(av[2], runs, current, required_only, added)
        elif op is getattr(c, "ATOMIC_GROUP", None):
            _literal_runs(av, runs, current, required_only, added)
        elif op is c.ASSERT:  # ``(?=.*<think>)``: every match is followed (or preceded) by its text
            _literal_runs(av[1], runs, current, required_only, added)
        if current:
            runs.append("".join(current))
            current.clear()


def _shared_tags(alternatives: list[list[str]], added: list[str]) -> list[str]:
    """The tags (:func:`find_tags`) every alternative's runs hold (:func:`shared`)."""
    return shared([[tag for run in runs for _s, _e, tag in find_tags(run, added)] for runs in alternatives])


def shared(alternatives: list[list[str]]) -> list[str]:
    """What every alternative holds, in the first one's order: what a match (or a completion) holds whichever
    alternative it takes.

    Example:
        >>> shared([["<think>", "<answer>"], ["<answer>", "<reasoning>"]])
        ['<answer>']
    """
    return [tag for tag in dict.fromkeys(alternatives[0]) if all(tag in other for other in alternatives[1:])]


def regex_literals(pattern: str, *, required_only: bool = False, added: list[str] | None = None) -> list[str]:
    """Maximal runs of literal text in a regular expression; ``required_only``: only those every match must contain
    (not inside an optional group or a ``*`` repeat; of an alternation, only the tags - added-token contents in
    ``added``, tag-shaped text - that every alternative holds)."""
    try:
        parsed = _parser.parse(pattern)
    except re.error as error:
        raise TemplateError(f"reward regex {pattern!r} does not compile: {error}") from error
    runs: list[str] = []
    current: list[str] = []
    _literal_runs(parsed, runs, current, required_only, added)
    if current:
        runs.append("".join(current))
    return [r for r in runs if r]


def regex_tags(pattern: str, added: list[str]) -> list[str]:
    """Tags (tag-shaped literals or added tokens) a reward regex requires, in order, without repeats."""
    out: list[str] = []
    for run in regex_literals(pattern):
        for _s, _e, tag in find_tags(run, added):
            if tag not in out:
                out.append(tag)
    return out


def get_format(name: str) -> Format:
    """A built-in format by name (``r1``)."""
    if name not in FORMATS:
        raise TemplateError(f"unknown format {name!r}; known: {', '.join(sorted(FORMATS))}")
    return FORMATS[name]


def rewrite(text: str, mapping: dict[str, str]) -> str:
    """Replace every occurrence of each key of ``mapping`` (longest first, in one pass)."""
    if not mapping:
        return text
    pattern = re.compile("|".join(re.escape(k) for k in sorted(mapping, key=len, reverse=True)))
    return pattern.sub(lambda m: mapping[m.group(0)], text)
