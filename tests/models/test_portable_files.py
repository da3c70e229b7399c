"""Every file vlforge writes names only classes stock transformers has (issue 17, deliverable 4).

Tiny checkpoints of every family and a ``vlforge train`` export are read in processes that never import
vlforge (``stock_loader.py``): every class-name-like value of every JSON file must exist in stock
transformers, and AutoConfig / AutoTokenizer load. Where a Python with torchvision is at hand
(``VLFORGE_TORCHVISION_PYTHON``, or LMMS Engine's peer venv built by ``scripts/peer_env.py``), stock
``AutoProcessor`` loads the same directories with its torchvision classes and processes an image and a
video to the same grids as vlforge's torchvision-free processors here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vlforge.models import tiny
from vlforge.models.load import preset_dir
from vlforge.models.portable import make_portable, portable_video_settings

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STOCK_VIDEO = {"qwen2_vl": "Qwen2VLVideoProcessor", "qwen2_5_vl": "Qwen2VLVideoProcessor",
               "qwen3_vl": "Qwen3VLVideoProcessor", "qwen3_vl_moe": "Qwen3VLVideoProcessor",
               "qwen3_5": "Qwen3VLVideoProcessor", "qwen3_5_moe": "Qwen3VLVideoProcessor",
               "glm4v": "Glm4vVideoProcessor", "glm4v_moe": "Glm4vVideoProcessor"}
PEER_HINT = ("set VLFORGE_TORCHVISION_PYTHON to a Python with torchvision and transformers, or build LMMS "
             "Engine's venv (it has torchvision): python scripts/peer_env.py build")


def _stock(python: str, directories: list[Path], *flags: str) -> dict:
    """Run stock_loader.py with ``python`` in a clean environment (no PYTHONPATH: vlforge is never imported)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([python, str(HERE / "stock_loader.py"), *map(str, directories), *flags],
                          capture_output=True, text=True, env=env, timeout=600, cwd=HERE)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["vlforge_modules"] == [] or "--import-vlforge" in flags
    return report


def _peer_python() -> str | None:
    """A Python with torchvision: $VLFORGE_TORCHVISION_PYTHON, else a built LMMS Engine peer venv."""
    if os.environ.get("VLFORGE_TORCHVISION_PYTHON"):
        return os.environ["VLFORGE_TORCHVISION_PYTHON"]
    if os.environ.get("VLFORGE_PEER_DIR"):  # the same place scripts/peer_env.py builds to
        peer = Path(os.environ["VLFORGE_PEER_DIR"]).expanduser()
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        peer = cache / "vlforge" / "peers" / "lmms-engine-0.1.4"
    python = peer / "bin" / "python"
    return str(python) if (peer / "vlforge-peer.json").is_file() and python.is_file() else None


@pytest.fixture(scope="module")
def written(tiny_checkpoint, tmp_path_factory):
    """Tiny checkpoints of every family, a one-step training run's export, and an export and a token fix
    whose source checkpoint was written by an older vlforge (processor files naming vlforge's classes)."""
    from vlforge.config.schema import TrainConfig
    from vlforge.tokens.fix import FixOptions, fix_checkpoint
    from vlforge.train.export import export_checkpoint
    from vlforge.train.trainer import run

    dirs = {family: tiny_checkpoint(family) for family in tiny.families()}
    root = tmp_path_factory.mktemp("portable")
    cfg = {  # one step over the bundled example data (images and a video), a checkpoint, the export
        "data": {"dataset_path": str(REPO / "examples" / "data" / "dataset.yaml")},
        "processor": {"max_pixels": 12544},
        "video": {"video_max_frames": 4, "video_max_pixels": 3136},
        "model": {"load_from_pretrained_path": str(dirs["qwen3_vl"])},
        "training": {"max_steps": 1, "seed": 0},
        "checkpointing": {"output_dir": str(root / "out"), "save_steps": 1, "resume": "none"},
    }
    run(TrainConfig.model_validate(cfg), progress=False)
    dirs["export"] = root / "out" / "final"

    legacy = root / "legacy-source"
    shutil.copytree(dirs["qwen3_vl"], legacy)
    settings = json.loads((legacy / "processor_config.json").read_text())
    settings["video_processor"].update(video_processor_type="Qwen3VLFramesVideoProcessor", resize_rule="video")
    (legacy / "processor_config.json").write_text(json.dumps(settings))
    dirs["legacy_export"] = export_checkpoint(root / "out" / "checkpoint-1", root / "legacy-export",
                                              source=str(legacy))
    dirs["legacy_source"] = legacy
    dirs["legacy_fix"] = root / "legacy-fix"  # vlforge tokens fix copies the source's files
    fix_checkpoint(FixOptions(model=legacy, out=dirs["legacy_fix"], ids=[151668], strategy="trained-mean"))
    return dirs


