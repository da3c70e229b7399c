"""LMMS Engine's own configs (its wheel's default config, its repository's examples) validate and train as published.

Each YAML in ``lmms_configs/`` is a verbatim copy (sources and sha256 in ``lmms_configs/SOURCES.md``). The test
changes only, on the command line, the model and processor paths (a ``tiny:`` preset of the config's family),
the data paths (data this test writes, in the config's own format), the output directory and the step
count; everything else runs as written: `vlforge validate` reports 0 errors and `vlforge train` trains.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cfgkit import HERE, REPO
from guidekit import write_parquet_dataset
from typer.testing import CliRunner

from vlforge.cli import app

sys.path.insert(0, str(REPO / "scripts"))
import peer_env

CONFIGS = HERE / "lmms_configs"
EXAMPLE_DATA = str(REPO / "examples" / "data" / "dataset.yaml")


def _arrow(tmp: Path) -> str:
    """The guide dataset as one Arrow IPC file (the getting-started config's ``data_type: arrow``)."""
    table = pq.read_table(write_parquet_dataset(tmp / "data"))
    path = tmp / "data" / "train.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return str(path)


#: file -> (preset, data overrides (tmp_path -> list), what the run must show)
CASES = {
    "default_config.yaml": ("tiny:qwen2_5_vl", lambda tmp: [f"data.dataset_path={EXAMPLE_DATA}"]),
    "repo_examples_qwen3_vl_example_config.yaml": ("tiny:qwen3_vl",
                                                   lambda tmp: [f"data.dataset_path={EXAMPLE_DATA}"]),
    "repo_docs_getting_started_train.yaml": ("tiny:qwen2_5_vl", lambda tmp: [f"data.datasets.0.path={_arrow(tmp)}"]),
    "sdist_examples_qwen3_5_example_config.yaml": ("tiny:qwen3_5", lambda tmp: [f"data.dataset_path={EXAMPLE_DATA}"]),
    "sdist_examples_qwen3_5_moe_qwen3_5_moe_ep8.yaml": (
        "tiny:qwen3_5_moe", lambda tmp: [f"data.datasets.0.path={write_parquet_dataset(tmp / 'data')}"]),
    "sdist_examples_qwen3_vl_moe_qwen3_vl_moe_ep8.yaml": ("tiny:qwen3_vl_moe",
                                                          lambda tmp: [f"data.dataset_path={EXAMPLE_DATA}"]),
    "sdist_examples_qwen2_5_vl_example_config.yaml": (
        "tiny:qwen2_5_vl", lambda tmp: [f"data.datasets.0.path={write_parquet_dataset(tmp / 'data')}"]),
    "sdist_examples_qwen3_vl_example_config.yaml": ("tiny:qwen3_vl", lambda tmp: [f"data.dataset_path={EXAMPLE_DATA}"]),
    "sdist_examples_qwen3_vl_vit_frame_parallel_sp.yaml": ("tiny:qwen3_vl",
                                                           lambda tmp: [f"data.dataset_path={EXAMPLE_DATA}"]),
    "sdist_examples_qwen3_moe_qwen3_moe_ep8.yaml": (
        "tiny:qwen3_vl_moe", lambda tmp: [f"data.datasets.0.path={write_parquet_dataset(tmp / 'data')}"]),
    "sdist_examples_load_from_pretrained_example.yaml": ("tiny:qwen2_5_vl",
                                                         lambda tmp: [f"data.datasets.0.path={_arrow(tmp)}"]),
}


def _sources() -> dict[str, str]:
    text = (CONFIGS / "SOURCES.md").read_text(encoding="utf-8")
    return dict(re.findall(r"^\| `([^`]+\.yaml)` \|.*\| `([0-9a-f]{64})` \|$", text, flags=re.MULTILINE))


def test_copies_are_verbatim() -> None:
    sources = _sources()
    assert sorted(sources) == sorted(CASES) == sorted(p.name for p in CONFIGS.glob("*.yaml"))
    for name, digest in sources.items():
        assert hashlib.sha256((CONFIGS / name).read_bytes()).hexdigest() == digest, name
    python = peer_env.peer_python()
    if python is not None:  # the wheel's own file
        shipped = next(Path(python).parents[1].glob("lib/python*/site-packages/lmms_engine/launch/config/"
                                                    "default_config.yaml"))
        assert shipped.read_bytes() == (CONFIGS / "default_config.yaml").read_bytes()


def _overrides(name: str, tmp_path: Path) -> list[str]:
    preset, data = CASES[name]
    return [f"model.load_from_pretrained_path={preset}", f"processor.processor_name={preset}", *data(tmp_path),
            f"checkpointing.output_dir={tmp_path / 'out'}"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_validates_with_no_error(name: str, tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["validate", str(CONFIGS / name), "--json", *_overrides(name, tmp_path)])
    report = json.loads(done.stdout)
    assert done.exit_code == 0 and report["ok"], report.get("errors")
    assert report["layout"] == "lmms"
    for warning in report["warnings"]:  # inert keys name themselves; nothing about unknown keys
        assert "has no effect" in warning or " is read as " in warning, warning


def _train(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *machine: str) -> dict:
    monkeypatch.setenv("WANDB_MODE", "offline")  # the default config's report_to: [wandb]
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    config = CONFIGS / name
    published = config.read_bytes()
    done = CliRunner().invoke(app, ["train", str(config), *_overrides(name, tmp_path), "training.max_steps=2",
                                    *machine, "--json"])
    assert done.exit_code == 0, done.output[-3000:] + repr(done.exception)
    assert config.read_bytes() == published
    out = tmp_path / "out"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r][-1] == 2
    assert (out / "final" / "config.json").is_file()
    return json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["config"]


def test_default_config_trains(tmp_path, monkeypatch) -> None:
    cfg = _train("default_config.yaml", tmp_path, monkeypatch)
    # LMMS Engine's meaning: bf16: false is float16 compute; its FSDP2 policy and batch size
    assert cfg["fsdp"]["param_dtype"] == "float16" and cfg["training"]["bf16"] is False
    assert cfg["fsdp"]["reduce_dtype"] == cfg["fsdp"]["output_dtype"] == "bfloat16"
    assert cfg["training"]["per_device_train_batch_size"] == 8 and cfg["training"]["optim"] == "adamw_torch_fused"
    assert cfg["data"]["streaming"] is False  # dataset_type: vision_iterable


def test_repository_qwen3_vl_example_trains(tmp_path, monkeypatch) -> None:
    cfg = _train("repo_examples_qwen3_vl_example_config.yaml", tmp_path, monkeypatch)
    assert cfg["training"]["bf16"] is True and cfg["fsdp"]["mixed_precision"] == "pure_bf16"
    assert cfg["data"]["streaming"] is True and cfg["model"]["gradient_checkpointing"] is True


def test_repository_getting_started_config_trains(tmp_path, monkeypatch) -> None:
    published = CliRunner().invoke(app, ["validate", str(CONFIGS / "repo_docs_getting_started_train.yaml"), "--json",
                                         *_overrides("repo_docs_getting_started_train.yaml", tmp_path)])
    cfg = json.loads(published.stdout)["config"]
    assert cfg["model"]["freeze_modules"] == ["visual"] and cfg["packing"]["packing_length"] == 16384
    assert cfg["dataloader_num_workers"] == 8
    # What a 2-core CPU lacks: a 16384-token row at a 151k vocabulary is about 10 GiB of logits and minutes of
    # bf16 GEMM per step here, and 8 workers oversubscribe 2 cores; everything else runs as published.
    cfg = _train("repo_docs_getting_started_train.yaml", tmp_path, monkeypatch,
                 "packing.packing_length=1024", "dataloader_num_workers=2")
    assert cfg["model"]["freeze_modules"] == ["visual"] and cfg["packing"]["packing_length"] == 1024
    assert cfg["packing"]["packing_strategy"] == "first_fit" and cfg["model"]["gradient_checkpointing"] is True


def test_lmms_qwen3_5_example_trains_packed_through_linear_attention(tmp_path, monkeypatch) -> None:
    """LMMS Engine 0.1.4's Qwen3.5 example: balanced packing (nearest: best_fit), video pixel bounds of the
    processor honoured, the VL class (model_general_type: image_text_to_text)."""
    name = "sdist_examples_qwen3_5_example_config.yaml"
    report = json.loads(CliRunner().invoke(app, ["validate", str(CONFIGS / name), "--json",
                                                 *_overrides(name, tmp_path)]).stdout)
    published = report["config"]
    assert published["packing"]["packing_strategy"] == "best_fit" and published["packing"]["packing_length"] == 32768
    assert published["video"]["video_min_pixels"] == 28800 and published["video"]["video_max_pixels"] == 360448
    assert any("model_config.torch_dtype" in w and "has no effect" in w for w in report["warnings"])
    cfg = _train(name, tmp_path, monkeypatch, "packing.packing_length=640", "dataloader_num_workers=0")
    assert cfg["packing"]["packing"] is True and cfg["training"]["bf16"] is True


@pytest.mark.parametrize("name", ["sdist_examples_qwen3_5_moe_qwen3_5_moe_ep8.yaml",
                                  "sdist_examples_qwen3_vl_moe_qwen3_vl_moe_ep8.yaml"])
def test_lmms_moe_examples_train_with_ep_degree_inert(name, tmp_path, monkeypatch) -> None:
    report = json.loads(CliRunner().invoke(app, ["validate", str(CONFIGS / name), "--json",
                                                 *_overrides(name, tmp_path)]).stdout)
    assert any("ep_degree: 8 has no effect" in w for w in report["warnings"])
    cfg = _train(name, tmp_path, monkeypatch, "dataloader_num_workers=0")
    assert cfg["training"]["bf16"] is True


#: What a 2-core CPU lacks, per sdist example (everything else runs as published): packed rows of 1024 tokens
#: instead of 16-51k, no DataLoader worker processes.
_CPU = ("dataloader_num_workers=0",)


@pytest.mark.parametrize(("name", "machine"), [
    ("sdist_examples_qwen2_5_vl_example_config.yaml", _CPU),
    ("sdist_examples_qwen3_vl_example_config.yaml", _CPU),
    ("sdist_examples_qwen3_moe_qwen3_moe_ep8.yaml", _CPU),
    ("sdist_examples_load_from_pretrained_example.yaml", (*_CPU, "packing.packing_length=1024")),
], ids=["qwen2_5_vl", "qwen3_vl", "qwen3_moe_ep8", "load_from_pretrained"])
def test_lmms_sdist_examples_train(name, machine, tmp_path, monkeypatch, caplog) -> None:
    """The sdist's other examples of vlforge's families: model_type/torch_dtype inert, a text-only MoE run,
    ``trainer_type: hf_trainer`` on vlforge's FSDP2 trainer with the warning naming what differs."""
    if name == "sdist_examples_qwen3_moe_qwen3_moe_ep8.yaml":  # it names a text-only MoE's layer class to wrap
        report = json.loads(CliRunner().invoke(app, ["validate", str(CONFIGS / name), "--json",
                                                     *_overrides(name, tmp_path)]).stdout)
        assert any("Qwen3MoeDecoderLayer" in w and "ep_degree > 1" in w for w in report["warnings"])
    cfg = _train(name, tmp_path, monkeypatch, *machine)
    assert cfg["training"]["bf16"] is True
    if name == "sdist_examples_load_from_pretrained_example.yaml":
        assert cfg["packing"]["packing"] is True and cfg["model"]["freeze_modules"] == ["visual"]
        assert any("hf_trainer" in record.getMessage() for record in caplog.records)


@pytest.mark.slow
def test_lmms_sdist_vit_frame_parallel_sp_example_trains_on_two_ranks(tmp_path) -> None:
    """examples/qwen3_vl/vit_frame_parallel_sp.yaml as published: Ulysses SP 2 over two ranks (torchrun), balanced
    packing with its packing_kwargs read as vlforge's nearest strategy."""
    from trainkit import run_training

    name = "sdist_examples_qwen3_vl_vit_frame_parallel_sp.yaml"
    run_training(CONFIGS / name, 2, *_overrides(name, tmp_path), "training.max_steps=2", "packing.packing_length=1024",
                 "dataloader_num_workers=0")
    out = tmp_path / "out"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r][-1] == 2
    cfg = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["config"]
    assert cfg["sp_ulysses_degree"] == 2 and cfg["packing"]["packing"] is True
