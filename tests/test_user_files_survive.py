"""Nothing of the user's is ever deleted or overwritten: one test per writer (train, export, extract, tokens
fix / audit, profile --trace / --plot, tiny) plants files in every place the writer touches and checks that
they survive byte for byte, and that a refused output is one line, exit 2, before any model loads."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

import warmstart

REPO = Path(__file__).resolve().parents[1]
DATASET = REPO / "examples" / "data" / "dataset.yaml"
USER_BYTES = b"\x00a user's file\xff\n"
MISSING_MODEL = "/nonexistent/model-dir"  # a refusal that names the output proves it came before loading


def plant(*paths: Path) -> dict[Path, bytes]:
    planted = {}
    for i, path in enumerate(paths):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(USER_BYTES + str(i).encode())
        planted[path] = path.read_bytes()
    return planted


def assert_survived(planted: dict[Path, bytes]) -> None:
    for path, data in planted.items():
        assert path.is_file(), f"{path} was deleted"
        assert path.read_bytes() == data, f"{path} was changed"


def vlforge(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([warmstart.python(), "-m", "vlforge.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def assert_refused(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def train_config(tmp_path: Path, output_dir: Path, model: Path | str, **training: object) -> Path:
    cfg = {
        "data": {"dataset_path": str(DATASET)},
        "processor": {"max_pixels": 12544},
        "packing": {"packing": False},
        "video": {"video_max_frames": 4, "video_max_pixels": 3136},
        "model": {"load_from_pretrained_path": str(model)},
        "training": {"max_steps": 2, "learning_rate": 1e-3, "seed": 0, "lr_scheduler_type": "constant",
                     **training},
        "logging": {"logging_steps": 1},
        "checkpointing": {"output_dir": str(output_dir), "save_steps": 1, "save_total_limit": 1,
                          "resume": "auto"},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def qwen3(tiny_checkpoint) -> Path:
    return tiny_checkpoint("qwen3_vl")


def test_train_keeps_user_files_through_pruning_resume_and_export(tmp_path: Path, qwen3: Path) -> None:
    from vlforge.train.trainer import run

    out = tmp_path / "run"
    planted = plant(out / "notes.txt", out / "sub" / "data.bin", out / "checkpoint-7" / "my_own.bin",
                    out / "tensorboard" / "mine.txt")
    cfg = train_config(tmp_path, out, qwen3)
    first = run(cfg, ["training.max_steps=1"], progress=False)
    assert first.export_dir == out / "final" and (out / "final" / "config.json").is_file()
    planted.update(plant(out / "checkpoint-1" / "planted.txt", out / "checkpoint-1" / "weights" / "x.txt"))
    second = run(cfg, ["training.max_steps=3"], progress=False)  # resumes, prunes checkpoint-1, re-exports
    assert second.resumed_from == out / "checkpoint-1" and second.steps == 3
    assert_survived(planted)
    assert sorted(p.name for p in (out / "checkpoint-1").rglob("*") if p.is_file()) == ["planted.txt", "x.txt"]
    assert (out / "checkpoint-3" / "trainer_state.json").is_file()
    assert not any(p.name.startswith(".tmp-") for p in out.iterdir())


def test_train_refuses_a_final_dir_it_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "run"
    planted = plant(out / "final" / "keep.txt")
    cfg = train_config(tmp_path, out, MISSING_MODEL)
    assert_refused(vlforge("train", str(cfg)), "output_dir", str(out / "final"))
    assert_survived(planted)


def test_train_refuses_a_users_metrics_file_and_an_uncreatable_output(tmp_path: Path) -> None:
    out = tmp_path / "run"
    planted = plant(out / "metrics.jsonl")
    assert_refused(vlforge("train", str(train_config(tmp_path, out, MISSING_MODEL))), "metrics.jsonl")
    assert_survived(planted)
    blocker = tmp_path / "a_file"
    planted = plant(blocker)
    assert_refused(vlforge("train", str(train_config(tmp_path, blocker / "run", MISSING_MODEL))),
                   "output_dir", "is a file, not a directory")
    assert_survived(planted)


def test_export_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(json.dumps({"model_path": MISSING_MODEL}))
    planted = plant(tmp_path / "exported" / "mine.txt")
    assert_refused(vlforge("export", str(ckpt), str(tmp_path / "exported")), "not empty")
    assert_survived(planted)


def test_extract_overwrite_removes_only_its_own_files(tmp_path: Path, qwen3: Path) -> None:
    out = tmp_path / "cache"
    args = ["extract", "--model", str(qwen3), "--data", str(DATASET), "--out", str(out), "--batch-size", "4",
            "--features", "hidden_mean", "--no-progress"]
    proc = vlforge(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    planted = plant(out / "README.txt", out / "shards" / "my_notes.json", out / "shards" / "shard-x.bin")
    proc = vlforge(*args[:-1], "--features", "vision_pooled", "--overwrite", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_survived(planted)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["features"] == ["vision_pooled"]
    # a damaged shard is recomputed, and the log says so
    first = out / "shards" / manifest["shards"][0]["file"]
    first.write_bytes(first.read_bytes()[:-8] + b"\x00" * 8)
    proc = vlforge(*args[:-1], "--features", "vision_pooled", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"shard 0 is recomputed: {first.name} is damaged" in proc.stderr
    assert_survived(planted)


def test_extract_refuses_an_output_under_a_file_before_loading(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    planted = plant(blocker)
    assert_refused(vlforge("extract", "--model", MISSING_MODEL, "--data", str(DATASET), "--out",
                           str(blocker / "cache")), "--out", "is a file, not a directory")
    assert_survived(planted)
    folder = tmp_path / "busy"
    planted = plant(folder / "photo.jpg")
    assert_refused(vlforge("extract", "--model", MISSING_MODEL, "--data", str(DATASET), "--out", str(folder)),
                   "--out", "no manifest.json")
    assert_survived(planted)


def test_tokens_fix_and_audit_never_overwrite_user_files(tmp_path: Path, qwen3: Path) -> None:
    planted = plant(tmp_path / "busy" / "mine.txt", tmp_path / "rows.json", tmp_path / "template.jinja")
    assert_refused(vlforge("tokens", "fix", "--model", str(qwen3), "--out", str(tmp_path / "busy"),
                           "--ids", "151667"), "--out", "not empty")
    assert_refused(vlforge("tokens", "fix", "--model", str(qwen3), "--out", str(tmp_path / "fixed"),
                           "--ids", "151667", "--trainable-rows", str(tmp_path / "rows.json")),
                   "--trainable-rows", "not written by vlforge")
    assert_refused(vlforge("tokens", "audit", "--model", str(qwen3), "--format", "r1", "--rewrite-out",
                           str(tmp_path / "template.jinja")), "--rewrite-out", "not written by vlforge")
    assert not (tmp_path / "fixed").exists()
    proc = vlforge("tokens", "fix", "--model", str(qwen3), "--out", str(tmp_path / "fixed"), "--ids", "151667",
                   "--trainable-rows", str(tmp_path / "fresh_rows.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "fixed" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "fresh_rows.json").read_text())["ids"] == [151667]
    assert_survived(planted)


def test_profile_trace_and_plot_never_overwrite_user_files(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    planted = plant(traces / "profile_stock_sdpa_b1.json", tmp_path / "chart.png")
    base = ["profile", "--model", "tiny:qwen3_vl", "--repeats", "1"]
    assert_refused(vlforge(*base, "--trace", str(traces)), "--trace", "profile_stock_sdpa_b1.json")
    planted.update(plant(traces / "unrelated.txt"))
    (traces / "profile_stock_sdpa_b1.json").rename(traces / "renamed_by_user.json")
    planted[traces / "renamed_by_user.json"] = planted.pop(traces / "profile_stock_sdpa_b1.json")
    proc = vlforge(*base, "--trace", str(traces), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((traces / "profile_stock_sdpa_b1.json").read_text())  # ours, readable
    again = vlforge(*base, "--trace", str(traces), "--json")  # our own trace may be replaced
    assert again.returncode == 0, again.stderr[-3000:]
    assert_survived(planted)
    pytest.importorskip("matplotlib")
    assert_refused(vlforge(*base, "--plot", str(tmp_path / "chart.png")), "--plot", "not written by vlforge")
    assert_survived(planted)


def test_tiny_replaces_only_its_own_clean_output(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    assert vlforge("tiny", "qwen2_vl", str(out)).returncode == 0
    assert vlforge("tiny", "qwen2_vl", str(out), "--seed", "1").returncode == 0  # its own: replaced
    planted = plant(out / "my_notes.md")
    assert_refused(vlforge("tiny", "qwen2_vl", str(out)), "OUT_DIR", "my_notes.md")
    other = tmp_path / "other"
    planted.update(plant(other / "x.txt"))
    assert_refused(vlforge("tiny", "qwen2_vl", str(other)), "OUT_DIR", "not written by vlforge")
    assert_survived(planted)
