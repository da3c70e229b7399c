"""`import vlforge` is enough: AutoProcessor / AutoVideoProcessor of every tiny family without torchvision.

Each check runs in a fresh interpreter, because the point is what a user's script sees: ``import vlforge``
and nothing else of vlforge, then plain transformers. ``import vlforge`` itself must not import torch or
transformers (the CLI answers ``--help`` and bad arguments before loading either).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers.utils import is_torchvision_available

from vlforge.models.tiny import families

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# GLM-4V writes a video as per-frame image placeholders (with timestamps), Qwen as video placeholders.
FRAMES_AS_IMAGES = {"glm4v", "glm4v_moe"}
OURS = {"qwen2_vl": "Qwen2VLFramesVideoProcessor", "qwen2_5_vl": "Qwen2VLFramesVideoProcessor",
        "qwen3_vl": "Qwen3VLFramesVideoProcessor", "qwen3_vl_moe": "Qwen3VLFramesVideoProcessor",
        "qwen3_5": "Qwen3VLFramesVideoProcessor", "qwen3_5_moe": "Qwen3VLFramesVideoProcessor",
        "glm4v": "Glm4vFramesVideoProcessor", "glm4v_moe": "Glm4vFramesVideoProcessor"}


def _python(code_or_args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, *code_or_args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_import_vlforge_imports_neither_torch_nor_transformers():
    code = """
import json, sys
import vlforge
from vlforge.models.compat import install_import_hook
install_import_hook(); install_import_hook()                       # idempotent
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "torchvision"))
hooks = [type(f).__name__ for f in sys.meta_path if getattr(f, "vlforge_processor_hook", False)]
names = (vlforge.__version__, vlforge.__all__, sorted(set(vlforge.__all__) - set(dir(vlforge))))
print(json.dumps({"heavy": heavy, "hooks": hooks, "names": names, "patch": vlforge.patch.__module__,
                  "torch_after_patch": "torch" in sys.modules}))
"""
    report = json.loads(_python(["-c", code]).stdout)
    assert report["heavy"] == []
    assert report["hooks"] == ([] if is_torchvision_available() else ["_ProcessorHook"])
    version, public, missing_from_dir = report["names"]
    assert version == "0.1.0" and set(public) == {"PatchReport", "__version__", "patch", "patch_transformers",
                                                  "unpatch"}
    assert missing_from_dir == []
    assert report["patch"] == "vlforge.patches.registry" and report["torch_after_patch"]  # resolved on first use


def test_auto_processor_of_every_family_after_import_vlforge(tiny_checkpoint):
    names = families()
    assert {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v"} <= set(names)
    dirs = [str(tiny_checkpoint(family)) for family in names]
    report = json.loads(_python([str(HERE / "stock_loader.py"), *dirs, "--processor", "--import-vlforge"]).stdout)
    # nothing of vlforge beyond `import vlforge` and what its hook loads (the family records: light, no torch)
    assert set(report["vlforge_modules"]) <= {"vlforge", "vlforge.lazy", "vlforge.models", "vlforge.models.compat",
                                              "vlforge.models.frames_video", "vlforge.models.families",
                                              "vlforge.errors", "vlforge.media", "vlforge.media.resize",
                                              "vlforge.versions"}
    for family, directory in zip(names, dirs, strict=True):
        entry = report["directories"][directory]
        assert entry["model_type"] == family and entry["unknown"] == []
        if not report["torchvision"]:
            assert entry["video_processor"] == entry["auto_video_processor"] == OURS[family]
        t, h, w = entry["video_grid"][0]
        assert t == 2 and entry["video_rows"] == t * h * w  # 4 frames, temporal patch 2
        assert entry["image_rows"] == (lambda g: g[0] * g[1] * g[2])(entry["image_grid"][0])
        if family in FRAMES_AS_IMAGES:
            assert entry["image_placeholders"] == entry["image_tokens"] + entry["video_tokens"]
        else:
            assert entry["image_placeholders"] == entry["image_tokens"] > 0
            assert entry["video_placeholders"] == entry["video_tokens"] > 0


@pytest.mark.skipif(is_torchvision_available(), reason="with torchvision there is nothing to install")
def test_import_order_does_not_matter(tiny_checkpoint):
    """transformers' processor machinery imported before vlforge; AutoVideoProcessor from the top module."""
    directory = tiny_checkpoint("qwen3_vl")
    code = f"""
import json, sys
import transformers
from transformers import AutoProcessor
import vlforge
from transformers import AutoVideoProcessor
processor = AutoProcessor.from_pretrained({str(directory)!r})
video = AutoVideoProcessor.from_pretrained({str(directory)!r})
hooks = [f for f in sys.meta_path if getattr(f, "vlforge_processor_hook", False)]
print(json.dumps([type(processor.video_processor).__name__, type(video).__name__, len(hooks)]))
"""
    assert json.loads(_python(["-c", code]).stdout) == ["Qwen3VLFramesVideoProcessor"] * 2 + [0]


@pytest.mark.skipif(is_torchvision_available(), reason="with torchvision there is nothing to install")
def test_without_import_vlforge_stock_transformers_needs_torchvision(tiny_checkpoint):
    """The control: the same load without `import vlforge` fails here, so the test above tests something."""
    code = f"""
from transformers import AutoProcessor
try:
    AutoProcessor.from_pretrained({str(tiny_checkpoint("qwen2_vl"))!r})
except Exception as error:
    print("failed:", error)
"""
    out = _python(["-c", code]).stdout
    assert out.startswith("failed:") and "torchvision" in out.lower()


@pytest.mark.parametrize("name", ["vlforge", "vlforge.models.compat", "vlforge.models.portable",
                                  "vlforge.models.frames_video"])
def test_docstring_examples(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
