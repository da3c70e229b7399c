"""``vlforge rl probe``: sample groups of completions as the run will, score them with the run's reward, and say
whether GRPO gets any signal.

For each of ``max_prompts`` prompts, ``samples`` completions come from transformers' ``generate`` on the patched
model (:func:`vlforge.models.load`) with the exact chat template, template variables and format prompt of the
run; each is decoded as the engine decodes it and scored by the user's function in the engine's signature
(:mod:`vlforge.rl.rewards`). The report gives the format-hit rate, the reward mean and spread per group, the share
of groups whose rewards are all equal (GRPO advantage 0), whether each tag came out as its added id or as plain
pieces, and the verdict (:mod:`vlforge.rl.stats`): exit 3 when no group has any spread.

Example:
    vlforge rl probe --model ./Qwen3-VL-4B-Base --engine verl --config ppo.yaml --samples 8 --max-prompts 8 \\
        --max-new-tokens 256 --seed 0
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from vlforge.errors import ConfigError
from vlforge.rl.rewards import Sample
from vlforge.rl.spec import RunSpec
from vlforge.rl.stats import VERDICT_EXIT, GroupStats, group_stats, verdict
from vlforge.tables import progress_bar

log = logging.getLogger(__name__)

SCHEMA = "vlforge.rl.probe/1"
EXAMPLE_CHARS = 300
DEFAULT_NEW_TOKENS = 256
"""Tokens per completion when neither --max-new-tokens, the config nor the engine's known default gives one."""


class TagEmission(BaseModel):
    """How often a tag the reward needs came out, and how."""

    tag: str
    ids: list[int]
    as_ids: int
    """Completions holding the tag's own added id."""
    as_pieces: int
    """Completions holding the tag's text spelt with other ids (plain pieces)."""
    seen_by_reward: int
    """Completions whose text, as the engine decodes it, holds the tag."""


class Example(BaseModel):
    prompt: int
    completion: str
    reward: float | None


class ProbeReport(BaseModel):
    schema_version: str = SCHEMA
    engine: str
    model: str
    reward: str
    samples: int
    prompts: int
    max_new_tokens: int
    temperature: float
    seed: int
    skip_special_tokens: bool
    format: str
    """What a format hit means: ``--format-regex`` searched in the text, or every tag the reward needs present."""
    format_hit_rate: float
    reward_mean: float | None
    groups: list[GroupStats]
    zero_spread_share: float
    tags: list[TagEmission]
    truncated_share: float
    """Completions that reached max_new_tokens without an end token (a format cut off there cannot close)."""
    examples: list[Example]
    seconds: dict[str, float]
    verdict: str
    message: str
    exit_code: int
    notes: list[str] = Field(default_factory=list)


@dataclass
class Sampled:
    """The probe's samples and scores, before the report."""

    groups: list[GroupStats]
    samples: list[list[Sample]]
    rewards: list[list[float]]
    truncated: int
    seconds: float


def _images(row: Any) -> list:
    """The row's images as RGB, from the forms the engines' datasets hold: an image, bytes, a path or ``file://``
    URL, or a dict of them (``{"bytes"}``, ``{"path"}``, verl's and qwen-vl-utils' ``{"image": ...}``)."""
    from io import BytesIO

    from PIL import Image

    from vlforge.data.media import image_error

    out = []
    for item in row.images:
        if isinstance(item, dict):
            given = next((item[key] for key in ("bytes", "image", "path") if item.get(key)), None)
            if given is None:
                raise ConfigError(f"prompt {row.index}: an image {{{', '.join(map(str, item))}}} holds no bytes, "
                                  "image or path")
            item = BytesIO(given) if isinstance(given, (bytes, bytearray)) else given
        if isinstance(item, str):
            if item.startswith(("http://", "https://")):
                raise ConfigError(f"prompt {row.index}: image {item}: vlforge reads no network; use a local copy")
            item = item.removeprefix("file://")
        if isinstance(item, (str, BytesIO)) or hasattr(item, "read"):
            try:
                image = Image.open(item)
                image.load()
            except (OSError, ValueError, Image.DecompressionBombError) as error:
                raise ConfigError(f"prompt {row.index}: cannot read its image ({image_error(error)})") from None
            item = image
        if not hasattr(item, "convert"):
            raise ConfigError(f"prompt {row.index}: an image of type {type(item).__name__} is not one vlforge reads")
        out.append(item.convert("RGB"))
    return out


def render_prompt(tokenizer: Any, processor: Any, row: Any, template_text: str | None, template_vars: dict) -> str:
    """The prompt text the engine generates from: the chat template with the generation prompt, or the text
    itself where the engine renders none (TRL's text prompts)."""
    if not row.templated:
        return row.messages[0]["content"]
    owner = processor if (row.images and processor is not None) else tokenizer
    return owner.apply_chat_template(row.messages, tokenize=False, add_generation_prompt=True,
                                     chat_template=template_text, **template_vars)


