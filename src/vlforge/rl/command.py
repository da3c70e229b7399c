"""``vlforge rl check | probe`` as :class:`~vlforge.command.Job` s: the run's flags as one options model (the
probe's adds its sampling flags), resolved against the engine's config and checked before torch loads.

Example:
    vlforge rl check --model ./Qwen3-VL-4B-Base --engine verl --config ppo.yaml
    vlforge rl check -- python3 -m verl.trainer.main_ppo data.train_files=geo3k.parquet actor_rollout_ref.model.path=...
    vlforge rl check --model tiny:qwen3_vl --format-regex '^<think>.*</think>' --json
    vlforge rl probe --model ./ckpt --reward rewards.py:format_reward --prompts prompts.jsonl --samples 8 --seed 0
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from vlforge.command import Cli, Job
from vlforge.errors import ConfigError
from vlforge.flags import Arg, Flag, key_values
from vlforge.outputs import check_output_dir
from vlforge.strict import StrictModel


class RunFlags(StrictModel):
    """The run both commands look at: what the engine will use."""

    unknown_label = "option"
    model: Annotated[str | None, Flag("--model", "-m")] = None
    """Checkpoint dir, tiny:FAMILY or hub id (default: the one --config names)."""
    engine: str | None = None
    """trl, verl, easyr1 or openrlhf (default: from the reward's signature, else trl)."""
    config: Path | None = None
    """The engine's own config (verl / EasyR1 YAML, TRL GRPO YAML or JSON); needs --engine."""
    launch: Annotated[list[str], Arg()] = Field(default_factory=list)
    """After --: the engine's launch command or its arguments (verl / EasyR1 KEY=VALUE overrides, TRL flags)."""
    tokenizer: Path | None = None
    """Tokenizer directory (default: the model's)."""
    template: Path | None = None
    """Chat template file (default: the config's, else the tokenizer's own)."""
    template_vars: Annotated[list[str], Flag("--template-var")] = Field(default_factory=list)
    """Chat template variable KEY=VALUE, e.g. enable_thinking=false (repeatable)."""
    format_prompt: Path | None = None
    """EasyR1 format prompt (jinja with {{ content }}) around each prompt."""
    prompts: Path | None = None
    """Prompts: parquet (verl), JSON or JSONL (default: the config's train file)."""
    prompt_key: str | None = None
    """Prompt column (default: the config's, else the engine's: prompt; OpenRLHF input)."""
    answer_key: str | None = None
    """Ground-truth column (verl reads reward_model.ground_truth)."""
    reward: str | None = None
    """Reward function FILE:FUNCTION in the engine's signature (FUNCTION defaults to the engine's name)."""
    reward_paths: Annotated[list[Path], Flag("--reward-path")] = Field(default_factory=list)
    """Directory the reward file's imports need, appended to sys.path (repeatable)."""
    reward_kwargs: Annotated[list[str], Flag("--reward-kwarg")] = Field(default_factory=list)
    """Extra reward keyword KEY=VALUE, as the engine's reward_kwargs (repeatable)."""
    format_regex: str | None = None
    """A format regex as the reward (instead of --reward): 1 when found in the completion."""
    skip_special_tokens: Annotated[bool | None, Flag("--skip-special-tokens/--keep-special-tokens")] = None
    """How completions are decoded for the reward (default: the engine's: verl, EasyR1, TRL skip; OpenRLHF keeps;
    only EasyR1 has a setting for it: elsewhere the flag describes a run with its own decode, and a note says so)."""

    def request(self) -> Any:
        from vlforge.rl.spec import RunRequest

        return RunRequest(
            engine=self.engine, config=self.config, launch=self.launch, model=self.model, tokenizer=self.tokenizer, template=self.template,
            template_vars=key_values(self.template_vars, "--template-var"), format_prompt=self.format_prompt,
            prompts=self.prompts, prompt_key=self.prompt_key, answer_key=self.answer_key, reward=self.reward,
            reward_paths=self.reward_paths, reward_kwargs=key_values(self.reward_kwargs, "--reward-kwarg"),
            format_regex=self.format_regex, skip_special_tokens=self.skip_special_tokens)


class CheckFlags(RunFlags):
    """``vlforge rl check``'s flags."""

    rewrite_out: Path | None = None
    """Write the fixed reward / regex, chat template, format prompt and tokenizer into this directory."""

    def request(self) -> Any:
        return super().request().model_copy(update={"reads_prompts": False})


class ProbeFlags(RunFlags):
    """``vlforge rl probe``'s flags."""

    samples: int | None = None
    """Completions per prompt, K (default: the config's group size, else the engine's)."""
    max_prompts: int = 8
    """Prompts to sample, N (the first N of the file)."""
    max_new_tokens: int | None = None
    """Tokens per completion (default: the config's response length, else the engine's: 512; else 256)."""
    seed: int = 0
    """Sampling seed (prompt i samples with seed + i)."""
    device: str = "cpu"
    """Device for the model (cpu, cuda, cuda:1)."""
    dtype: str = "float32"
    """dtype to load the model in."""


def _resolve(flags: RunFlags) -> Any:
    from vlforge.rl.spec import resolve

    if flags.engine is not None:
        from vlforge.rl.engines import engine

        engine(flags.engine)
    return resolve(flags.request())


def check_check(flags: CheckFlags) -> None:
    _resolve(flags)
    if flags.rewrite_out is not None:
        check_output_dir(flags.rewrite_out, flag="--rewrite-out", mode="replace")


def run_check_flags(flags: CheckFlags) -> Any:
    from vlforge.rl.check import run_check

    return run_check(_resolve(flags), rewrite_out=flags.rewrite_out)


def check_probe(flags: ProbeFlags) -> None:
    from vlforge.models.refs import dtype_name

    spec = _resolve(flags)
    if spec.prompts is None:
        raise ConfigError("rl probe: no prompts: pass --prompts FILE (or a --config that names the train file)")
    for flag, value in (("--samples", flags.samples), ("--max-prompts", flags.max_prompts),
                        ("--max-new-tokens", flags.max_new_tokens)):
        if value is not None and value <= 0:
            raise ConfigError(f"{flag} {value}: must be positive")
    if flags.samples == 1:
        raise ConfigError("--samples 1: a GRPO group needs at least 2 completions per prompt")
    dtype_name(flags.dtype)


def run_probe_flags(flags: ProbeFlags) -> Any:
    import sys

    from vlforge.rl.probe import run_probe

    return run_probe(_resolve(flags), samples=flags.samples, max_prompts=flags.max_prompts,
                     max_new_tokens=flags.max_new_tokens, seed=flags.seed, device=flags.device, dtype=flags.dtype,
                     progress=sys.stderr.isatty())


def _render_check(flags: CheckFlags, report: Any, console: Any) -> None:
    from vlforge.rl.render import print_check

    print_check(report, console)


def _render_probe(flags: ProbeFlags, report: Any, console: Any) -> None:
    from vlforge.rl.render import print_probe

    print_probe(report, console)


def _check_lines(report: Any) -> list[str]:
    return [f"error: {p.message}" for p in report.problems if p.severity == "error"]


def _probe_lines(report: Any) -> list[str]:
    return [f"error: {report.message}"] if report.verdict == "dead" else []


CHECK: Job[CheckFlags, Any] = Job(
    check=check_check, run=run_check_flags, render=_render_check,
    to_json=lambda report: report.model_dump_json(indent=1), exit_code=lambda report: report.exit_code,
    verdict_lines=_check_lines)
PROBE: Job[ProbeFlags, Any] = Job(
    check=check_probe, run=run_probe_flags, render=_render_probe,
    to_json=lambda report: report.model_dump_json(indent=1), exit_code=lambda report: report.exit_code,
    verdict_lines=_probe_lines)
CHECK_CLI = Cli(flags=CheckFlags, job=CHECK)
PROBE_CLI = Cli(flags=ProbeFlags, job=PROBE)
