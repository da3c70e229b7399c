"""``vlforge validate``: resolved YAML or JSON on stdout and exit 0, or one line per problem and exit 2."""

from __future__ import annotations

import json

import yaml
from cfgkit import BAD_CONFIGS, MINIMAL, guide_path
from typer.testing import CliRunner

from vlforge.cli import app
from vlforge.config import load_config

runner = CliRunner()


def _placeholder_data(tmp_path) -> str:
    """The override that points the guide's placeholder ``path/to/your/dataset.parquet`` at a real file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "dataset.parquet"
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    pq.write_table(pa.Table.from_pylist([{"messages": json.dumps(chat)}]), data)  # a file of chats, as validate reads
    return f"data.datasets.0.path={data}"


def test_the_guides_placeholder_data_path_is_a_problem() -> None:
    result = runner.invoke(app, ["validate", str(guide_path("lmms_guide_qwen3_vl.yaml"))])
    assert result.exit_code == 2
    assert "data.datasets.0.path: path/to/your/dataset.parquet: file not found" in result.output


def test_valid_guide_prints_resolved_yaml_with_warnings(write_yaml, tmp_path) -> None:
    path = guide_path("lmms_guide_qwen3_vl.yaml")
    override = _placeholder_data(tmp_path)
    result = runner.invoke(app, ["validate", str(path), override])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith(f"# {path}: valid (lmms_list layout)")
    assert "data.shuffle" not in "".join(line for line in out.splitlines() if line.startswith("# warning"))
    resolved = yaml.safe_load(out)
    assert resolved["data"]["streaming"] is True and resolved["training"]["max_steps"] == 1000
    assert load_config(write_yaml(out)) == load_config(path, [override])  # the printed YAML is the same config


def test_overrides_on_the_command_line(write_yaml) -> None:
    path = write_yaml(MINIMAL)
    result = runner.invoke(app, ["validate", str(path), "training.learning_rate=5e-4", "trainer_args.seed=7", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["layout"] == "native" and report["warnings"] == []
    assert report["config"]["training"]["learning_rate"] == 5e-4 and report["config"]["training"]["seed"] == 7


def test_json_warnings_of_the_guide(tmp_path) -> None:
    result = runner.invoke(app, ["validate", str(guide_path("lmms_guide_qwen2_5_vl.yaml")), "--json",
                                 _placeholder_data(tmp_path)])
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["layout"] == "lmms_list"
    assert not any(w.startswith("data.shuffle") for w in report["warnings"])  # honoured now
    assert report["config"]["data"]["shuffle"] is True
    assert report["config"]["packing"]["packing_length"] == 16384


def test_bad_config_exits_2_with_one_line() -> None:
    path = next(p for p in BAD_CONFIGS if p.name == "native_typo_training.yaml")
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: {path}:6: training.lerning_rate: unknown key; did you mean 'learning_rate'?"]


def test_bad_config_json(write_yaml) -> None:
    path = write_yaml(MINIMAL + "sp_ulysses_degree: 0\ntraining: {bf16: true, fp16: true}\n")
    result = runner.invoke(app, ["validate", str(path), "--json"])
    assert result.exit_code == 2
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["file"] == str(path)
    keys = {error["key"]: error for error in report["errors"]}
    assert set(keys) == {"sp_ulysses_degree", "training.fp16"}
    assert keys["sp_ulysses_degree"]["line"] == 3
    assert "greater than or equal to 1" in keys["sp_ulysses_degree"]["message"]


def test_bad_override_exits_2(write_yaml) -> None:
    result = runner.invoke(app, ["validate", str(write_yaml(MINIMAL)), "training.lerning_rate=1"])
    assert result.exit_code == 2
    assert "did you mean 'learning_rate'?" in result.stderr


def test_yaml_syntax_error_names_the_line(write_yaml) -> None:
    path = write_yaml("data:\n  dataset_path: [a\nmodel: {}\n")
    result = runner.invoke(app, ["validate", str(path), "--json"])
    assert result.exit_code == 2
    (error,) = json.loads(result.stdout)["errors"]
    assert error["line"] == 3 and "YAML syntax error" in error["message"]
