"""Every config of the bad-config corpus gives exactly one one-line error naming its file, line and key.

Each file's first line says what the error must contain: ``# expect: <file>:<line>: <key path>: <message>``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cfgkit import BAD_CONFIGS, MINIMAL

from vlforge.config import ConfigValidationError, load_config
from vlforge.config.validate import check
from vlforge.errors import ConfigError, VlforgeError


def test_corpus_is_broad() -> None:
    names = {path.stem for path in BAD_CONFIGS}
    assert len(names) >= 12
    for layout in ("native_", "lmms_", "guide_list_"):
        assert sum(name.startswith(layout) for name in names) >= 3, layout


@pytest.mark.parametrize("path", BAD_CONFIGS, ids=lambda path: path.stem)
def test_bad_config_gives_one_line_naming_the_key(path: Path) -> None:
    expect = path.read_text(encoding="utf-8").splitlines()[0].removeprefix("# expect: ")
    assert expect and not expect.startswith("#"), f"{path.name} lacks its '# expect:' line"
    with pytest.raises(ConfigValidationError) as info:
        load_config(path)
    error = info.value
    assert isinstance(error, ConfigError) and isinstance(error, VlforgeError) and error.exit_code == 2
    assert len(error.problems) == 1, [str(p) for p in error.problems]
    text = str(error)
    assert "\n" not in text
    assert text.startswith(str(path)), text
    assert expect in text, f"\n got: {text}\nwant: {expect}"
    problem = error.problems[0]
    key = expect.split(": ")[1] if expect.count(": ") >= 2 and "YAML" not in expect else ""
    assert problem.path == key


def test_several_independent_problems_are_all_reported(write_yaml) -> None:
    path = write_yaml(MINIMAL + "training: {learning_rate: -1, warmup_ratio: 2}\ncheckpointing: {save_steps: 0}\n")
    report = check(path)
    assert not report.ok
    keys = sorted(problem.path for problem in report.problems)
    assert keys == ["checkpointing.save_steps", "training.learning_rate", "training.warmup_ratio"]
    assert all(problem.line for problem in report.problems)


def test_missing_file_and_empty_file(write_yaml, tmp_path: Path) -> None:
    with pytest.raises(ConfigValidationError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigValidationError, match="the config file is empty"):
        load_config(write_yaml("# nothing\n"))
    with pytest.raises(ConfigValidationError, match="expected a mapping of sections, got str"):
        load_config(write_yaml("just text\n"))


def test_missing_model_path_names_the_lmms_key(write_yaml) -> None:
    path = write_yaml("trainer_type: fsdp2_trainer\ndataset_config: {dataset_path: d.yaml}\nmodel_config: {}\n")
    with pytest.raises(ConfigValidationError) as info:
        load_config(path)
    assert [p.path for p in info.value.problems] == ["model_config.load_from_pretrained_path"]
    assert "required key is missing" in str(info.value)


def test_unsupported_values_of_lmms_keys(write_yaml) -> None:
    base = "dataset_config: {dataset_path: d.yaml}\nmodel_config: {load_from_pretrained_path: m}\n"
    with pytest.raises(ConfigValidationError, match=r"trainer_type: 'deepspeed_trainer' is not a trainer vlforge "
                                                    r"runs \(fsdp2_trainer, or hf_trainer read as it\)"):
        load_config(write_yaml("trainer_type: deepspeed_trainer\n" + base))
    with pytest.raises(ConfigValidationError, match=r"trainer_args.eval_strategy: Input should be 'no' or 'steps'"):
        load_config(write_yaml(base + "trainer_args: {eval_strategy: epoch}\n"))


def test_list_layout_shape_errors(write_yaml) -> None:
    with pytest.raises(ConfigValidationError, match=r"\[0\].type: unsupported list entry type 'dataset'"):
        load_config(write_yaml("- type: dataset\n  config: {}\n"))
    with pytest.raises(ConfigValidationError, match=r"\[0\].config: `config:` must be a mapping"):
        load_config(write_yaml("- type: trainer\n"))
    with pytest.raises(ConfigValidationError, match=r"\[1\]: more than one `type: trainer` entry"):
        load_config(write_yaml("- type: trainer\n  config: {}\n- type: trainer\n  config: {}\n"))


def test_value_given_twice_in_list_layout(write_yaml) -> None:
    text = (
        "- type: trainer\n  config:\n    dataset_config: {dataset_path: d.yaml}\n"
        "    model_config: {load_from_pretrained_path: m}\n    bf16: true\n    trainer_args: {bf16: false}\n"
    )
    with pytest.raises(ConfigValidationError, match=r"\[0\].config.trainer_args.bf16: given twice"):
        load_config(write_yaml(text))


def test_lora_key_in_lmms_layout_points_to_native(write_yaml) -> None:
    text = "dataset_config: {dataset_path: d.yaml}\nmodel_config: {load_from_pretrained_path: m, lora: {r: 4}}\n"
    with pytest.raises(ConfigValidationError, match=r"model_config.lora: unknown LMMS key; 'model.lora' exists only"):
        load_config(write_yaml(text))


def test_lmms_names_in_native_layout_are_translated_in_the_hint(write_yaml) -> None:
    with pytest.raises(ConfigValidationError, match=r"data.dataset_type: .*'data.streaming' here"):
        load_config(write_yaml(MINIMAL.replace("{dataset_path", "{dataset_type: vision, dataset_path")))
    with pytest.raises(ConfigValidationError, match=r"fsdp_config: .*the 'fsdp' section here"):
        load_config(write_yaml(MINIMAL + "fsdp_config: {reshard_after_forward: false}\n"))


def test_mixed_layouts_are_one_error(write_yaml) -> None:
    text = "dataset_config: {dataset_path: d.yaml}\nmodel_config: {load_from_pretrained_path: m}\ntraining: {seed: 1}\n"
    with pytest.raises(ConfigValidationError) as info:
        load_config(write_yaml(text))
    assert [str(p) for p in info.value.problems] == [
        f"{info.value.problems[0].origin}:3: training: a native vlforge section in an LMMS Engine layout "
        "(dataset_config/model_config/trainer_args); use one layout"
    ]


def test_empty_native_section_means_defaults(write_yaml) -> None:
    cfg = load_config(write_yaml(MINIMAL + "training:\nprocessor:\n"))
    assert cfg.training.learning_rate == 1e-5 and cfg.processor.processor_name is None


def test_hf_trainer_runs_on_the_fsdp2_trainer_with_a_warning_naming_what_differs(write_yaml) -> None:
    """LMMS Engine's own load_from_pretrained example sets ``trainer_type: hf_trainer``."""
    from vlforge.config.load import resolve_config

    base = "dataset_config: {dataset_path: d.yaml}\nmodel_config: {load_from_pretrained_path: m}\n"
    resolved = resolve_config(write_yaml("trainer_type: hf_trainer\n" + base))
    assert resolved.config.trainer_type == "fsdp2_trainer"
    [warning] = [w for w in resolved.warnings if w.startswith("trainer_type")]
    assert 'trainer_type: "hf_trainer" is read as trainer_type: "fsdp2_trainer"' in warning
    for differs in ("token mean over the whole optimizer step", "deepspeed is not used", "DCP checkpoints"):
        assert differs in warning
