"""``vlforge rl check``: can a GRPO run learn its reward's format? Answered from the files alone, no sampling.

The tags the reward needs (its regexes, or ``--format-regex``) are audited with :mod:`vlforge.vocab.audit` (how
each encodes, whether its embedding rows are trained); then the engine's own handling is applied: a tag with a
special id that the engine's decode strips (``skip_special_tokens=True``) never reaches the reward, and a tag the
chat template already pre-fills in the prompt is not in the completion that verl, EasyR1 and TRL score. Each
problem comes with its fix; ``--rewrite-out DIR`` writes the rewritten reward file / regex, chat template, format
prompt and tokenizer there (:mod:`vlforge.rl.rewrite`).

Example:
    vlforge rl check --model ./Qwen3-VL-4B-Base --engine verl --config ppo.yaml --rewrite-out fixed/
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, Field

from vlforge.rl.engines import engine
from vlforge.rl.reading import Need, RewardInfo
from vlforge.rl.rewards import pattern_literals
from vlforge.rl.spec import RunSpec
from vlforge.rl.stats import VERDICT_EXIT

log = logging.getLogger(__name__)

SCHEMA = "vlforge.rl.check/1"
Verdict = Literal["ok", "weak", "dead"]


class TagReport(BaseModel):
    """One tag the reward needs."""

    tag: str
    ids: list[int]
    pieces: list[str]
    added: list[bool]
    special: list[bool]
    stripped: bool
    """The engine's decode (with this run's skip_special_tokens) drops it before the reward sees the text."""
    prefilled: bool
    """The chat template's generation prompt already holds it."""
    verdict: str
    """The weights verdict of its ids (untrained / weak / trained / unknown)."""
    scores_without: bool = False
    """The reward scores a completion without it too: it reads the whole text when it is missing (``m.group(1) if
    m else text``), or gives partial credit for it (``if "<think>" in t: score += 0.25``)."""


class Problem(BaseModel):
    kind: Literal["untrained", "weak", "stripped", "prefilled", "no-tags"]
    severity: Literal["error", "warning", "note"]
    tags: list[str]
    message: str
    fix: str


class CheckReport(BaseModel):
    schema_version: str = SCHEMA
    engine: str
    model: str
    tokenizer: str
    reward: str
    patterns: list[str]
    """The regexes the tags were read from."""
    skip_special_tokens: bool
    template: str
    """Which chat template: the tokenizer's own, or a file / config key."""
    prefill: str
    """What the template's generation prompt adds after the user turn."""
    sources: dict[str, str]
    tags: list[TagReport]
    problems: list[Problem]
    rewrites: dict[str, str] = Field(default_factory=dict)
    """``--rewrite-out``: file written -> what it changes."""
    audit: dict[str, Any]
    """The token audit (schema vlforge.vocab.audit/2)."""
    verdict: Verdict
    exit_code: int
    notes: list[str] = Field(default_factory=list)


_TOKENIZERS: dict = {}


def read_tokenizer_once(path: Path) -> Any:
    """The tokenizer of ``path``, read once per process while its files are unchanged (a Qwen vocabulary takes
    seconds to parse; the check only reads it)."""
    from vlforge.vocab.tokenizer import load_tokenizer

    files = tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in Path(path).iterdir()
                         if f.is_file() and f.name.startswith(("tokenizer", "vocab", "merges", "special", "added",
                                                                "chat_template"))))
    key = (str(Path(path).resolve()), files)
    if key not in _TOKENIZERS:
        while len(_TOKENIZERS) >= 4:
            _TOKENIZERS.pop(next(iter(_TOKENIZERS)))
        _TOKENIZERS[key] = load_tokenizer(path)
    return _TOKENIZERS[key]


def required_tags(patterns: list[tuple[str, bool]], added: list[str]) -> list[str]:
    """Tags every match of the reward's patterns (``(text, is_regex)``) contains, in order."""
    from vlforge.vocab.templates import find_tags

    out: list[str] = []
    for pattern, is_regex in patterns:
        for run in pattern_literals(pattern, regex=is_regex, added=added):
            for _s, _e, tag in find_tags(run, added):
                if tag not in out:
                    out.append(tag)
    return out


