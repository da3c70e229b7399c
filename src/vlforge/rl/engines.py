"""What each RL engine does between a rollout and its reward, as read from its released source.

One record per engine: how it decodes a completion (``skip_special_tokens``), what text the reward sees (the
completion alone, or the prompt and the completion), how it calls the reward function, its default group size,
and the source files these facts were read from (docs/rl.md cites them).

Example:
    >>> from vlforge.rl.engines import engine
    >>> engine("verl").skip_special_tokens, engine("openrlhf").reward_sees
    (True, 'prompt+completion')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vlforge.errors import ConfigError, did_you_mean

Signature = Literal["trl", "verl", "easyr1", "openrlhf"]


@dataclass(frozen=True)
class Engine:
    """One engine's decode and reward conventions."""

    name: Signature
    version: str
    """The release these facts were read from."""
    skip_special_tokens: bool
    """What the engine decodes completions with before its reward sees them."""
    skip_key: str | None
    """The config key that changes it, where there is one."""
    reward_sees: Literal["completion", "prompt+completion"]
    call: str
    """How the reward function is called."""
    default_function: str | None
    """The function name the engine uses when the config names none."""
    group_size: int
    """Completions per prompt when the config says nothing."""
    response_length: int | None
    """Tokens per completion when the config says nothing (None: not read from its source)."""
    sources: tuple[str, ...]


ENGINES: dict[str, Engine] = {
    "trl": Engine(
        "trl", "1.16.0", True, None, "completion",
        "f(prompts=..., completions=..., completion_ids=..., **dataset_columns) -> list[float | None]; "
        "conversational completions are [[{'role': 'assistant', 'content': text}]]",
        None, 8, 512,
        ("trl/trainer/grpo_trainer.py (_generate_and_score_completions: batch_decode(skip_special_tokens=True); "
         "_calculate_rewards)", "trl/trainer/grpo_config.py (num_generations, max_completion_length, "
         "chat_template_kwargs, their defaults)", "trl/scripts/grpo.py (reward_funcs: registry names or module.function)",
         "trl/rewards/format_rewards.py (think_format_reward)")),
    "verl": Engine(
        "verl", "0.9.1", True, None, "completion",
        "compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs) -> "
        "float | dict with 'score'; verl's built-in scorers (reward_score/geo3k.py, gsm8k.py) take "
        "(solution_str, ground_truth) positionally",
        "compute_score", 1, 512,
        ("verl/experimental/reward_loop/reward_manager/naive.py (decode(skip_special_tokens=True), the call)",
         "verl/trainer/ppo/reward.py (reward.custom_reward_function.path/name/reward_kwargs)",
         "verl/trainer/config/_generated_ppo_trainer.yaml (data.prompt_key, data.train_files, "
         "actor_rollout_ref.rollout.n, data.apply_chat_template_kwargs, data.max_response_length)",
         "verl/utils/reward_score/__init__.py, geo3k.py")),
    "easyr1": Engine(
        "easyr1", "main@b44b311", True, "worker.reward.skip_special_tokens", "completion",
        "compute_score(reward_inputs: list[dict(response, response_length, ground_truth)], **kwargs) -> "
        "list[dict with 'overall']; REWARD_TYPE = 'sequential' in the file: one dict in, one dict out",
        "main", 1, 512,
        ("verl/workers/reward/function.py (AutoRewardManager, BatchFunctionRewardManagerMixin)",
         "verl/workers/reward/config.py (reward_function 'path:name', skip_special_tokens: True)",
         "verl/utils/dataset.py (format_prompt jinja rendered with content=, override_chat_template)",
         "verl/trainer/config.py (DataConfig: max_response_length 512)",
         "examples/config.yaml, examples/reward_function/math.py, examples/format_prompt/math.jinja")),
    "openrlhf": Engine(
        "openrlhf", "0.11.2", False, None, "prompt+completion",
        "reward_func(queries, prompts, labels) -> dict with 'rewards' (and 'scores', 'extra_logs') or a "
        "sequence; queries are prompt + completion decoded with skip_special_tokens=False",
        "reward_func", 1, None,
        ("openrlhf/utils/agent.py (SingleTurnAgentExecutor: the .py reward file, reward_func(queries, prompts, "
         "labels), query = decode(observation_tokens, skip_special_tokens=False))",
         "openrlhf/cli/train_ppo_ray.py (--data.input_key, --data.label_key, --data.apply_chat_template)")),
}
NAMES = tuple(ENGINES)


def engine(name: str) -> Engine:
    """The engine record; an unknown name is one line listing the known ones."""
    if name not in ENGINES:
        raise ConfigError(f"--engine {name!r}: unknown engine{did_you_mean(name, ENGINES)} "
                          f"(known: {', '.join(NAMES)})")
    return ENGINES[name]
