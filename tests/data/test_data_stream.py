"""The whole stream: on_error accounting, overlong filtering, exact resume, rank/worker sharding."""

from __future__ import annotations

import json

import pytest
from datakit import chat, text_records, write_jsonl

from vlforge.data import DataConfig, DataStream, ResumableLoader, SampleError, StreamingDataset
from vlforge.errors import DataError


def _dataset(tmp_path, n_a=40, n_b=25):
    media = tmp_path / "media"
    media.mkdir()
    from datakit import write_image

    write_image(media / "a.png")
    a = text_records(n_a)
    for i in range(0, n_a, 5):  # every fifth record of a carries an image
        a[i] = chat([{"type": "image", "image": "a.png"}, {"type": "text", "text": f"image question {i}"}])
    write_jsonl(tmp_path / "a.jsonl", a)
    write_jsonl(tmp_path / "b.jsonl", text_records(n_b, start=1000))
    return [{"path": "a.jsonl", "data_folder": "media"}, {"path": "b.jsonl", "weight": 0.5}]


def _ids(batch) -> list:
    return [tuple(x) for x in batch["sample_ids"]]


def _drain(stream) -> list:
    return [(_ids(b), b["input_ids"].tolist()) for b in stream]


def test_on_error_skip_counts_every_reason_and_writes_the_report(make_processor, tmp_path, media_dir):
    records = [chat("fine"), "{broken json", {"messages": 5}, chat([{"type": "image", "image": "gone.png"}]),
               {"messages": [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "x"}], "images": []},
               chat("long " * 300), chat("also fine")]
    write_jsonl(media_dir / "mixed.jsonl", records)
    report = tmp_path / "out" / "skipped.json"
    cfg = DataConfig(filter_overlong=True, datasets=[{"path": "mixed.jsonl"}], on_error="skip", error_report=str(report), max_length=200)
    stream = DataStream(cfg, make_processor(), base_dir=media_dir)
    batches = list(stream)
    assert [b["sample_ids"][0][1] for b in batches] == ["line 1", "line 7"]
    saved = json.loads(report.read_text())
    assert saved["skipped"] == {"malformed_json": 1, "missing_file": 1, "overlong": 1, "placeholder_mismatch": 1,
                                "schema": 1}
    assert saved["skipped_total"] == 5 and saved["packing"]["samples"] == 2
    assert any("mixed.jsonl:line 4: missing_file" in e for e in saved["examples"]["missing_file"])

    twice = DataStream(cfg.model_copy(update={"epochs": 2, "error_report": None}), make_processor(), base_dir=media_dir)
    list(twice)  # each read of a bad record counts (5 per epoch) and names it once among the examples
    assert twice.report()["skipped_total"] == 10 and twice.report()["samples_seen"] == 14
    assert all(len(shown) == 1 for shown in twice.report()["examples"].values())

    strict = DataStream(cfg.model_copy(update={"on_error": "raise"}), make_processor(), base_dir=media_dir)
    next(strict)
    with pytest.raises(SampleError, match=r"mixed.jsonl:line 2: malformed_json"):
        next(strict)
    no_filter = DataStream(cfg.model_copy(update={"on_error": "skip", "filter_overlong": False}), make_processor(),
                           base_dir=media_dir)
    with pytest.raises(DataError, match=r"line 6: \d+ tokens > limit 200 \(set filter_overlong"):
        list(no_filter)


