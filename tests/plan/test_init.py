"""`vlforge init`: a starter config that validates, that `vlforge plan` says fits the stated GPUs, and that trains.

Real files throughout: a JSONL of chat records with PNG images of two sizes and a text-only record, the real
Qwen tokenizers of the presets, the planner's own estimates (no table of sizes), and `vlforge train`.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from vlforge.cli import app
from vlforge.config.load import load_config
from vlforge.config.validate import check
from vlforge.errors import ConfigError, OutputError
from vlforge.outputs import owned
from vlforge.plan.options import parse_memory
from vlforge.plan.report import make_plan

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards", "quietly", "judge", "boxing"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mine.jsonl``: 16 records, images of 640x480 and 320x240 pixels in most, answers of 20 to 300 words."""
    root = tmp_path_factory.mktemp("init-data")
    Image.new("RGB", (640, 480), (200, 30, 30)).save(root / "big.png")
    Image.new("RGB", (320, 240), (30, 200, 30)).save(root / "small.png")
    rng, rows = random.Random(0), []
    for i in range(16):
        content = ([{"type": "image", "image": ("big.png", "small.png")[i % 2]}, {"type": "text", "text": "Describe it."}]
                   if i % 5 else "Say something.")
        answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 300)))
        rows.append({"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]})
    (root / "mine.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    (root / "text.jsonl").write_text("\n".join(json.dumps({"messages": [
        {"role": "user", "content": f"Count to {i}."}, {"role": "assistant", "content": " ".join(map(str, range(i)))}]})
        for i in range(1, 9)) + "\n")
    return root


def _init(workdir: Path, monkeypatch: pytest.MonkeyPatch, *args: str):
    monkeypatch.chdir(workdir)
    try:
        return runner.invoke(app, ["init", *args])
    finally:  # the CLI's log handler holds this run's stderr: drop it so the next run installs its own
        root = logging.getLogger("vlforge")
        for handler in [h for h in root.handlers if getattr(h, "_vlforge_cli", False)]:
            root.removeHandler(handler)


@pytest.mark.parametrize(("model", "hardware"), [
    ("tiny:qwen3_vl", ["--gpu-memory", "24GB"]),
    ("real:qwen3_vl_2b", ["--gpu-memory", "24GB"]),      # full fine-tuning does not fit: the plan's changes do
    ("real:qwen3_vl_8b", ["--gpus", "8", "--gpu-memory", "80GB"]),
])
def test_the_config_validates_and_the_plan_says_it_fits(data: Path, monkeypatch: pytest.MonkeyPatch, model: str,
                                                        hardware: list[str]) -> None:
    out = data / f"{model.replace(':', '_')}.yaml"
    result = _init(data, monkeypatch, "--model", model, "--data", "mine.jsonl", *hardware, "--out", out.name)
    assert result.exit_code == 0, result.output
    assert owned(out)  # recorded as vlforge's: a later init may replace it, a user's edit stops that
    report = check(out.name)
    assert report.ok, report.error_lines()
    gpus = int(hardware[hardware.index("--gpus") + 1]) if "--gpus" in hardware else 1
    memory = parse_memory(hardware[hardware.index("--gpu-memory") + 1])
    plan = make_plan(load_config(out.name), gpus=gpus, gpu_memory=memory)  # what `vlforge plan` computes
    assert plan.fits, plan.verdict()
    text = out.read_text()
    cfg = yaml.safe_load(text)
    assert cfg["model"]["load_from_pretrained_path"] == model and cfg["data"]["dataset_path"] == "mine.jsonl"
    assert cfg["processor"]["max_pixels"] >= 600 * 440  # the largest image, after the model's resize
    assert cfg["packing"]["packing_length"] % 512 == 0 and cfg["packing"]["filter_overlong"] is True
    assert f"vlforge plan {out.name} --gpus {gpus}" in text and "# Memory:" in text
    if model == "real:qwen3_vl_2b":  # chosen by estimates, in the plan's cost order
        assert cfg["model"]["activation_checkpointing"] in ("selective", "full") and "# Chosen by the plan" in text
    if model == "tiny:qwen3_vl":
        assert cfg["model"]["activation_checkpointing"] == "none" and cfg["model"]["freeze_modules"] == []


