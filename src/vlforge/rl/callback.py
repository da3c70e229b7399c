"""A TRL ``TrainerCallback`` that refuses to start a GRPO run which cannot learn, and logs the zero-spread share.

At ``on_train_begin`` it samples a small probe with the trainer's own model, processing class, reward functions
(weighted and summed as ``GRPOTrainer`` does) and the first prompts of its train dataset, and raises
:class:`RunCannotLearn` with the verdict's message when no group has any reward spread: the first step never
runs. During training it logs TRL's ``frac_reward_zero_std`` (the share of groups without spread) on the
``vlforge.rl`` logger. TRL is imported only when the callback class is first used (``pip install 'vlforge[trl]'``).

Example:
    >>> from vlforge.rl.callback import PreflightCallback                      # doctest: +SKIP
    >>> trainer = GRPOTrainer(model=model, reward_funcs=[fmt], args=args, train_dataset=ds,
    ...                       callbacks=[PreflightCallback(reward_funcs=[fmt], train_dataset=ds)])  # doctest: +SKIP
    >>> trainer.train()    # raises RunCannotLearn before the first step when every reward is equal  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
from typing import Any

from vlforge.errors import ExitCode, VlforgeError

log = logging.getLogger("vlforge.rl")


class RunCannotLearn(VlforgeError):
    """The probe found no reward spread: GRPO would change no weight."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


def _rows(dataset: Any, limit: int) -> list:
    from vlforge.rl.prompts import PromptRow

    rows = []
    for index in range(min(limit, len(dataset))):
        raw = dict(dataset[index])
        prompt = raw.get("prompt")
        conversational = isinstance(prompt, list)
        messages = [dict(m) for m in prompt] if conversational else [{"role": "user", "content": str(prompt)}]
        rows.append(PromptRow(index=index, messages=messages, conversational=conversational,
                              columns={k: v for k, v in raw.items() if k != "prompt"}, templated=conversational))
    return rows


def _trl_score(reward_funcs: list, weights: list[float] | None):
    """The trainer's rewards summed with its weights (NaN-skipping, as GRPOTrainer does), via TRL's signature."""
    from vlforge.rl.reading import RewardInfo
    from vlforge.rl.rewards import Scorer

    scorers = [Scorer(engine="trl", fn=fn, info=RewardInfo(file=__file__, function=getattr(fn, "__name__", "reward"),
                                                            params=[], var_keyword=True, patterns=[]))
               for fn in reward_funcs]
    weights = weights or [1.0] * len(scorers)

    def score(samples: list) -> list[float]:
        columns = [scorer(samples) for scorer in scorers]
        out = []
        for values in zip(*columns, strict=True):
            finite = [w * v for w, v in zip(weights, values, strict=True) if not math.isnan(v)]
            out.append(sum(finite) if finite else math.nan)
        return out

    return score


def _callback_class():
    from transformers import TrainerCallback

    class _Preflight(TrainerCallback):
        def __init__(self, reward_funcs: list, train_dataset: Any, *, samples: int = 4, max_prompts: int = 4,
                     max_new_tokens: int = 32, seed: int = 0, temperature: float | None = None,
                     reward_weights: list[float] | None = None, skip_special_tokens: bool = True) -> None:
            if any(not callable(f) or hasattr(f, "forward") for f in reward_funcs):
                raise VlforgeError("PreflightCallback: reward_funcs must be plain functions (reward models are "
                                   "not probed)")
            self.reward_funcs, self.dataset = list(reward_funcs), train_dataset
            self.samples, self.max_prompts, self.max_new_tokens, self.seed = samples, max_prompts, max_new_tokens, seed
            self.temperature, self.weights, self.skip = temperature, reward_weights, skip_special_tokens
            self.report: Any = None

        def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
            from vlforge.rl.probe import sample_groups
            from vlforge.rl.stats import verdict

            tokenizer = getattr(processing_class, "tokenizer", processing_class)
            processor = processing_class if tokenizer is not processing_class else None
            temperature = self.temperature if self.temperature is not None else getattr(args, "temperature", 1.0)
            template_vars = getattr(args, "chat_template_kwargs", None) or {}
            sampled = sample_groups(
                model, tokenizer, processor, _rows(self.dataset, self.max_prompts),
                score=_trl_score(self.reward_funcs, self.weights or getattr(args, "reward_weights", None)),
                template_text=None, template_vars=template_vars, skip_special_tokens=self.skip, samples=self.samples,
                max_new_tokens=self.max_new_tokens, temperature=temperature, seed=self.seed)
            name, share, message = verdict(sampled.groups)
            self.report = {"verdict": name, "zero_spread_share": share, "message": message,
                           "groups": [g.model_dump() for g in sampled.groups]}
            log.info("rl pre-flight: %s (%d prompts x %d completions, %.1f s): %s", name, len(sampled.groups),
                     self.samples, sampled.seconds, message)
            if name == "dead":
                control.should_training_stop = True
                raise RunCannotLearn(f"vlforge rl pre-flight: this GRPO run cannot learn: {message}", self.report)
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            share = (logs or {}).get("frac_reward_zero_std")
            if share is not None:
                log.info("step %d: %.0f%% of the groups have no reward spread (advantage 0)", state.global_step,
                         100 * share)
            return control

    return _Preflight


_CLASS: Any = None


def __getattr__(name: str) -> Any:
    global _CLASS
    if name == "PreflightCallback":
        if _CLASS is None:
            _CLASS = _callback_class()
            _CLASS.__name__ = _CLASS.__qualname__ = "PreflightCallback"
            _CLASS.__module__ = __name__
        return _CLASS
    raise AttributeError(name)