def sample_groups(model: Any, tokenizer: Any, processor: Any, rows: list, *, score: Callable[[list[Sample]], list[float]],
                  template_text: str | None, template_vars: dict, skip_special_tokens: bool, samples: int,
                  max_new_tokens: int, temperature: float, seed: int, progress: bool = False,
                  images: list[list] | None = None) -> Sampled:
    """``samples`` completions per row from ``model.generate``, decoded and scored; one group per row. ``images``:
    each row's images already read (else they are read here)."""
    import torch

    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [tokenizer.eos_token_id])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_ids))
    device = next(model.parameters()).device
    bar = progress_bar("probe", len(rows)) if progress else None
    started = time.perf_counter()
    groups, all_samples, all_rewards, truncated = [], [], [], 0
    was_training = model.training
    model.eval()
    try:
        for n, row in enumerate(rows):
            prompt_text = render_prompt(tokenizer, processor, row, template_text, template_vars)
            if row.images and processor is not None:
                inputs = processor(text=[prompt_text], images=images[n] if images is not None else _images(row),
                                   return_tensors="pt")
            else:
                inputs = tokenizer(prompt_text, return_tensors="pt", add_special_tokens=False)
            inputs = {k: v.to(device) if hasattr(v, "to") else v for k, v in inputs.items()}
            torch.manual_seed(seed + n)
            sampling = ({"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
                        if temperature > 0 else {"do_sample": False})
            with torch.no_grad():
                out = model.generate(**inputs, max_new_tokens=max_new_tokens, num_return_sequences=samples,
                                     pad_token_id=pad, eos_token_id=sorted(eos_ids), **sampling)
            start = inputs["input_ids"].shape[1]
            group: list[Sample] = []
            for seq in out[:, start:].tolist():
                ids = []
                for token in seq:
                    ids.append(token)
                    if token in eos_ids:
                        break
                if len(ids) >= max_new_tokens and ids[-1] not in eos_ids:
                    truncated += 1
                group.append(Sample(text=tokenizer.decode(ids, skip_special_tokens=skip_special_tokens), ids=ids,
                                    prompt_text=prompt_text, row=row))
            rewards = score(group)
            groups.append(group_stats(row.index, rewards))
            all_samples.append(group)
            all_rewards.append(rewards)
            (log.debug if bar is not None else log.info)(  # progress: a bar on a terminal, else one line a prompt
                "probe prompt %d/%d: rewards %s", n + 1, len(rows), " ".join(f"{r:.3g}" for r in rewards))
            if bar is not None:
                bar[0].advance(bar[1])
    finally:
        if bar is not None:
            bar[0].stop()
        model.train(was_training)
    return Sampled(groups=groups, samples=all_samples, rewards=all_rewards, truncated=truncated,
                   seconds=time.perf_counter() - started)


def tag_emission(tokenizer: Any, tags: list[str], samples: list[Sample]) -> list[TagEmission]:
    from vlforge.vocab.tokenizer import encode_tag

    out = []
    decoded = [tokenizer.decode(s.ids, skip_special_tokens=False) for s in samples]
    for tag in tags:
        enc = encode_tag(tokenizer, tag)
        own = enc.ids[0] if len(enc.ids) == 1 and enc.added[0] else None
        as_ids = as_pieces = seen = 0
        for s, full in zip(samples, decoded, strict=True):
            has_id = own is not None and own in s.ids
            as_ids += has_id
            as_pieces += (tag in full) and not has_id
            seen += tag in s.text
        out.append(TagEmission(tag=tag, ids=enc.ids, as_ids=as_ids, as_pieces=as_pieces, seen_by_reward=seen))
    return out


def format_hit(text: str, regex: str | None, tags: list[str]) -> bool:
    if regex is not None:
        return re.search(regex, text, re.DOTALL) is not None
    return bool(tags) and all(tag in text for tag in tags)


def regex_scorer(regex: str) -> Callable[[list[Sample]], list[float]]:
    """``--format-regex`` as the reward: 1.0 when it is found in the completion (as the engine decodes it)."""
    compiled = re.compile(regex, re.DOTALL)
    return lambda samples: [1.0 if compiled.search(s.text) else 0.0 for s in samples]


def build_report(spec: RunSpec, sampled: Sampled, *, tokenizer: Any, reward: str, tags: list[str], samples: int,
                 max_new_tokens: int, seed: int, load_seconds: float, notes: list[str]) -> ProbeReport:
    flat = [s for group in sampled.samples for s in group]
    flat_rewards = [r for group in sampled.rewards for r in group]
    hits = sum(format_hit(s.text, spec.format_regex, tags) for s in flat)
    finite = [r for r in flat_rewards if r == r]
    name, share, message = verdict(sampled.groups)
    truncated_share = sampled.truncated / len(flat) if flat else 0.0
    if truncated_share > 0.5 and name != "ok":
        notes.append(f"{truncated_share:.0%} of the completions were cut at --max-new-tokens {max_new_tokens}: a "
                     "format that closes at the end cannot match there; raise it to the run's response length")
    if spec.temperature <= 0:
        notes.append("temperature 0: greedy sampling gives identical completions (no spread by construction)")
    examples = [Example(prompt=group[0].row.index, completion=group[0].text[:EXAMPLE_CHARS], reward=rewards[0])
                for group, rewards in zip(sampled.samples, sampled.rewards, strict=True) if group]
    return ProbeReport(
        engine=spec.engine, model=spec.model, reward=reward, samples=samples, prompts=len(sampled.groups),
        max_new_tokens=max_new_tokens, temperature=spec.temperature, seed=seed,
        skip_special_tokens=spec.skip_special_tokens,
        format=(f"--format-regex {spec.format_regex}" if spec.format_regex is not None
                else f"every tag the reward needs: {', '.join(tags)}" if tags else "no tags: nothing counts as a hit"),
        format_hit_rate=hits / len(flat) if flat else 0.0,
        reward_mean=sum(finite) / len(finite) if finite else None, groups=sampled.groups, zero_spread_share=share,
        tags=tag_emission(tokenizer, tags, flat), truncated_share=truncated_share, examples=examples,
        seconds={"load": round(load_seconds, 2), "sample_and_score": round(sampled.seconds, 2)},
        verdict=name, message=message, exit_code=int(VERDICT_EXIT[name]), notes=notes)


def run_probe(spec: RunSpec, *, samples: int | None, max_prompts: int, max_new_tokens: int | None, seed: int,
              device: str = "cpu", dtype: str = "float32", progress: bool = False) -> ProbeReport:
    """Load the model, sample, score, report."""
    from vlforge.models import load
    from vlforge.models.load import resolve_device
    from vlforge.rl.check import reward_patterns
    from vlforge.rl.engines import engine
    from vlforge.rl.prompts import read_prompts
    from vlforge.rl.reading import inspect_reward
    from vlforge.rl.rewards import load_scorer
    from vlforge.vocab.tokenizer import added_tokens, load_tokenizer

    assert spec.prompts is not None
    target = str(resolve_device(device))  # a CUDA device this torch has not: one line, before anything loads
    group = samples or spec.samples or engine(spec.engine).group_size
    notes: list[str] = []
    if group < 2:
        group = 2
        notes.append(f"{spec.engine}'s group size is 1 here (no --samples, no config value): sampled 2 per prompt; "
                     "GRPO needs a group of several completions per prompt")
    new_tokens = max_new_tokens or spec.max_new_tokens or engine(spec.engine).response_length or DEFAULT_NEW_TOKENS
    rows = read_prompts(spec.prompts, engine=spec.engine, prompt_key=spec.prompt_key, answer_key=spec.answer_key,
                        image_key=spec.image_key, format_prompt=spec.format_prompt, image_dir=spec.image_dir,
                        limit=max_prompts)
    try:  # every prompt's images, before the model loads: a bad one is one line naming the file
        images = [_images(row) for row in rows]
    except ConfigError as error:
        raise ConfigError(f"{spec.prompts}: {error}") from None
    patterns = reward_patterns(spec)
    reward = patterns.reward
    if spec.format_regex is not None:
        score = regex_scorer(spec.format_regex)
    else:
        assert spec.reward_file is not None and spec.reward_function is not None
        info = inspect_reward(spec.reward_file, spec.reward_function, tuple(spec.reward_paths))
        score = load_scorer(spec.engine, info, kwargs=spec.reward_kwargs, extra_paths=spec.reward_paths,
                            reward_type=spec.reward_type, named=(spec.reward_file, spec.reward_function))
    started = time.perf_counter()
    loaded = load(spec.model, dtype=dtype, device=target, processor=any(r.images for r in rows))
    tokenizer = load_tokenizer(spec.tokenizer) if spec.tokenizer is not None else loaded.tokenizer
    if tokenizer is None:
        raise ConfigError(f"{spec.model}: no tokenizer files; pass --tokenizer")
    processor = loaded.processor
    if processor is not None and spec.tokenizer is not None:
        processor.tokenizer = tokenizer
    load_seconds = time.perf_counter() - started
    added = [content for content, _special in added_tokens(tokenizer).values()]
    tags = patterns.tags(added)
    log.info("probe: %d prompts x %d completions, at most %d new tokens, seed %d", len(rows), group, new_tokens, seed)
    sampled = sample_groups(
        loaded.model, tokenizer, processor, rows, score=score, template_text=spec.template_text,
        template_vars=spec.template_vars, skip_special_tokens=spec.skip_special_tokens, samples=group,
        max_new_tokens=new_tokens, temperature=spec.temperature, seed=seed, progress=progress, images=images)
    return build_report(spec, sampled, tokenizer=tokenizer, reward=reward, tags=tags, samples=group,
                        max_new_tokens=new_tokens, seed=seed, load_seconds=load_seconds, notes=notes)
