"""The bundled example dataset: regenerates byte-identically and processes without a single skip."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from vlforge.data import DataConfig, DataStream, build_processor, load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"


def test_generator_reproduces_the_committed_files(tmp_path):
    module = runpy.run_path(str(EXAMPLES / "make_example_data.py"))
    module["main"](tmp_path)
    produced = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert produced
    for rel in produced:
        assert (EXAMPLES / rel).read_bytes() == (tmp_path / rel).read_bytes(), rel
    total = sum(p.stat().st_size for p in EXAMPLES.rglob("*") if p.is_file())
    assert total < 300_000


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_example_dataset_streams_cleanly(make_processor, family, tmp_path):
    cfg = DataConfig(filter_overlong=True, datasets="dataset.yaml", packing=True, packing_length=1024,
                     error_report=str(tmp_path / "skipped.json"))
    stream = DataStream(cfg, make_processor(family, max_pixels=96 * 64, video_max_pixels=64 * 48), base_dir=EXAMPLES)
    batches = list(stream)
    report = stream.report()
    assert report["skipped_total"] == 0
    assert report["packing"]["samples"] == len((EXAMPLES / "train.jsonl").read_text().splitlines())
    assert sum("pixel_values_videos" in b for b in batches) >= 1
    assert sum(int(b["image_grid_thw"].shape[0]) for b in batches if "image_grid_thw" in b) == 7
    assert (tmp_path / "skipped.json").is_file()


def test_shipped_data_config_validates_and_runs(tokenizer):
    cfg = load_config(EXAMPLES / "data.yaml")
    assert cfg.packing and cfg.video_max_pixels == 50176 and cfg.datasets == "dataset.yaml"
    stream = DataStream(cfg, build_processor(cfg, tokenizer, "qwen2_5_vl"), base_dir=EXAMPLES)
    batches = list(stream)
    assert stream.report()["skipped_total"] == 0 and len(batches) == 1
    # 2 s at fps 2 -> 4 frames; 48x64 -> 56x56 (factor 28; the floor drops below the 50176 ceiling)
    assert batches[0]["video_grid_thw"].tolist() == [[2, 4, 4]]


def test_example_llava_file_streams_cleanly(make_processor):
    cfg = DataConfig(datasets=[{"path": "llava.json"}])
    stream = DataStream(cfg, make_processor("qwen3_vl", max_pixels=96 * 64), base_dir=EXAMPLES)
    batches = list(stream)
    assert stream.report()["skipped_total"] == 0 and len(batches) == 5
    assert [int(b["image_grid_thw"].shape[0]) if "image_grid_thw" in b else 0 for b in batches] == [1, 1, 1, 1, 0]
    assert stream.formats[0].describe() == "sharegpt: conversations of {from, value} (detected from item 1)"
