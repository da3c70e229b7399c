"""``vlforge rl check -- LAUNCH COMMAND``: the run a launch script starts, read as the engine's own parser reads it.

The oracles are the engines' parsers themselves: Hydra composing verl 0.9.1's packaged ``ppo_trainer`` config
with the overrides of a GRPO script in the layout of verl's ``examples/grpo_trainer`` (the verl peer venv),
OmegaConf's command line over an EasyR1 config (the same venv), and TRL 1.16's own ``trl grpo`` parser (this
environment). Each field vlforge resolves must equal what the engine would run with.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from vlforge.errors import ConfigError
from vlforge.rl.launch import VERL_PACKAGED, parse_launch
from vlforge.rl.spec import RunRequest, resolve

from .conftest import invoke

ORACLE = Path(__file__).with_name("engine_parsers.py")

VERL_REWARD = '''import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(re.fullmatch(r"<think>.*</think>.*\\\\boxed\\{.*\\}.*", solution_str, re.DOTALL) is not None)
'''


def _engine_parser(verl_site: Path, job: dict) -> dict:
    python = verl_site.parents[2] / "bin" / "python"
    done = subprocess.run([str(python), str(ORACLE), json.dumps(job)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _verl_overrides(base: Path, train: Path, reward: Path) -> list[str]:
    """A GRPO launch in the layout of verl's examples/grpo_trainer/run_qwen2_5_vl-7b.sh (after the shell expanded
    it), with a custom reward and Qwen3's thinking switch."""
    return [
        "algorithm.adv_estimator=grpo", f"data.train_files=[{train},{train.with_name('second.parquet')}]",
        f"data.val_files={train}", "data.train_batch_size=512", "data.max_prompt_length=1024",
        "data.max_response_length=2048", "data.filter_overlong_prompts=True", "data.truncation='error'",
        "data.image_key=images", f"actor_rollout_ref.model.path={base}", "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size=128",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.01",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True", "actor_rollout_ref.rollout.name=vllm",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.rollout.temperature=0.9", "algorithm.use_kl_in_reward=False",
        "trainer.logger=[\"console\",\"wandb\"]", "trainer.project_name='verl_grpo_example_geo3k'",
        "trainer.n_gpus_per_node=8", "trainer.total_epochs=15",
        f"reward.custom_reward_function.path={reward}", "reward.custom_reward_function.name=compute_score",
        "+data.apply_chat_template_kwargs.enable_thinking=False", "~trainer.val_before_train",
    ]


def test_a_verl_launch_command_reads_as_hydra_composes_verls_config(base, verl_parquet, verl_site, tmp_path):
    reward = tmp_path / "think_reward.py"
    reward.write_text(VERL_REWARD)
    overrides = _verl_overrides(base, verl_parquet, reward)
    keys = {"model": "actor_rollout_ref.model.path", "prompts": "data.train_files", "prompt_key": "data.prompt_key",
            "image_key": "data.image_key", "template_vars": "data.apply_chat_template_kwargs",
            "max_new_tokens": "data.max_response_length", "samples": "actor_rollout_ref.rollout.n",
            "temperature": "actor_rollout_ref.rollout.temperature",
            "reward_file": "reward.custom_reward_function.path",
            "reward_function": "reward.custom_reward_function.name"}
    config_dir = verl_site / "verl" / "trainer" / "config"
    theirs = _engine_parser(verl_site, {"engine": "verl", "config_dir": str(config_dir), "config_name": "ppo_trainer",
                                        "overrides": overrides, "keys": list(keys.values())})
    launch = ["ray", "job", "submit", "--address=http://127.0.0.1:8265", "--", "PYTHONUNBUFFERED=1", "python3", "-m",
              "verl.trainer.main_ppo", *overrides]
    spec = resolve(RunRequest(launch=launch))
    assert spec.engine == "verl" and spec.sources["engine"] == "the launch command (verl.trainer.main_ppo)"
    ours = {field: getattr(spec, field) for field in keys}
    ours["prompt_key"] = ours["prompt_key"] or "prompt"  # vlforge's verl default, unset in the command
    expected = {**theirs, "data.train_files": theirs["data.train_files"][0]}  # the probe reads the first file
    assert {field: str(v) if isinstance(v, Path) else v for field, v in ours.items()} == \
        {field: expected[key] for field, key in keys.items()}
    assert theirs["data.apply_chat_template_kwargs"] == {"enable_thinking": False}  # Hydra's `False`, a boolean
    assert spec.sources["samples"] == "launch:actor_rollout_ref.rollout.n"
    # the command line end to end: Qwen3's enable_thinking=False pre-fills <think></think>: this run cannot learn
    code, stdout, _ = invoke("rl", "check", "--json", "--", "python3", "-m", "verl.trainer.main_ppo", *overrides)
    report = json.loads(stdout)
    assert code == 3 and report["engine"] == "verl" and "prefilled" in {p["kind"] for p in report["problems"]}
    assert report["sources"]["template_vars"] == "launch:data.apply_chat_template_kwargs"