@pytest.mark.parametrize("mode", [
    {"packing": True, "packing_length": 160, "packing_strategy": "first_fit", "packing_open_bins": 3},
    {"packing": True, "packing_length": 160, "packing_strategy": "best_fit", "pad_to_packing_length": True},
    {"batch_size": 3, "group_by_length": True, "group_window": 9},
    {"packing": True, "packing_length": 160, "shuffle": True, "shuffle_buffer": 7, "shuffle_block": 4},
    {"batch_size": 3, "group_by_length": True, "group_window": 9, "shuffle": True, "shuffle_buffer": 20},
])
def test_resume_at_arbitrary_points_yields_the_same_stream(make_processor, tmp_path, mode):
    cfg = DataConfig(datasets=_dataset(tmp_path), seed=3, epochs=2, **mode)
    proc = make_processor()
    full = _drain(DataStream(cfg, proc, base_dir=tmp_path))
    seen = sorted(i for ids, _ in full for i in ids)
    assert len(seen) == 2 * 65 and len(set(seen)) == 65  # two epochs, every record once per epoch
    for stop in (1, 5, len(full) // 2, len(full) - 1):
        first = DataStream(cfg, proc, base_dir=tmp_path)
        head = [(_ids(b), b["input_ids"].tolist()) for b in (next(first) for _ in range(stop))]
        state = json.loads(json.dumps(first.state_dict()))  # plain data, survives JSON
        resumed = DataStream(cfg, proc, base_dir=tmp_path)
        resumed.load_state_dict(state)
        assert head + _drain(resumed) == full, f"stop={stop}"
    if cfg.packing:
        stats = DataStream(cfg, proc, base_dir=tmp_path)
        list(stats)
        packing = stats.report()["packing"]
        assert 0.5 < packing["efficiency"] <= 1.0
        assert packing["budget_tokens"] == 160 * packing["batches"]
        assert packing["fill"] == pytest.approx(packing["real_tokens"] / packing["budget_tokens"], abs=1e-6)
        if cfg.pad_to_packing_length:
            assert packing["computed_tokens"] == packing["budget_tokens"]
        assert all(len(ids) >= 1 for ids, _ in full)


def test_packed_rows_respect_the_budget_and_hold_whole_samples(make_processor, tmp_path):
    cfg = DataConfig(filter_overlong=True, datasets=_dataset(tmp_path), packing=True, packing_length=150)
    proc = make_processor()
    singles = {tuple(b["sample_ids"][0]): b["input_ids"].shape[1]
               for b in DataStream(cfg.model_copy(update={"packing": False}), proc, base_dir=tmp_path)}
    rows = list(DataStream(cfg, proc, base_dir=tmp_path))
    assert sorted(i for b in rows for i in _ids(b)) == sorted(singles)
    for b in rows:
        assert b["input_ids"].shape[1] == sum(singles[i] for i in _ids(b)) <= 150
        assert b["cu_seqlens"][-1] == b["input_ids"].shape[1]


def test_shards_cover_every_record_once(make_processor, tmp_path):
    cfg = DataConfig(datasets=_dataset(tmp_path), batch_size=2)
    proc = make_processor()
    everything = sorted(i for b in DataStream(cfg, proc, base_dir=tmp_path) for i in _ids(b))
    parts = [[i for b in DataStream(cfg, proc, base_dir=tmp_path, shard_id=k, num_shards=3) for i in _ids(b)]
             for k in range(3)]
    assert sorted(i for p in parts for i in p) == everything and len(everything) == 65
    assert all(abs(len(p) - 65 / 3) <= 1 for p in parts)


def test_resume_state_is_checked_against_the_shard(make_processor, tmp_path):
    cfg = DataConfig(datasets=_dataset(tmp_path))
    state = DataStream(cfg, make_processor(), base_dir=tmp_path, shard_id=1, num_shards=2).state_dict()
    with pytest.raises(DataError, match="shard 1/2"):
        DataStream(cfg, make_processor(), base_dir=tmp_path).load_state_dict(state)


@pytest.mark.parametrize("shuffle", [False, True])
def test_dataloader_workers_and_ranks_shard_and_resume_exactly(make_processor, tmp_path, shuffle):
    cfg = DataConfig(filter_overlong=True, datasets=_dataset(tmp_path, n_a=20, n_b=10), packing=True, packing_length=120,
                     packing_open_bins=2, shuffle=shuffle, shuffle_buffer=8, shuffle_block=3)
    proc = make_processor()

    def run(rank, stop=None, state=None):
        loader = ResumableLoader(StreamingDataset(cfg, proc, base_dir=tmp_path, rank=rank, world_size=2),
                                 num_workers=2)
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for batch in loader:
            out.append(_ids(batch))
            if stop is not None and len(out) == stop:
                break
        return out, loader

    ranks = [run(r)[0] for r in (0, 1)]
    ids = [i for rank in ranks for b in rank for i in b]
    assert len(ids) == len(set(ids)) == 30
    full = ranks[0]
    head, loader = run(0, stop=3)
    state = json.loads(json.dumps(loader.state_dict()))
    tail, resumed = run(0, state=state)
    assert head + tail == full
    assert resumed.report()["packing"]["samples"] > 0


def test_build_processor_merges_checkpoint_settings_and_config_keys(tokenizer, tmp_path):
    from vlforge.data import build_processor
    from vlforge.models.tiny import build_processor as build_hf_processor

    hf = build_hf_processor("qwen3_vl", tokenizer)
    cfg = DataConfig(datasets=[], fps=1, video_max_pixels=224 * 224, video_max_frames=32, max_pixels=128 * 128)
    proc = build_processor(cfg, tokenizer, "qwen3_vl", image_processor=hf.image_processor)
    s = proc.settings
    assert (s.patch_size, s.fps, s.video_max_frames, s.max_pixels) == (16, 1.0, 32, 128 * 128)
    assert s.video_max_pixels == 224 * 224 and s.video_min_pixels <= s.video_max_pixels  # floor lowered
    assert hf.image_processor.size["shortest_edge"] > 128 * 128 and s.min_pixels == 32 * 32  # floor lowered too


def test_config_allow_path_escape_reaches_media_resolution(make_processor, tmp_path):
    from datakit import write_image

    inner = tmp_path / "inner"
    inner.mkdir()
    write_image(tmp_path / "outside.png")
    write_jsonl(inner / "d.jsonl", [chat([{"type": "image", "image": "../outside.png"}])])
    strict = DataConfig(datasets=[{"path": "inner/d.jsonl"}], on_error="skip")
    stream = DataStream(strict, make_processor(), base_dir=tmp_path)
    assert list(stream) == [] and stream.report()["skipped"] == {"path_escape": 1}
    loose = strict.model_copy(update={"allow_path_escape": True})
    assert len(list(DataStream(loose, make_processor(), base_dir=tmp_path))) == 1


def test_parquet_with_embedded_image_bytes_and_struct_messages(make_processor, tmp_path, media_dir):
    """HF-datasets style parquet: content parts as structs (absent keys become nulls), image bytes inline."""
    import pickle

    import pyarrow as pa
    import pyarrow.parquet as pq

    png = (media_dir / "img2.png").read_bytes()
    rows = [{"messages": [
        {"role": "user", "content": [{"type": "image", "image": png}, {"type": "text", "text": f"Describe {i}."}]},
        {"role": "assistant", "content": [{"type": "text", "text": f"Noise {i}."}]}]} for i in range(6)]
    rows[3]["messages"][0]["content"][0]["image"] = None  # an image part without its image, and no images column
    table = pa.Table.from_pylist(rows)
    assert pa.types.is_struct(table.schema.field("messages").type.value_type.field("content").type.value_type)
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=2)
    cfg = DataConfig(filter_overlong=True, datasets=[{"path": "d.parquet"}], on_error="skip", packing=True, packing_length=70,
                     packing_open_bins=2)
    proc = make_processor()
    full = _drain(DataStream(cfg, proc, base_dir=tmp_path))
    stream = DataStream(cfg, proc, base_dir=tmp_path)
    batches = list(stream)
    assert stream.report()["skipped"] == {"placeholder_mismatch": 1}
    assert sum(int(b["image_grid_thw"].shape[0]) for b in batches) == 5
    assert sorted(loc for ids, _ in full for _, loc in ids) == ["row 1", "row 2", "row 3", "row 5", "row 6"]
    assert len(full) >= 3
    first = DataStream(cfg, proc, base_dir=tmp_path)
    head = [(_ids(b), b["input_ids"].tolist()) for b in [next(first)]]
    state = pickle.loads(pickle.dumps(first.state_dict()))  # records hold bytes: pickle, not JSON
    resumed = DataStream(cfg, proc, base_dir=tmp_path)
    resumed.load_state_dict(state)
    assert head + _drain(resumed) == full


