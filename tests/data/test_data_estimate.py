"""Batch counts from metadata and a sample: exact where lengths do not matter, close where they do, cached."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datakit import chat, text_records, write_jsonl

from vlforge.data import DataConfig, DataStream
from vlforge.data.config import resolve_entries
from vlforge.data.estimate import estimate_batches, fingerprint, record_counts


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _varied(n: int, start: int = 0) -> list[dict]:
    return [chat(f"Question {i}: " + "word " * ((i * 37) % 90), "Answer" + " ok" * ((i * 11) % 30))
            for i in range(start, start + n)]


def _real_batches(cfg, proc, base, shard, num_shards) -> int:
    return sum(1 for _ in DataStream(cfg, proc, base_dir=base, shard_id=shard, num_shards=num_shards))


def test_record_counts_come_from_metadata_with_max_samples(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [*text_records(30), "", *text_records(5, start=50)])
    pq.write_table(pa.Table.from_pylist(text_records(44)), tmp_path / "b.parquet", row_group_size=10)
    (tmp_path / "c.json").write_text(json.dumps(text_records(7)))
    cfg = DataConfig(datasets=[{"path": "a.jsonl"}, {"path": "b.parquet", "max_samples": 40}, {"path": "c.json"}])
    assert record_counts(resolve_entries(cfg, tmp_path)) == [35, 40, 7]


@pytest.mark.parametrize("mode", [{"batch_size": 3}, {"batch_size": 4, "group_by_length": True, "group_window": 10},
                                  {"batch_size": 1}])
@pytest.mark.parametrize("num_shards", [1, 2, 3])
def test_padded_batches_are_exact_when_nothing_is_skipped(make_processor, tmp_path, mode, num_shards):
    write_jsonl(tmp_path / "a.jsonl", _varied(70))
    write_jsonl(tmp_path / "b.jsonl", _varied(33, start=500))
    cfg = DataConfig(datasets=[{"path": "a.jsonl"}, {"path": "b.jsonl", "weight": 2}], epochs=2, seed=1, **mode)
    proc = make_processor()
    est = estimate_batches(cfg, proc, base_dir=tmp_path, shards=list(range(num_shards)), num_shards=num_shards,
                           sample=32)
    assert est.records == 103 and est.sampled == 32 and est.admitted_fraction == 1.0
    assert est.batches == [_real_batches(cfg, proc, tmp_path, s, num_shards) for s in range(num_shards)]


def test_packed_rows_are_estimated_within_a_few_percent(make_processor, tmp_path):
    write_jsonl(tmp_path / "a.jsonl", _varied(600))
    cfg = DataConfig(filter_overlong=True, datasets=[{"path": "a.jsonl"}], packing=True, packing_length=400, epochs=1, seed=2)
    proc = make_processor()
    real = _real_batches(cfg, proc, tmp_path, 0, 1)
    est = estimate_batches(cfg, proc, base_dir=tmp_path, shards=[0], num_shards=1, sample=128)
    assert abs(est.batches[0] - real) / real < 0.06, (est.batches, real)


def test_skips_in_the_sample_scale_the_estimate(make_processor, tmp_path):
    records = _varied(300)
    for i in range(0, 300, 4):
        records[i] = "{broken"
    write_jsonl(tmp_path / "a.jsonl", records)
    cfg = DataConfig(datasets=[{"path": "a.jsonl"}], on_error="skip", batch_size=2)
    proc = make_processor()
    est = estimate_batches(cfg, proc, base_dir=tmp_path, shards=[0], num_shards=1, sample=200)
    assert est.skipped.get("malformed_json", 0) > 20
    real = _real_batches(cfg, proc, tmp_path, 0, 1)
    assert abs(est.batches[0] - real) / real < 0.08, (est.batches, real)


def test_the_length_sample_is_cached_by_content(make_processor, tmp_path):
    write_jsonl(tmp_path / "a.jsonl", _varied(120))
    cfg = DataConfig(filter_overlong=True, datasets=[{"path": "a.jsonl"}], packing=True, packing_length=300)
    proc = make_processor()
    calls = []
    original = proc.process

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    proc.process = counting
    first = estimate_batches(cfg, proc, base_dir=tmp_path, shards=[0], num_shards=1, sample=40)
    assert not first.cached and len(calls) == 40 and first.sidecar.is_file()
    second = estimate_batches(cfg, proc, base_dir=tmp_path, shards=[0], num_shards=1, sample=40)
    assert second.cached and len(calls) == 40 and second.batches == first.batches
    before = fingerprint(tmp_path / "a.jsonl")
    write_jsonl(tmp_path / "a.jsonl", _varied(120, start=7))  # same size class, other content
    assert fingerprint(tmp_path / "a.jsonl") != before
    third = estimate_batches(cfg, proc, base_dir=tmp_path, shards=[0], num_shards=1, sample=40)
    assert not third.cached and len(calls) == 80