class RewardPatterns(NamedTuple):
    """What the reward is (for the report) and the strings its tags come from."""

    reward: str
    needs: list[Need]
    """The reward file's regexes and plain-text tests of the completion, not the strings it only cuts text with
    (``split("</think>")``) (:attr:`~vlforge.rl.reading.RewardInfo.needs`)."""
    supplied: list[str]
    """Strings the reward adds to the completion's text itself (``completion = "<think>" + completion``)."""

    @classmethod
    def of(cls, reward: str, info: RewardInfo) -> RewardPatterns:
        return cls(reward, info.needs, info.supplied)

    @property
    def needed(self) -> list[tuple[str, bool]]:
        return [(need.text, need.regex) for need in self.needs]

    def tags(self, added: list[str], *, firm_only: bool = False) -> list[str]:
        """The tags a completion must hold (:func:`required_tags`): those of the tests outside any if/elif chain of
        presence tests, and of each chain those every branch tests; less those the reward supplies itself.
        ``firm_only``: without the soft tests (a completion scores without them too)."""
        from vlforge.vocab.templates import find_tags, shared

        needs = [need for need in self.needs if not (firm_only and need.soft)]
        out = required_tags([(n.text, n.regex) for n in needs if n.branch is None], added)
        chains: dict[str, dict[int, list[Need]]] = {}
        scoring: dict[str, int] = {}
        for need in needs:
            if need.branch is not None:
                chain, branch, scoring[need.branch[0]] = need.branch
                chains.setdefault(chain, {}).setdefault(branch, []).append(need)
        for chain, branches in chains.items():  # a failing branch (-1) is no way to score
            tested = [required_tags([(n.text, n.regex) for n in members], added)
                      for branch, members in branches.items() if branch >= 0]
            if not tested or len(tested) < scoring[chain]:
                continue  # a scoring branch that tests no tag: none is needed
            out += [tag for tag in shared(tested) if tag not in out]
        own = {tag for text in self.supplied for _s, _e, tag in find_tags(text, added)}
        return [tag for tag in out if tag not in own]


def reward_patterns(spec: RunSpec) -> RewardPatterns:
    """The reward of ``spec`` and its patterns: ``--format-regex``, or the reward file's (read without running it)."""
    if spec.format_regex is not None:
        return RewardPatterns(f"--format-regex {spec.format_regex}", [Need(spec.format_regex, True)], [])
    from vlforge.rl.reading import inspect_reward

    assert spec.reward_file is not None and spec.reward_function is not None
    info = inspect_reward(spec.reward_file, spec.reward_function, tuple(spec.reward_paths))
    return RewardPatterns.of(f"{spec.reward_file}:{spec.reward_function}", info)


def _trl_text_prompt(spec: RunSpec) -> str | None:
    """The first prompt of a TRL run's local dataset when it is text (TRL tokenizes those without the chat
    template, ``maybe_apply_chat_template``); None for chat prompts, other engines or a file not here."""
    if spec.engine != "trl" or spec.prompts is None or not spec.prompts.is_file():
        return None
    from vlforge.rl.prompts import read_prompts

    row = read_prompts(spec.prompts, engine="trl", prompt_key=spec.prompt_key, limit=1)[0]
    return None if row.conversational else row.messages[0]["content"]


def _prompts_asking_for(spec: RunSpec, tags: list[str], rows: int = 200) -> str | None:
    """A note when the run's local train file still names ``tags`` in its prompts (verl's geo3k prompts ask for
    "<think> </think> tags"): the rewrite changes the reward and template, never the data."""
    if not tags or spec.prompts is None or not spec.prompts.is_file():
        return None
    from vlforge.rl.prompts import read_prompts

    read = read_prompts(spec.prompts, engine=spec.engine, prompt_key=spec.prompt_key, limit=rows)
    texts = [json.dumps(row.messages, ensure_ascii=False) for row in read]
    hits = [tag for tag in tags if any(tag in text for text in texts)]
    if not hits:
        return None
    count = sum(any(tag in text for tag in hits) for text in texts)
    return (f"{spec.prompts}: {count} of its first {len(read)} prompts still ask for {_tags_text(hits)}: the rewrite "
            "changes the reward, template and format prompt, not the data; rewrite those prompts too")


def _tags_text(tags: list[str]) -> str:
    return ",".join(tags)