def test_resume_anywhere_property(make_processor, tmp_path):
    """Random packing configurations and stop points: head + resumed tail == the uninterrupted stream."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    write_jsonl(tmp_path / "a.jsonl", text_records(24))
    write_jsonl(tmp_path / "b.jsonl", [*text_records(12, start=500), "{bad"])
    proc = make_processor()

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(length=st.integers(60, 200), bins=st.integers(1, 5), strategy=st.sampled_from(["first_fit", "best_fit"]),
           packing=st.booleans(), seed=st.integers(0, 3), stop_frac=st.floats(0, 1),
           shuffle=st.booleans(), buffer=st.integers(1, 12), block=st.integers(1, 9))
    def check(length, bins, strategy, packing, seed, stop_frac, shuffle, buffer, block):
        cfg = DataConfig(filter_overlong=True, datasets=[{"path": "a.jsonl", "weight": 2}, {"path": "b.jsonl"}], on_error="skip",
                         seed=seed, packing=packing, packing_length=length, packing_strategy=strategy,
                         packing_open_bins=bins, max_length=length, batch_size=2, group_by_length=not packing,
                         group_window=5, shuffle=shuffle, shuffle_buffer=buffer, shuffle_block=block)
        full = _drain(DataStream(cfg, proc, base_dir=tmp_path))
        stop = int(stop_frac * len(full))
        first = DataStream(cfg, proc, base_dir=tmp_path)
        head = [(_ids(b), b["input_ids"].tolist()) for b in (next(first) for _ in range(stop))]
        resumed = DataStream(cfg, proc, base_dir=tmp_path)
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert head + _drain(resumed) == full
        assert resumed.report()["skipped"].get("malformed_json") == 1

    check()


def test_a_pass_with_no_usable_sample_stops_instead_of_reading_forever(make_processor, media_dir):
    """Every record filtered (or skipped): an endless stream (``max_steps`` training) must not spin on it."""
    write_jsonl(media_dir / "long.jsonl", [chat("long " * 300), chat("longer " * 400), "{broken json"])
    cfg = DataConfig(filter_overlong=True, datasets=[{"path": "long.jsonl"}], on_error="skip", max_length=50, epochs=None)
    stream = DataStream(cfg, make_processor(), base_dir=media_dir)
    finite = DataStream(cfg.model_copy(update={"epochs": 2}), make_processor(), base_dir=media_dir)
    assert list(finite) == [] and finite.report()["skipped_total"] == 6  # a finite stream just ends, counted
    with pytest.raises(DataError, match=r"long\.jsonl.*no usable sample.*3 record\(s\).*malformed_json=1, overlong=2"):
        next(stream)


def test_a_shard_left_without_records_says_so(make_processor, media_dir):
    write_jsonl(media_dir / "one.jsonl", [chat("only one")])
    cfg = DataConfig(datasets=[{"path": "one.jsonl"}], epochs=None)
    assert next(DataStream(cfg, make_processor(), base_dir=media_dir, shard_id=0, num_shards=2))["input_ids"].numel()
    with pytest.raises(DataError, match=r"shard 1 of 2.*no usable sample"):
        next(DataStream(cfg, make_processor(), base_dir=media_dir, shard_id=1, num_shards=2))


@pytest.mark.parametrize("mode", [
    {"packing": True, "packing_length": 4000},  # one epoch's records fit one row: a row per epoch
    {"packing": True, "packing_length": 160, "shuffle": True, "shuffle_buffer": 7, "shuffle_block": 4},
    {"batch_size": 4, "group_by_length": True, "group_window": 12},
])
def test_no_row_or_length_window_holds_two_epochs(make_processor, tmp_path, mode):
    """N records x E epochs give E passes: each batch's samples come from one epoch, each epoch holds every record
    once, and a resume inside the second epoch continues exactly (as LMMS Engine and HF Trainer count epochs)."""
    cfg = DataConfig(datasets=_dataset(tmp_path, n_a=10, n_b=6), seed=3, epochs=3, **mode)
    proc = make_processor()
    batches = _drain(DataStream(cfg, proc, base_dir=tmp_path))
    passes, current, ends = [], [], []
    for ids, _ in batches:
        current.extend(ids)
        if len(current) >= 16:  # a pass is complete: it must end on a batch boundary and hold every record once
            passes.append(current)
            ends.append(len(passes[-1]))
            current = []
    assert current == [] and ends == [16, 16, 16], ends
    assert all(sorted(p) == sorted(passes[0]) for p in passes) and len(set(passes[0])) == 16
    if mode.get("packing_length") == 4000:
        assert len(batches) == 3  # the guide's case: 3 epochs of a small set are 3 rows, not one
    sizes = [len(ids) for ids, _ in batches]
    middle = next(i for i in range(len(sizes)) if sum(sizes[:i]) > 16)  # a resume point inside the second epoch
    first = DataStream(cfg, proc, base_dir=tmp_path)
    head = [(_ids(b), b["input_ids"].tolist()) for b in (next(first) for _ in range(middle))]
    resumed = DataStream(cfg, proc, base_dir=tmp_path)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert head + _drain(resumed) == batches