EASYR1_REWARD = '''import re

REWARD_TYPE = "batch"


def compute_score(reward_inputs, format_weight=0.1, accuracy_weight=0.9):
    return [{"overall": float(re.fullmatch(r"<think>.*</think>.*", item["response"], re.DOTALL) is not None)}
            for item in reward_inputs]
'''


def test_an_easyr1_launch_command_reads_as_omegaconf_merges_it(base, prompts, verl_site, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # EasyR1 resolves the reward and format prompt paths from the working directory
    (tmp_path / "math.py").write_text(EASYR1_REWARD)
    (tmp_path / "math.jinja").write_text("{{ content | trim }} Think in <think> </think> tags.")
    config = {"data": {"train_files": "missing.jsonl@train", "prompt_key": "problem", "max_response_length": 512,
                       "format_prompt": "math.jinja"},
              "worker": {"actor": {"model": {"model_path": "not-this-one"}}, "rollout": {"n": 5, "temperature": 1.0},
                         "reward": {"reward_function": "math.py:compute_score",
                                    "reward_function_kwargs": {"format_weight": 0.2}}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    overrides = ["config=config.yaml", f"data.train_files={prompts}@train", "data.prompt_key=prompt",
                 f"worker.actor.model.model_path={base}", "worker.rollout.n=8", "worker.rollout.temperature=0.7",
                 "worker.reward.skip_special_tokens=false", "trainer.experiment_name=qwen2_5_vl_7b_geo_grpo",
                 "worker.reward.reward_function_kwargs={accuracy_weight: 0.5}",  # merged into the file's mapping
                 "worker.reward.reward_type=sequential"]
    keys = {"model": "worker.actor.model.model_path", "prompts": "data.train_files", "prompt_key": "data.prompt_key",
            "max_new_tokens": "data.max_response_length", "samples": "worker.rollout.n",
            "temperature": "worker.rollout.temperature", "skip_special_tokens": "worker.reward.skip_special_tokens",
            "reward_kwargs": "worker.reward.reward_function_kwargs", "reward_type": "worker.reward.reward_type"}
    theirs = _engine_parser(verl_site, {"engine": "easyr1", "overrides": overrides, "keys": list(keys.values())})
    spec = resolve(RunRequest(launch=["python3", "-m", "verl.trainer.main", *overrides]))
    assert spec.engine == "easyr1"
    ours = {field: getattr(spec, field) for field in keys}
    assert {field: str(v) if isinstance(v, Path) else v for field, v in ours.items()} == \
        {field: theirs[key].partition("@")[0] if field == "prompts" else theirs[key] for field, key in keys.items()}
    assert spec.sources["max_new_tokens"] == "config.yaml:data.max_response_length"
    assert spec.sources["model"] == "launch:worker.actor.model.model_path"
    assert (spec.reward_file, spec.reward_function) == (Path("math.py"), "compute_score")


def test_a_trl_launch_command_reads_as_trls_own_parser(tiny_checkpoint, prompts, tmp_path):
    import trl.scripts.grpo

    model = tiny_checkpoint("qwen3_vl")
    config = tmp_path / "grpo.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": "overridden", "num_generations": 8,
                                      "max_completion_length": 1024, "reward_funcs": ["think_format_reward"]}))
    flags = ["--config", str(config), "--model_name_or_path", str(model), "--dataset_name", str(prompts),
             "--num-generations", "4", "--chat_template_kwargs", '{"enable_thinking": false}', "--temperature", "0.7",
             "--output_dir", str(tmp_path / "out"), "--use_cpu", "--bf16", "false", "--per_device_train_batch_size", "4"]
    script, training, model_args = trl.scripts.grpo.make_parser().parse_args_and_config(flags)[:3]
    spec = resolve(RunRequest(launch=["accelerate", "launch", "--num_processes", "8", "trl", "grpo", *flags]))
    assert spec.engine == "trl" and spec.model == model_args.model_name_or_path == str(model)
    assert spec.prompts == Path(script.dataset_name) and spec.samples == training.num_generations == 4
    assert spec.max_new_tokens == training.max_completion_length == 1024  # from the file: the flags did not set it
    assert spec.template_vars == training.chat_template_kwargs == {"enable_thinking": False}
    assert spec.temperature == training.temperature == 0.7
    assert spec.reward_function == script.reward_funcs[0] == "think_format_reward"
    assert spec.sources["samples"] == "launch:num_generations" and spec.sources["max_new_tokens"] == \
        "grpo.yaml:max_completion_length"


