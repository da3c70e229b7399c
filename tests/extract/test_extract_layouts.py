"""``vlforge extract`` reads the layouts users hold: a LLaVA-OneVision-style parquet file with the image bytes inside
gives the features of the same conversations in the ``messages`` layout, row for row (LLaVA JSON goes through
the same reader; tests/train/test_train_layouts.py trains on it)."""

from __future__ import annotations

import json

import torch

from badrows import vlforge_cli
from layoutkit import write_layout_datasets
from vlforge.extract import open_cache


def test_parquet_with_image_bytes_extracts_the_features_of_the_messages_layout(tmp_path, monkeypatch, qwen3_ckpt):
    files = write_layout_datasets(tmp_path / "data")
    caches = {}
    for name in ("messages", "parquet"):
        dataset = files[name]
        out = tmp_path / f"cache-{name}"
        code, stdout, stderr = vlforge_cli(["extract", "--model", str(qwen3_ckpt), "--data", str(dataset), "--out",
                                            str(out), "--features", "vision_pooled,hidden_mean", "--json"], monkeypatch)
        assert code == 0, stderr[-2000:]
        assert json.loads(stdout)["cache"] == {"num_rows": 4, "num_skipped": 0, "skipped": {}}
        caches[name] = open_cache(out, verify=True)
    assert caches["parquet"].ids == ["0", "1", "2", "3"]  # the records' own "id"
    for i in range(4):
        for key in ("hidden_mean", "vision_pooled", "vision_items"):
            expected = caches["messages"][i][key]
            assert torch.equal(caches["parquet"][i][key], expected), (i, key)
    assert caches["messages"][0]["vision_items"].shape[0] == 1 and caches["messages"][3]["vision_items"].shape[0] == 0
