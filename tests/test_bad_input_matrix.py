"""The bad-input matrix: every command, given what users get wrong, answers with one line naming the bad thing.

One table: (command, bad input) -> the argv, and the words the one ``error:`` line must hold. Each case runs
the real entry point (``vlforge.cli.main``) in this process and checks: exit 2, exactly one ``error:`` line
on stderr naming the culprit (file, line, key or option), nothing on stdout, no traceback. Files the user
planted next to an output survive byte for byte. Per-sample faults (truncated image, missing image,
malformed JSON line, no assistant turn, corrupt video) are exercised both ways: ``on_error: raise`` stops
with ``file:line N``; ``on_error: skip`` (extract) counts the skip with its file and line.

The checks that come before any model loads use ``/nonexistent`` models where the model is not the point,
so a case that loaded something first would fail with a different line.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
import pytest
import yaml
from PIL import Image

from vlforge import cli

REPO = Path(__file__).resolve().parents[1]
MISSING_MODEL = "/nonexistent/model-dir"
USER_BYTES = b"\x00a user's own file\xff\n"


# --------------------------------------------------------------------------- fixtures: real files


def _write_png(path: Path, color: tuple[int, int, int]) -> None:
    Image.new("RGB", (56, 56), color).save(path)


def _write_mp4(path: Path, frames: int = 6) -> None:
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("mpeg4", rate=4)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for i in range(frames):
            image = np.full((64, 64, 3), 20 * i, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _record(media: dict | None, answer: str | None = "A square.") -> dict:
    content = ([media] if media else []) + [{"type": "text", "text": "What is shown?"}]
    messages = [{"role": "user", "content": content}]
    if answer is not None:
        messages.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
    return {"messages": messages}


#: Per-sample faults: name -> (the record's JSONL line, the words its error must hold)
FAULTS = {
    "truncated image": (lambda: json.dumps(_record({"type": "image", "image": "cut.png"})), "cut.png"),
    "missing image": (lambda: json.dumps(_record({"type": "image", "image": "gone.png"})), "gone.png"),
    "malformed JSON line": (lambda: '{"messages": [', "malformed"),
    "no assistant turn": (lambda: json.dumps(_record({"type": "image", "image": "ok.png"}, answer=None)),
                          "assistant"),
    "corrupt video": (lambda: json.dumps(_record({"type": "video", "video": "broken.mp4"})), "broken.mp4"),
}


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("media")
    _write_png(root / "ok.png", (200, 30, 30))
    data = (root / "ok.png").read_bytes()
    (root / "cut.png").write_bytes(data[: len(data) // 2])
    _write_mp4(root / "clip.mp4")
    clip = (root / "clip.mp4").read_bytes()
    (root / "broken.mp4").write_bytes(clip[: len(clip) // 4])
    (root / "empty.yaml").write_text("")
    (root / "blank.jsonl").write_text("\n\n")
    (root / "a_dir").mkdir()
    (root / "config_only").mkdir()  # a checkpoint's config.json without weights: what loads after the checks fails
    (root / "config_only" / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": 1000}))
    (root / "a_file").write_text("not a directory\n")
    (root / "bad.yaml").write_text("training: [1, 2\n")
    good = [json.dumps(_record({"type": "image", "image": "ok.png"})) for _ in range(3)]
    (root / "good.jsonl").write_text("\n".join(good) + "\n")
    (root / "all_bad.jsonl").write_text(FAULTS["no assistant turn"][0]() + "\n")
    for name, (line, _) in FAULTS.items():
        slug = name.replace(" ", "_")
        (root / f"{slug}.jsonl").write_text("\n".join([line(), good[0], good[1]]) + "\n")  # the fault on line 1
    return root


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error:")]


def run_cli(argv: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    """``vlforge ARGV`` through the console-script entry point, in this process, with its streams captured."""
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["vlforge", *argv])
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    code = 0
    try:
        cli.main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:  # the CLI's log handler holds this run's stderr: drop it so the next run installs its own
        root = logging.getLogger("vlforge")
        for handler in [h for h in root.handlers if getattr(h, "_vlforge_cli", False)]:
            root.removeHandler(handler)
    return Run(code, out.getvalue(), err.getvalue())


def train_yaml(root: Path, name: str, *, data: str = "good.jsonl", output_dir: str = "out", model: str = "tiny:qwen2_vl",
               **sections: dict) -> str:
    cfg = {
        "data": {"dataset_path": data, "on_error": "raise"},
        "processor": {"max_pixels": 3136},
        "packing": {"packing": False},
        "video": {"video_max_frames": 2, "video_max_pixels": 3136},
        "model": {"load_from_pretrained_path": model, "token_audit": False},
        "training": {"max_steps": 1, "learning_rate": 1e-3},
        "checkpointing": {"output_dir": output_dir, "save_steps": 1},
    }
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    (root / name).write_text(yaml.safe_dump(cfg))
    return name


def damaged_checkpoint(root: Path, damage: str) -> str:
    """``out/checkpoint-3`` laid out and sealed as vlforge writes one (weights: a real DCP save of a one-tensor
    model, which is 'another model' for every preset), then damaged; returns the resume override."""
    import torch
    import torch.distributed.checkpoint as dcp

    from vlforge import outputs

    path = root / "out" / "checkpoint-3"
    dcp.save({"model": {"other.weight": torch.zeros(2, 2)}, "optim": {}}, checkpoint_id=path / "weights",
             no_dist=True)
    torch.save({"rank": 0, "world_size": 1, "rng": {}, "data": {}}, path / "rank-0.pt")
    (path / "trainer_state.json").write_text(json.dumps({"step": 3, "world_size": 1, "scheduler": {}}))
    outputs.seal(path, writer="train")
    if damage == "junk state":
        (path / "trainer_state.json").write_text("{ half a file")
    elif damage == "empty state":
        (path / "trainer_state.json").write_text("")
    elif damage == "missing shard":
        next((path / "weights").glob("*.distcp")).unlink()
    elif damage == "no ledger":
        (path / outputs.LEDGER).unlink()
    return f"checkpointing.resume={path}"


# --------------------------------------------------------------------------- the table

Argv = Callable[[Path], list[str]]


@dataclass
class Case:
    command: str
    bad: str
    argv: Argv
    words: tuple[str, ...]
    """Each must appear in the one error line (the file, line, key or option at fault)."""
    slow: bool = False


CASES: list[Case] = [
    # validate / train: the config file itself
    Case("validate", "missing config", lambda r: ["validate", "nothere.yaml"], ("nothere.yaml", "not found")),
    Case("validate", "empty config", lambda r: ["validate", "empty.yaml"], ("empty.yaml", "empty")),
    Case("validate", "directory instead of config", lambda r: ["validate", "a_dir"], ("a_dir",)),
    Case("validate", "malformed YAML", lambda r: ["validate", "bad.yaml"], ("bad.yaml:", "YAML")),
    Case("validate", "mistyped key", lambda r: ["validate", train_yaml(r, "typo.yaml", training={"lerning_rate": 1})],
         ("training.lerning_rate", "did you mean 'learning_rate'")),
    Case("validate", "unknown section", lambda r: ["validate", train_yaml(r, "unk.yaml", trainingg={"x": 1})],
         ("trainingg",)),
    Case("validate", "video_max_frames below a temporal patch",  # the processor would refuse it after the model loaded
         lambda r: ["validate", train_yaml(r, "vmf.yaml", video={"video_max_frames": 1})],
         ("video.video_max_frames: 1 is less than the 2 frames of one temporal patch",)),
    Case("train", "video_max_frames below a temporal patch",
         lambda r: ["train", train_yaml(r, "vmf_train.yaml", video={"video_max_frames": 1})],
         ("video.video_max_frames: 1 is less than the 2 frames of one temporal patch",)),
    Case("validate", "zero batch size", lambda r: ["validate", train_yaml(r, "zero.yaml"),
                                                   "training.per_device_train_batch_size=0"],
         ("per_device_train_batch_size", "0")),
    Case("validate", "negative packing length", lambda r: ["validate", train_yaml(r, "neg.yaml"),
                                                           "packing.packing_length=-8"], ("packing_length", "-8")),
    Case("validate", "unknown tiny preset", lambda r: ["validate", train_yaml(r, "preset.yaml", model="tiny:qwen9")],
         ("model.load_from_pretrained_path", "qwen9", "did you mean")),
    Case("validate", "missing local checkpoint", lambda r: ["validate", train_yaml(r, "ckpt.yaml", model="./gone")],
         ("model.load_from_pretrained_path", "gone", "does not exist")),
    Case("validate", "missing dataset", lambda r: ["validate", train_yaml(r, "nodata.yaml", data="gone.jsonl")],
         ("data.dataset_path", "gone.jsonl", "not found")),
    Case("validate", "dataset is a directory", lambda r: ["validate", train_yaml(r, "dirdata.yaml", data="a_dir"),
                                                          "data.dataset_format=jsonl"], ("a_dir", "directory")),
    Case("validate", "dataset without a record", lambda r: ["validate", train_yaml(r, "blank.yaml", data="blank.jsonl")],
         ("data.dataset_path", "the datasets hold no records", "blank.jsonl")),
    Case("plan", "missing config", lambda r: ["plan", "nothere.yaml"], ("nothere.yaml", "not found")),
    Case("plan", "unknown memory size", lambda r: ["plan", train_yaml(r, "p_mem.yaml"), "--gpu-memory", "lots"],
         ("--gpu-memory", "lots")),
    Case("plan", "zero GPUs", lambda r: ["plan", train_yaml(r, "p_gpus.yaml"), "--gpus", "0"], ("--gpus",)),
    Case("plan", "SP degree not dividing the heads", lambda r: ["plan", train_yaml(r, "p_sp.yaml"),
                                                               "sp_ulysses_degree=3", "--gpus", "3"],
         ("sp_ulysses_degree", "attention heads")),
    # init: the model, the data and the output before anything loads; then the data's records
    Case("init", "missing data", lambda r: ["init", "--model", MISSING_MODEL, "--data", "gone.jsonl"],
         ("--data", "gone.jsonl", "not found")),
    Case("init", "data is a directory", lambda r: ["init", "--model", MISSING_MODEL, "--data", "a_dir"],
         ("--data", "a_dir", "directory")),
    Case("init", "data of no known format", lambda r: ["init", "--model", MISSING_MODEL, "--data", "a_file"],
         ("--data", "a_file", "suffix")),
    Case("init", "unknown preset", lambda r: ["init", "--model", "tiny:qwen9", "--data", "good.jsonl"], ("qwen9",)),
    Case("init", "zero GPUs", lambda r: ["init", "--model", MISSING_MODEL, "--data", "good.jsonl", "--gpus", "0"],
         ("--gpus",)),
    Case("init", "unknown memory size", lambda r: ["init", "--model", MISSING_MODEL, "--data", "good.jsonl",
                                                   "--gpu-memory", "lots"], ("--gpu-memory", "lots")),
    Case("init", "a file of yours as --out", lambda r: ["init", "--model", MISSING_MODEL, "--data", "good.jsonl",
                                                        "--out", "a_file"], ("--out", "a_file", "refusing")),
    Case("init", "no usable record", lambda r: ["init", "--model", "tiny:qwen2_vl", "--data", "all_bad.jsonl"],
         ("all_bad.jsonl", "none of the 1 sampled records", "assistant")),
    Case("train", "missing dataset", lambda r: ["train", train_yaml(r, "t_nodata.yaml", data="gone.jsonl")],
         ("gone.jsonl", "not found")),
    Case("train", "dataset without a record", lambda r: ["train", train_yaml(r, "t_blank.yaml", data="blank.jsonl")],
         ("data.dataset_path", "the datasets hold no records", "blank.jsonl")),
    Case("train", "output under a file", lambda r: ["train", train_yaml(r, "t_out.yaml", output_dir="a_file/run")],
         ("output_dir", "a_file", "is a file")),
    Case("train", "unwritable output", lambda r: ["train", train_yaml(r, "t_unw.yaml",
                                                                      output_dir="/proc/vlforge-no/run")],
         ("output_dir", "/proc/vlforge-no/run")),
    *[Case("train", f"{fault} (on_error: raise)",
           lambda r, f=fault: ["train", train_yaml(r, f"t_{f.replace(' ', '_')}.yaml",
                                                   data=f"{f.replace(' ', '_')}.jsonl")],
           (f"{fault.replace(' ', '_')}.jsonl", "line 1", FAULTS[fault][1]), slow=True)
      for fault in FAULTS],
    Case("train", "empty after filtering (max_steps)",
         lambda r: ["train", train_yaml(r, "t_filtered.yaml", packing={"packing": False, "max_length": 4,
                                                                          "filter_overlong": True})],
         ("good.jsonl", "no usable sample", "overlong=")),
    Case("train", "empty after filtering (epochs)",
         lambda r: ["train", train_yaml(r, "t_filtered_ep.yaml", training={"max_steps": None, "num_train_epochs": 1},
                                        packing={"packing": False, "max_length": 4, "filter_overlong": True})],
         ("no usable sample", "overlong=")),
    *[Case("train", f"resume from a checkpoint: {damage}",
           lambda r, d=damage: ["train", train_yaml(r, f"t_{d.replace(' ', '_')}.yaml"), damaged_checkpoint(r, d)],
           ("checkpointing.resume", "checkpoint-3", words))
      for damage, words in (("junk state", "trainer_state.json is not JSON"),
                            ("empty state", "trainer_state.json is not JSON (empty file)"),
                            ("missing shard", "incomplete: weights/"),
                            ("no ledger", "not written by vlforge"),
                            ("another model's weights", "holds another model's weights"))],
    # extract
    Case("extract", "missing data", lambda r: ["extract", "--model", MISSING_MODEL, "--data", "gone.jsonl",
                                               "--out", "ex"], ("--data", "gone.jsonl", "not found")),
    Case("extract", "data is a directory", lambda r: ["extract", "--model", MISSING_MODEL, "--data", "a_dir",
                                                      "--out", "ex"], ("--data", "a_dir", "directory")),
    Case("extract", "zero batch size", lambda r: ["extract", "--model", MISSING_MODEL, "--data", "good.jsonl",
                                                  "--out", "ex", "--batch-size", "0"], ("--batch-size",)),
    Case("extract", "layer out of range", lambda r: ["extract", "--model", "tiny:qwen2_vl", "--data", "good.jsonl",
                                                     "--out", "ex", "--features", "hidden_mean", "--layers", "99"],
         ("--layers 99",)),
    Case("extract", "output under a file", lambda r: ["extract", "--model", MISSING_MODEL, "--data", "good.jsonl",
                                                      "--out", "a_file/ex"], ("--out", "a_file")),
    Case("extract", "malformed JSON line (on_error raise)",
         lambda r: ["extract", "--model", "tiny:qwen2_vl", "--data", "malformed_JSON_line.jsonl", "--out", "exr",
                    "--on-error", "raise", "--no-token-audit", "--no-progress"],
         ("malformed_JSON_line.jsonl", "line 1"), slow=True),
    # profile / verify: input files and sizes
    Case("profile", "missing image", lambda r: ["profile", "--model", MISSING_MODEL, "--image", "gone.png"],
         ("--image", "gone.png", "not found")),
    Case("profile", "frames without a video", lambda r: ["profile", "--model", MISSING_MODEL, "--video-frames", "4"],
         ("--video-frames", "--video", "not given")),
    Case("profile", "image is a directory", lambda r: ["profile", "--model", MISSING_MODEL, "--image", "a_dir"],
         ("--image", "a_dir", "directory")),
    Case("profile", "truncated image", lambda r: ["profile", "--model", MISSING_MODEL, "--image", "cut.png"],
         ("--image", "cut.png", "truncated")),
    Case("profile", "corrupt video", lambda r: ["profile", "--model", MISSING_MODEL, "--video", "broken.mp4"],
         ("--video", "broken.mp4")),
    Case("profile", "zero batch size", lambda r: ["profile", "--model", MISSING_MODEL, "--batch-sizes", "0"],
         ("batch",)),
    Case("profile", "bad synthetic size", lambda r: ["profile", "--model", MISSING_MODEL, "--synthetic", "0x8x8"],
         ("--synthetic", "0x8x8")),
    Case("verify", "missing model", lambda r: ["verify", "--model", MISSING_MODEL], (MISSING_MODEL,)),
    Case("verify", "model dir without config.json", lambda r: ["verify", "--model", "a_dir"],
         ("a_dir", "config.json")),
    Case("verify", "missing image", lambda r: ["verify", "--model", MISSING_MODEL, "--image", "gone.png"],
         ("--image", "gone.png")),
    # doctor
    Case("doctor", "unknown device", lambda r: ["doctor", "--assume", "device=tpu"], ("device", "tpu", "cuda")),
    Case("doctor", "unknown fact", lambda r: ["doctor", "--assume", "cudn=9"], ("cudn", "did you mean")),
    Case("doctor", "ignored flag", lambda r: ["doctor", "--model", MISSING_MODEL, "--no-tokens", "--format", "r1"],
         ("--format", "--no-tokens")),
    Case("doctor", "unknown dtype", lambda r: ["doctor", "--dtype", "fp8"], ("fp8",)),
    Case("doctor", "a zero time budget", lambda r: ["doctor", "--model", MISSING_MODEL, "--bench-seconds", "0"],
         ("--bench-seconds", "greater than 0")),
    Case("doctor", "unknown preset", lambda r: ["doctor", "--model", "tiny:qwen9", "--no-bench"],
         ("qwen9",)),
    # tokens
    Case("tokens audit", "missing model", lambda r: ["tokens", "audit", "--model", MISSING_MODEL], (MISSING_MODEL,)),
    Case("tokens audit", "missing template", lambda r: ["tokens", "audit", "--model", "tiny:qwen2_vl", "--template",
                                                        "gone.jinja"], ("--template", "gone.jinja")),
    Case("tokens fix", "id out of range", lambda r: ["tokens", "fix", "--model", "tiny:qwen2_vl", "--out", "fixed",
                                                     "--ids", "99999999"], ("--ids", "99999999"), slow=True),
    Case("tokens audit", "a folder without tokenizer files", lambda r: ["tokens", "audit", "--tokenizer", "a_dir"],
         ("a_dir", "no tokenizer files in it")),
    Case("tokens fix", "id beyond a local checkpoint's vocabulary, before it loads",
         lambda r: ["tokens", "fix", "--model", "config_only", "--out", "fixed", "--ids", "5,70000"],
         ("--ids [70000]", "outside the embedding rows [0, 1000)")),
    Case("tokens scan", "reference id beyond the vocabulary", lambda r: ["tokens", "scan", "--model", "config_only",
                                                                         "--reference-ids", "-1"],
         ("--reference-ids [-1]", "outside the embedding rows [0, 1000)")),
    Case("tokens scan", "missing model", lambda r: ["tokens", "scan", "--model", MISSING_MODEL], (MISSING_MODEL,)),
    Case("rl check", "missing model", lambda r: ["rl", "check", "--model", MISSING_MODEL, "--format-regex", "<think>"],
         (MISSING_MODEL,)),
    Case("rl check", "no reward", lambda r: ["rl", "check", "--model", "tiny:qwen2_vl"], ("--reward", "--format-regex")),
    Case("rl probe", "prompts not a dataset", lambda r: ["rl", "probe", "--model", "tiny:qwen2_vl", "--format-regex",
                                                        "<think>", "--prompts", "a_file"],
         ("--prompts", "a_file")),
    Case("tokens scan", "checkpoint is a file", lambda r: ["tokens", "scan", "--model", "a_file"], ("a_file",)),
    # export / tiny
    Case("export", "missing checkpoint", lambda r: ["export", "nothere", "exported"], ("nothere",)),
    Case("export", "checkpoint is a file", lambda r: ["export", "a_file", "exported"], ("a_file",)),
    Case("tiny", "unknown family", lambda r: ["tiny", "qwen9_vl", "tinyout"], ("qwen9_vl", "qwen2_vl")),
    Case("tiny", "output under a file", lambda r: ["tiny", "qwen2_vl", "a_file/tiny"], ("a_file", "is a file")),
]


def _case_id(case: Case) -> str:
    return f"{case.command}: {case.bad}"


@pytest.mark.parametrize("case", [pytest.param(c, id=_case_id(c), marks=[pytest.mark.slow] if c.slow else [])
                                  for c in CASES])
def test_bad_input_is_one_line_exit_2(case: Case, media: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    shutil.copytree(media, work)
    argv = case.argv(work)
    run = run_cli(argv, work, monkeypatch)
    assert "Traceback" not in run.err, run.err[-3000:]
    assert run.code == 2, f"exit {run.code} for {argv}:\n{run.err[-3000:]}"
    assert len(run.error_lines) == 1, run.err[-3000:]
    assert run.out == "", run.out[-2000:]
    line = run.error_lines[0]
    for word in case.words:
        assert word in line, f"{word!r} not in {line!r}"


def test_the_matrix_covers_every_command() -> None:
    commands = {f"{name} {sub}" if sub else name for name, entry in cli.COMMANDS.items()
                for sub in (entry.commands if isinstance(entry, cli.Group) else [""])}
    assert {"train", "tokens audit", "extract"} <= commands
    covered = {case.command for case in CASES}
    assert commands - {"demo", "version"} <= covered, sorted(commands - covered)


# --------------------------------------------------------------------------- skips are counted, never silent


@pytest.mark.slow
def test_extract_skips_bad_records_with_file_and_line(media: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    shutil.copytree(media, work)
    lines = (work / "good.jsonl").read_text().splitlines()
    faults = [FAULTS[name][0]() for name in ("truncated image", "malformed JSON line", "no assistant turn")]
    (work / "mixed.jsonl").write_text("\n".join([lines[0], *faults, lines[1]]) + "\n")
    run = run_cli(["extract", "--model", "tiny:qwen2_vl", "--data", "mixed.jsonl", "--out", "cache",
                   "--no-token-audit", "--no-progress", "--json", "--max-skip-fraction", "1"], work, monkeypatch)
    assert run.code == 0, run.err[-3000:]
    summary = json.loads(run.out)
    assert summary["rows_written"] == 2 and sum(summary["skipped"].values()) == 3
    ledger = [json.loads(line) for line in (work / "cache" / "errors.jsonl").read_text().splitlines()]
    assert sorted(entry["location"] for entry in ledger) == ["line 2", "line 3", "line 4"]
    assert {Path(entry["source"]).name for entry in ledger} == {"mixed.jsonl"}


def test_outputs_next_to_user_files_leave_them_alone(media: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    shutil.copytree(media, work)
    planted = {work / "fixed" / "notes.txt": USER_BYTES, work / "exported" / "README.md": USER_BYTES,
               work / "tinyout" / "mine.bin": USER_BYTES}
    for path, data in planted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for argv, word in [(["tiny", "qwen2_vl", "tinyout"], "tinyout"),
                       (["tokens", "fix", "--model", "tiny:qwen2_vl", "--out", "fixed", "--ids", "1"], "fixed")]:
        run = run_cli(argv, work, monkeypatch)
        assert run.code == 2 and len(run.error_lines) == 1 and word in run.error_lines[0], run.err[-2000:]
    for path, data in planted.items():
        assert path.read_bytes() == data, f"{path} changed"