def run_check(spec: RunSpec, *, rewrite_out: Path | None = None) -> CheckReport:
    """The check of one run (see the module docstring)."""
    from vlforge.models import resolve
    from vlforge.vocab.audit import AuditOptions, run_audit
    from vlforge.vocab.templates import probe_template
    from vlforge.vocab.tokenizer import added_tokens, encode_tag

    record = engine(spec.engine)
    model_dir = resolve(spec.model)
    tok_dir = spec.tokenizer or model_dir
    tok = read_tokenizer_once(Path(tok_dir))
    added = [content for content, _special in added_tokens(tok).values()]
    found = reward_patterns(spec)
    reward, patterns = found.reward, found.needed
    tags = found.tags(added)
    soft = set(tags) - set(found.tags(added, firm_only=True))
    template_text = spec.template_text if spec.template_text is not None else tok.chat_template
    probe = probe_template(tok, template_text, spec.template_vars)
    text_prompt = _trl_text_prompt(spec)
    if text_prompt is not None:  # TRL renders no template for it: the prompt's own end is what the policy continues
        probe = dataclasses.replace(probe, prefill=next((t for t in tags if text_prompt.rstrip().endswith(t)), ""))
    template_source = (str(spec.template) if spec.template is not None
                       else spec.sources.get("template_text") or "the tokenizer's own")

    audit = run_audit(AuditOptions(
        model=model_dir, tokenizer=spec.tokenizer, tags=tags, template_text=template_text,
        template_vars=spec.template_vars), tok=tok)
    by_tag = {f.tag: f for f in audit.findings}
    reports: list[TagReport] = []
    for tag in tags:
        enc = encode_tag(tok, tag)
        finding = by_tag.get(tag)
        reports.append(TagReport(
            tag=tag, ids=enc.ids, pieces=enc.pieces, added=enc.added, special=enc.special,
            stripped=spec.skip_special_tokens and enc.stripped_by_skip_special, prefilled=tag in probe.prefill,
            verdict=finding.verdict if finding is not None else "unknown", scores_without=tag in soft))

    problems: list[Problem] = []
    notes = list(audit.notes)
    if spec.sources.get("reward_file", "").partition(":")[2] == "custom_reward_function.path":
        notes.append("custom_reward_function (top level) is verl's older key: verl 0.9.1's main_ppo reads "
                     "reward.custom_reward_function only and scores with default_compute_score when that is unset "
                     "(its fully-async trainer moves the old key over); set reward.custom_reward_function.path / .name")
    if spec.sources.get("skip_special_tokens") == "flag" and record.skip_key is None and \
            spec.skip_special_tokens != record.skip_special_tokens:
        notes.append(f"{spec.engine}'s own code decodes completions with skip_special_tokens="
                     f"{record.skip_special_tokens} and no setting changes it: the check follows the flag, which "
                     "describes a run with its own decode (a custom reward manager)")
    if text_prompt is not None:
        notes.append(f"TRL passes text prompts as they are (no chat template, so no template pre-fill): {spec.prompts}'s "
                     f"first prompt ends {text_prompt.rstrip()[-40:]!r}")
    if spec.prompts is not None and not spec.prompts.exists():
        notes.append(f"train file {spec.prompts} ({spec.sources.get('prompts', 'flag')}) is not on this machine (a hub "
                     "dataset?): the check reads no prompt; rl probe needs a local copy (--prompts FILE)")
    model_ref = spec.model
    untrained = [r.tag for r in reports if r.verdict == "untrained"]
    template_untrained = [f.tag for f in audit.findings if f.role == "generated" and f.tag not in tags
                          and f.verdict == "untrained"]
    mapping = dict(audit.rewritten.mapping)
    if untrained or template_untrained:
        bad = untrained + template_untrained
        alt = ", ".join(f"{k} -> {v}" for k, v in mapping.items() if k in bad)
        problems.append(Problem(
            kind="untrained", severity="error", tags=bad,
            message=f"{_tags_text(bad)}: embedding rows never trained; the policy (almost) never emits "
                    "them, so the format reward stays 0 for every completion",
            fix=f"vlforge tokens fix --model {model_ref} --out FIXED --tags '{_tags_text(bad)}' (then train "
                "embed_tokens / lm_head)" + (f"; or use trained tags ({alt}): --rewrite-out DIR writes the reward, "
                                             "template and format prompt with them" if alt else "")))
    weak = [r.tag for r in reports if r.verdict == "weak"]
    if weak:
        problems.append(Problem(
            kind="weak", severity="warning", tags=weak,
            message=f"{_tags_text(weak)}: embedding rows look weakly trained; the policy may rarely emit them",
            fix=f"vlforge rl probe ... shows whether completions contain them; vlforge tokens fix --model {model_ref} "
                f"--out FIXED --tags '{_tags_text(weak)}'"))
    stripped = [r.tag for r in reports if r.stripped]
    if stripped:
        how = (f"set {record.skip_key}: false" if record.skip_key else
               f"{spec.engine} always decodes with skip_special_tokens=True")
        problems.append(Problem(
            kind="stripped", severity="error", tags=stripped,
            message=f"{_tags_text(stripped)}: special tokens, and {spec.engine} decodes completions with "
                    "skip_special_tokens=True: the reward never sees them, every completion fails the format",
            fix=f"{how}; or register them as non-special added tokens: --rewrite-out DIR writes DIR/tokenizer "
                "with special=false for them (use it as the run's tokenizer)"))
    prefilled = [r.tag for r in reports if r.prefilled]
    optional = prefilled if len(prefilled) < len(tags) else []  # all pre-filled: an all-optional regex matches anything
    if prefilled and record.reward_sees == "completion":
        problems.append(Problem(
            kind="prefilled", severity="error", tags=prefilled,
            message=f"{_tags_text(prefilled)}: the chat template pre-fills them in the prompt "
                    f"({probe.prefill!r}), and {spec.engine} scores the completion alone: a format that requires "
                    "them there never matches what the model writes after the pre-fill",
            fix=("make the pre-filled tag optional in the reward's regex (--rewrite-out DIR writes it), or render the "
                 "template without the pre-fill" if optional else
                 "the template pre-fills the whole format (e.g. Qwen3's enable_thinking=false): render it without "
                 "the pre-fill (enable_thinking=true, or the run's chat_template_kwargs) or reward another format")))
    elif prefilled:
        notes.append(f"{_tags_text(prefilled)}: pre-filled by the template; {spec.engine} scores prompt + "
                     "completion, so the reward sees them in the prompt part (and may match the prompt itself)")
    if not tags:
        problems.append(Problem(
            kind="no-tags", severity="note", tags=[],
            message=f"the reward ({reward}) names no tag in a regex: nothing to audit from the files",
            fix="vlforge rl probe samples completions and scores them with the reward itself"))
    for problem in problems:
        if problem.severity == "error" and problem.tags and set(problem.tags) <= soft:
            problem.severity = "warning"
            problem.message += ("; but the reward scores a completion without them too (it reads the whole text "
                                "when they are missing, or gives partial credit): the run is weakened, not stopped "
                                "(vlforge rl probe measures the reward spread)")
    verdict: Verdict = ("dead" if any(p.severity == "error" for p in problems)
                        else "weak" if any(p.severity == "warning" for p in problems) else "ok")
    report = CheckReport(
        engine=spec.engine, model=str(spec.model), tokenizer=str(tok_dir), reward=reward,
        patterns=[text for text, _regex in patterns],
        skip_special_tokens=spec.skip_special_tokens, template=template_source, prefill=probe.prefill,
        sources=spec.sources, tags=reports, problems=problems, audit=audit.model_dump(mode="json"),
        verdict=verdict, exit_code=int(VERDICT_EXIT[verdict]), notes=notes)
    if rewrite_out is not None:
        from vlforge.rl.rewrite import write_rewrites

        report.rewrites = write_rewrites(
            rewrite_out, spec, tok_dir=Path(tok_dir), template_text=template_text,
            mapping={k: v for k, v in mapping.items() if k in untrained + template_untrained},
            optional=optional if record.reward_sees == "completion" else [], non_special=stripped,
            prefill=probe.prefill)
        asking = _prompts_asking_for(spec, [k for k in mapping if k in untrained + template_untrained])
        if report.rewrites and asking:
            report.notes.append(asking)
        if not report.rewrites:
            report.notes.append(f"--rewrite-out {rewrite_out}: nothing written: " + (
                "no problem a rewrite of the files fixes (see each problem's fix)" if problems
                else "no untrained, pre-filled or stripped tag"))
    return report