def test_every_written_name_exists_in_stock_transformers(written):
    names = [*tiny.families(), "export", "legacy_export", "legacy_fix", "legacy_source"]
    report = _stock(sys.executable, [written[name] for name in names])
    entries = {name: report["directories"][str(written[name])] for name in names}
    for name in [*tiny.families(), "export", "legacy_export", "legacy_fix"]:
        entry = entries[name]
        assert entry["unknown"] == [], (name, entry["unknown"])
        family = "qwen3_vl" if name in ("export", "legacy_export", "legacy_fix") else name
        assert entry["model_type"] == family and entry["tokenizer_length"] > 151_000
        assert STOCK_VIDEO[family] in entry["checked"]  # the processor file was read and checked
        video = json.loads((written[name] / "processor_config.json").read_text())["video_processor"]
        assert "resize_rule" not in video
    # the control: the old-style source is caught by the same check
    assert entries["legacy_source"]["unknown"] == [
        "processor_config.json: video_processor_type=Qwen3VLFramesVideoProcessor"]


@pytest.mark.slow
def test_torchvision_python_loads_the_files_with_stock_classes(written):
    """With torchvision, stock transformers (any version new enough) reads vlforge's files unchanged."""
    python = _peer_python()
    if python is None:
        pytest.skip(f"no Python with torchvision: {PEER_HINT}")
    names = [*tiny.families(), "export"]
    theirs = _stock(python, [written[name] for name in names], "--processor")
    assert theirs["torchvision"], f"{python} has no torchvision: {PEER_HINT}"
    ours = _stock(sys.executable, [written[name] for name in names], "--processor", "--import-vlforge")
    for name in names:
        stock, here = theirs["directories"][str(written[name])], ours["directories"][str(written[name])]
        family = "qwen3_vl" if name == "export" else name
        assert stock["unknown"] == [] and stock["model_type"] == family
        assert stock["video_processor"] == stock["auto_video_processor"] == STOCK_VIDEO[family]
        assert not stock["image_processor"].endswith("Pil")  # the torchvision image processor
        for key in ("image_grid", "video_grid", "image_placeholders", "video_placeholders"):
            assert stock[key] == here[key], (name, key)  # same patches as the torchvision-free path


def test_make_portable_rewrites_old_files_only(tmp_path):
    for ours, stock, rule in [("Qwen2VLFramesVideoProcessor", "Qwen2VLVideoProcessor", "per_frame"),
                              ("Qwen3VLFramesVideoProcessor", "Qwen3VLVideoProcessor", "video"),
                              ("Glm4vFramesVideoProcessor", "Glm4vVideoProcessor", "video")]:
        settings = {"video_processor_type": ours, "resize_rule": rule, "min_frames": 4, "fps": 2.0}
        portable = portable_video_settings(settings)
        assert portable["video_processor_type"] == stock and "resize_rule" not in portable
        assert ("min_frames" in portable) == (stock != "Glm4vVideoProcessor")  # GLM's class counts num_frames
    assert portable_video_settings({"video_processor_type": "Qwen2VLVideoProcessor"}) is None
    with pytest.raises(ValueError, match="no stock equivalent"):
        portable_video_settings({"video_processor_type": "Qwen2VLFramesVideoProcessor", "resize_rule": "video"})

    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(
        {"video_processor_type": "Qwen2VLFramesVideoProcessor", "resize_rule": "per_frame", "patch_size": 14}))
    stock_file = {"video_processor": {"video_processor_type": "Qwen3VLVideoProcessor", "fps": 2}}
    (tmp_path / "processor_config.json").write_text(json.dumps(stock_file))
    assert make_portable(tmp_path) == ["video_preprocessor_config.json"]
    assert json.loads((tmp_path / "video_preprocessor_config.json").read_text()) == {
        "video_processor_type": "Qwen2VLVideoProcessor", "patch_size": 14}
    assert json.loads((tmp_path / "processor_config.json").read_text()) == stock_file
    assert make_portable(tmp_path) == []


def test_preset_cache_key_follows_what_is_written(monkeypatch, tmp_path):
    """Presets cached before the files became portable are never reused: the format is in the key."""
    monkeypatch.setenv("VLFORGE_CACHE_DIR", str(tmp_path))
    now = preset_dir("tiny:qwen2_vl")
    assert now.parent == tmp_path / "tiny" and now.name.startswith("qwen2_vl-seed0-")
    monkeypatch.setattr(tiny, "FILES_VERSION", tiny.FILES_VERSION - 1)
    assert preset_dir("tiny:qwen2_vl") != now
    assert not now.exists()  # computing the key writes nothing