def test_of_several_trl_reward_funcs_the_one_naming_tags_is_checked_and_a_flag_wins(tiny_checkpoint, prompts,
                                                                                    tmp_path):
    """`--reward_funcs accuracy_reward think_format_reward`, TRL's own pair: the format is the only one naming a
    tag; a --reward or --format-regex given beside the command replaces the list."""
    (tmp_path / "r.py").write_text("import re\n\ndef fmt(completions, **kw):\n    return [float(bool(re.search("
                                   "r'<a>.*</a>', c))) for c in completions]\n\ndef fmt2(completions, **kw):\n"
                                   "    return [float('<b>' in c) for c in completions]\n")
    launch = ["trl", "grpo", "--model_name_or_path", str(tiny_checkpoint("qwen3_vl")), "--dataset_name",
              str(prompts), "--reward_funcs", "accuracy_reward", "think_format_reward"]
    spec = resolve(RunRequest(launch=launch))
    assert spec.reward_function == "think_format_reward"
    assert spec.sources["reward_file"] == "launch:reward_funcs (the one of 2 that names a tag)"
    spec = resolve(RunRequest(launch=launch, reward=f"{tmp_path / 'r.py'}:fmt"))
    assert (spec.reward_file, spec.reward_function) == (tmp_path / "r.py", "fmt") and "reward_refs" not in spec.sources
    assert resolve(RunRequest(launch=launch, format_regex="<x>")).reward_file is None
    both = [*launch[:-2], "r.fmt", "r.fmt2"]
    with pytest.raises(ConfigError, match=r"launch:reward_funcs: 2 of its functions name tags \(r.fmt, r.fmt2\); "
                                          r"vlforge checks one at a time: pass --reward FILE:FUNCTION"):
        resolve(RunRequest(launch=both, reward_paths=[tmp_path]))