def test_nothing_fits_is_exit_1_with_the_closest_setting(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _init(data, monkeypatch, "--model", "tiny:qwen3_vl", "--data", "mine.jsonl", "--gpu-memory", "100MB",
                   "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["fits"] is False and report["changes"], report["changes"]
    peaks = [change["peak_bytes_before"] for change in report["changes"]] + [report["peak_bytes_per_rank"]]
    assert peaks == sorted(peaks, reverse=True)  # every change lowered the estimate
    assert "# NOTHING vlforge can change fits" in report["text"]
    assert yaml.safe_load(report["text"])["model"]["activation_checkpointing"] in ("selective", "full")


def test_text_only_data_freezes_the_vision_tower_and_prints_on_stdout(data: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    result = _init(data, monkeypatch, "--model", "tiny:qwen3_vl", "--data", "text.jsonl", "--gpu-memory", "24GB")
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load(result.stdout)  # without --out: the config alone on stdout, the summary on stderr
    assert cfg["model"]["freeze_modules"] == ["visual"] and "processor" not in cfg and "video" not in cfg
    assert "init: 8 of 8 sampled records usable" in result.stderr


def test_a_directory_or_pattern_of_shards_is_the_data(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shards = data / "shards"
    shards.mkdir(exist_ok=True)
    for name in ("mine.jsonl", "text.jsonl"):
        (shards / name).write_bytes((data / name).read_bytes())
    (shards / "big.png").write_bytes((data / "big.png").read_bytes())
    (shards / "small.png").write_bytes((data / "small.png").read_bytes())
    result = _init(data, monkeypatch, "--model", "tiny:qwen3_vl", "--data", "shards/*.jsonl", "--gpu-memory", "24GB")
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load(result.stdout)
    assert cfg["data"]["dataset_path"] == "shards/*.jsonl" and cfg["checkpointing"]["output_dir"] == "output/run"
    assert "(24 in the data)" in result.stderr  # the 16 and 8 records of both files
    whole = _init(data, monkeypatch, "--model", "tiny:qwen3_vl", "--data", "shards", "--gpu-memory", "24GB")
    assert whole.exit_code == 0, whole.output
    assert yaml.safe_load(whole.stdout)["checkpointing"]["output_dir"] == "output/shards"
    for bad, said in (("shards/*.parquet", "shards/*.parquet: the pattern matches no file"),
                      ("nothing/*.jsonl", "nothing/*.jsonl: the pattern matches no file")):
        refused = _init(data, monkeypatch, "--model", "tiny:qwen3_vl", "--data", bad)
        assert isinstance(refused.exception, ConfigError) and str(refused.exception) == f"--data {said}"


def test_a_file_of_yours_is_never_overwritten(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = data / "notes.yaml"
    mine.write_text("# my own config\n")
    args = ["--model", "tiny:qwen3_vl", "--data", "text.jsonl", "--gpu-memory", "24GB", "--out"]
    refused = _init(data, monkeypatch, *args, "notes.yaml")
    assert isinstance(refused.exception, OutputError) and "refusing to overwrite" in str(refused.exception)
    assert mine.read_text() == "# my own config\n"
    first = _init(data, monkeypatch, *args, "again.yaml")
    assert first.exit_code == 0, first.output
    assert _init(data, monkeypatch, *args, "again.yaml").exit_code == 0  # its own earlier output: replaced
    edited = (data / "again.yaml").read_text() + "# my edit\n"
    (data / "again.yaml").write_text(edited)
    assert isinstance(_init(data, monkeypatch, *args, "again.yaml").exception, OutputError)
    assert (data / "again.yaml").read_text() == edited


def test_the_written_config_trains_two_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the bundled example data (images and a video), as written: bf16, packed rows, its own output_dir."""
    from vlforge.train.trainer import run

    out = tmp_path / "starter.yaml"
    result = _init(REPO, monkeypatch, "--model", "tiny:qwen3_vl", "--data", "examples/data/train.jsonl",
                   "--gpu-memory", "8GB", "--out", str(out))
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load(out.read_text())
    assert cfg["video"]["video_max_frames"] >= 2 and cfg["training"]["bf16"] is True
    done = run(str(out), ["training.max_steps=2", f"checkpointing.output_dir={tmp_path / 'run'}",
                          "model.token_audit=false"], progress=False)
    assert len(done.losses) >= 1 and all(loss == loss for loss in done.losses)  # finite, logged
    assert (tmp_path / "run" / "final" / "config.json").is_file()


def test_videos_given_as_frames_are_said_to_keep_their_own_rate(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`video.fps` samples video files: on data whose videos are lists of frames the starter says it is unused."""
    for i in range(6):
        Image.new("RGB", (96, 64), (i * 40, 0, 0)).save(data / f"frame{i}.png")
    rows = [{"messages": [{"role": "user", "content": [
        {"type": "video", "video": [f"frame{j}.png" for j in range(n)], "sample_fps": 1},
        {"type": "text", "text": "What happens?"}]}, {"role": "assistant", "content": "It gets redder."}]}
        for n in (4, 6)]
    (data / "frames.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    result = _init(data, monkeypatch, "--model", "tiny:qwen3_vl", "--data", "frames.jsonl", "--gpu-memory", "24GB",
                   "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["survey"]["videos"] == 2 and report["survey"]["video_frame_lists"] == 2, report["survey"]
    text = report["text"]
    assert "2 of the 2 are lists of frames" in text, text
    fps_line = next(line for line in text.splitlines() if line.strip().startswith("fps:"))
    assert "unused by the sampled videos: lists of frames" in fps_line, fps_line
    assert yaml.safe_load(text)["video"]["video_max_frames"] >= 6


def test_data_folder_and_records_that_cannot_be_used(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LLaVA's layout: the JSON here, its images under another folder (--data-folder); records the sample cannot use
    are a warning (exit 1) that says the written on_error: raise would stop at the first."""
    pics = data / "pics"
    pics.mkdir(exist_ok=True)
    Image.new("RGB", (64, 48), (9, 9, 9)).save(pics / "a.png")
    rows = [{"image": "a.png", "conversations": [{"from": "human", "value": "<image>\nColour?"},
                                                 {"from": "gpt", "value": "Dark grey."}]} for _ in range(3)]
    rows.append({"image": "gone.png", "conversations": [{"from": "human", "value": "<image>\nAnd?"},
                                                        {"from": "gpt", "value": "Nothing."}]})
    (data / "llava.json").write_text(json.dumps(rows))
    result = _init(data, monkeypatch, "--model", "tiny:qwen3_vl", "--data", "llava.json", "--data-folder", "pics",
                   "--gpu-memory", "24GB", "--out", "llava.yaml")
    assert result.exit_code == 1, result.output  # done, with a warning
    output = " ".join(result.output.split())  # the console wraps long lines
    assert "init: warning: 1 of the 4 sampled records cannot be used (first: " in output, output
    assert "llava.json:item 4: missing_file: " in output and "set data.on_error: skip" in output, output
    text = (data / "llava.yaml").read_text()
    cfg = yaml.safe_load(text)
    assert cfg["data"]["datasets"] == [{"path": "llava.json", "data_folder": "pics"}], cfg["data"]
    assert "--data-folder pics" in text and "# WARNING: 1 of the 4 sampled records cannot be used" in text
    assert check("llava.yaml").ok
    bad = _init(data, monkeypatch, "--model", "tiny:qwen3_vl", "--data", "llava.json", "--data-folder", "nowhere")
    assert isinstance(bad.exception, ConfigError) and str(bad.exception) == "--data-folder nowhere: not a directory"