@pytest.mark.parametrize(("engine", "args", "message"), [
    (None, ["python3", "train.py", "a=1"], "pass --engine (verl, easyr1 or trl): its launcher 'train.py' is not one"),
    (None, ["a=1"], "pass --engine (verl, easyr1 or trl): it names no launcher"),
    ("verl", ["data.train_files"], "launch argument 'data.train_files': expected KEY=VALUE (a Hydra override)"),
    ("verl", ["--multirun", "a=1"], "launch argument '--multirun': not a Hydra override vlforge reads"),
    ("verl", ["python3", "-m", "verl.trainer.main_ppo", "--config-path=my_configs", "--config-name=grpo"],
     "launch argument --config-path my_configs: Hydra reads a relative path beside the launched module's file"),
    ("verl", ["--config-name", "evaluation"], "launch argument --config-name evaluation: verl reads it from its own "
     "package; pass that file with --config"),
    ("verl", ["x.y=[a,b"], "missing ']'"),
    ("verl", ["trainer.logger=console,wandb"], "a sweep (console,wandb); vlforge reads one run"),
    ("verl", ["python3", "-m", "verl.trainer.main", "config=x.yaml"],
     "--engine verl but the launcher verl.trainer.main is easyr1's"),
    ("vrl", ["a=1"], "--engine 'vrl': unknown engine"),
    ("trl", ["--config=grpo.yaml"], "TRL reads its config file as --config FILE (two words)"),
    ("easyr1", ["worker.rollout.n"], "expected KEY=VALUE (EasyR1's OmegaConf command line)"),
    ("trl", ["model_name_or_path=x"], "expected --key value (TRL's command line)"),
    ("openrlhf", ["--pretrain", "x"], "openrlhf's are not read"),
    (None, ["bash", "-x", "examples/qwen2_5_vl_7b_geo3k_grpo.sh"], "examples/qwen2_5_vl_7b_geo3k_grpo.sh is a shell "
     "script, which vlforge does not run or read: pass the command it launches"),
])
def test_a_launch_command_vlforge_cannot_read_is_one_line(engine, args, message):
    with pytest.raises(ConfigError) as error:
        parse_launch(engine, args)
    assert message in str(error.value) and "\n" not in str(error.value)


HYDRA_VALUES = ["[hdfs://x/y.parquet]", "{api:http://h:8000,w:1}", "[${a.b},c]", "007", "b\\,c", "['it\\'s']",
                "1_000", "1.", ".5", "1e5", "-inf", "", "True", "NULL", "./r.py:compute_score", "[a, 'b c']",
                "{enable_thinking:False}", "  x  ", "[[1,2],{k: [v]}]", "\"quoted\""]
OMEGACONF_VALUES = ["{enable_thinking:False}", "yes", "0x1f", "a #b", "1e-6", "", "[1, 2]", "{format_weight: 0.5}",
                    "./math.py:compute_score", "off", "1_000", "null", "'007'"]


@pytest.mark.parametrize(("engine", "raw"), [("verl", HYDRA_VALUES), ("easyr1", OMEGACONF_VALUES)])
def test_values_read_as_the_engines_own_parsers_read_them(verl_site, engine, raw):
    from vlforge.rl.launch import hydra_value, yaml_value

    theirs = _engine_parser(verl_site, {"engine": engine, "values": True, "overrides": [f"k{i}={v}" for i, v in
                                                                                       enumerate(raw)]})
    read = hydra_value if engine == "verl" else yaml_value
    assert [read(value) for value in raw] == theirs


def test_config_named_twice_or_missing_is_one_line(tmp_path, base):
    (tmp_path / "ppo.yaml").write_text("data: {}\n")
    code, _, stderr = invoke("rl", "check", "--engine", "verl", "--config", tmp_path / "ppo.yaml", "--format-regex",
                             "<think>", "--", "--config-path", str(tmp_path), "--config-name", "ppo")
    assert code == 2 and f"--config {tmp_path / 'ppo.yaml'} and the launch command's --config-path/--config-name " \
        f"{tmp_path / 'ppo.yaml'}: give one" in stderr
    code, _, stderr = invoke("rl", "check", "--format-regex", "<think>", "--", "python3", "-m",
                             "verl.trainer.main_ppo", f"--config-path={tmp_path}", "--config-name=grpo")
    assert code == 2 and f"the launch command's --config-path/--config-name {tmp_path / 'grpo.yaml'}: not found" \
        in stderr
    code, _, stderr = invoke("rl", "check", "--format-regex", "<think>", "--", "trl", "grpo", "--model_name_or_path",
                             str(base), "--num_generations", "four")
    assert code == 2 and "num_generations: expected an integer, got 'four'" in stderr
    code, _, stderr = invoke("rl", "probe", "--format-regex", "<think>", "--", "python3", "-m", "verl.trainer.main",
                             "data.train_files=hiyouga/geometry3k@train", f"worker.actor.model.model_path={base}")
    assert code == 2 and "launch:data.train_files: hiyouga/geometry3k: not found (a hub dataset name? vlforge reads " \
        "no network" in stderr
    code, _, stderr = invoke("rl", "check", "--engine", "verl", "--format-regex", "<think>", "--", "data.prompt_key=q")
    assert code == 2 and "no model: pass --model" in stderr and "or in the launch command" in stderr



def test_the_engine_defaults_vlforge_falls_back_to_are_the_engines_own(verl_site):
    """What a run gets when its command and config say nothing: TRL 1.16's GRPOConfig fields and verl 0.9.1's
    packaged configs (composed by Hydra, no overrides), which a command names as its examples do
    (``--config-path=config --config-name='ppo_megatron_trainer.yaml'``)."""
    import dataclasses

    from trl import GRPOConfig

    from vlforge.rl.engines import engine
    from vlforge.rl.prompts import PROMPT_KEYS
    from vlforge.rl.spec import RunSpec

    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    assert (engine("trl").group_size, engine("trl").response_length, RunSpec.model_fields["temperature"].default) \
        == (defaults["num_generations"], defaults["max_completion_length"], defaults["temperature"])
    config_dir = verl_site / "verl" / "trainer" / "config"
    keys = ["actor_rollout_ref.rollout.n", "data.prompt_key", "data.max_response_length",
            "actor_rollout_ref.rollout.temperature"]
    for name in VERL_PACKAGED:
        verl = _engine_parser(verl_site, {"engine": "verl", "config_dir": str(config_dir), "config_name": name,
                                          "overrides": [], "keys": keys})
        assert [verl[key] for key in keys] == [engine("verl").group_size, PROMPT_KEYS["verl"],
                                               engine("verl").response_length,
                                               RunSpec.model_fields["temperature"].default], name
        launch = parse_launch(None, ["python3", "-m", "verl.trainer.main_ppo", "--config-path=config",
                                     f"--config-name='{name}.yaml'".replace("'", ""), "data.prompt_key=q"])
        assert (launch.packaged, launch.config, launch.overrides) == (name, None, [("data.prompt_key", "q")])


@pytest.mark.parametrize(("args", "launcher", "rest"), [
    (["srun", "-m", "block", "python3", "-m", "verl.trainer.main_ppo", "a=1"], "verl.trainer.main_ppo", ["a=1"]),
    (["python", "-m", "torch.distributed.run", "--nproc_per_node", "8", "-m", "verl.trainer.main", "config=c.yaml"],
     "verl.trainer.main", ["config=c.yaml"]),
    (["torchrun", "--nproc_per_node=8", "/opt/verl/verl/trainer/main_ppo.py", "a=1"], "verl.trainer.main_ppo", ["a=1"]),
    (["accelerate", "launch", "--config_file", "zero3.yaml", "trl", "grpo", "--model_name_or_path", "m"], "trl grpo",
     ["--model_name_or_path", "m"]),
    (["python", "my_grpo.py", "--remote_rm_url", "reward.py"], "my_grpo.py", ["--remote_rm_url", "reward.py"]),
    (["reward.custom_reward_function.path=r.py", "a=1"], None, ["reward.custom_reward_function.path=r.py", "a=1"]),
])
def test_the_launcher_is_found_in_the_commands_users_write(args, launcher, rest):
    from vlforge.rl.launch import strip_launcher

    found_rest, found, _ = strip_launcher(args)
    assert (found, found_rest) == (launcher, rest)


def test_a_shell_variable_pasted_unexpanded_is_named():
    """EasyR1's scripts write `worker.actor.model.model_path=${MODEL_PATH}`: pasted as it is, it names a shell variable,
    not a key of the config (was "no model"); an interpolation of a key the file lacks still falls back."""
    from vlforge.rl.configs import dotted

    data = {"worker": {"actor": {"model": {"model_path": "${MODEL_PATH}", "tokenizer": "${data.tok}"}}}}
    with pytest.raises(ConfigError, match=r"worker\.actor\.model\.model_path: '\$\{MODEL_PATH\}' is a shell variable "
                                          r"the command was pasted without; write its value"):
        dotted(data, "worker.actor.model.model_path")
    assert dotted(data, "worker.actor.model.tokenizer", "fallback") == "fallback"
