"""Shuffled streaming: every source type and mixtures, per-epoch block order, the buffer, resume and resharding."""

from __future__ import annotations

import itertools
import json
import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datakit import text_records, write_jsonl

from vlforge.data import DataConfig, DataStream
from vlforge.data.config import ResolvedEntry
from vlforge.data.mixture import Mixture
from vlforge.data.shuffle import ShuffleBuffer
from vlforge.data.sources import LineIndex, open_source
from vlforge.train.checkpoint import remap_data_state

N = 120


def _write(tmp_path, kind: str, records: list[dict], name: str = "d"):
    path = tmp_path / f"{name}.{kind}"
    if kind == "jsonl":
        write_jsonl(path, records)
    elif kind == "json":
        path.write_text(json.dumps(records))
    else:
        table = pa.Table.from_pylist(records)
        if kind == "parquet":
            pq.write_table(table, path, row_group_size=25)  # several row groups
        else:
            with pa.OSFile(str(path), "wb") as fh, pa.ipc.new_file(fh, table.schema) as writer:
                for batch in table.to_batches(max_chunksize=30):
                    writer.write_batch(batch)
    return path


def _order(mixture) -> list[int]:
    return [r.record["i"] for _, r in iter(mixture.next, None)]


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "arrow"])
def test_every_source_type_is_permuted_per_epoch_and_read_whole(tmp_path, kind):
    path = _write(tmp_path, kind, [{"i": i} for i in range(N)])
    entry = ResolvedEntry(path, tmp_path, kind, 1.0, None)

    def run(seed: int, buffer: int | None = 16) -> list[int]:
        mix = Mixture([entry], seed=seed, epochs=2, shuffle_block=8)
        return _order(ShuffleBuffer(mix, size=buffer, seed=seed) if buffer else mix)

    order = run(0)
    first, second = order[:N], order[N:]
    assert sorted(first) == list(range(N)) == sorted(second)  # the buffer drains at each epoch's end
    assert order == run(0)  # seeded
    assert order != run(1)
    blocks_only = run(0, buffer=None)
    assert sorted(blocks_only[:N]) == list(range(N)) == sorted(blocks_only[N:])  # no buffer: epochs do not mix
    assert blocks_only[:N] != blocks_only[N:]  # a new block order every epoch
    assert first != list(range(N)) and second != list(range(N))
    # far from file order: a record's position moves by more than the buffer on average
    moved = sum(abs(pos - i) for pos, i in enumerate(blocks_only[:N])) / N
    assert moved > 16


def test_an_endless_stream_of_a_tiny_file_shuffles_each_epoch_whole(tmp_path):
    path = _write(tmp_path, "jsonl", [{"i": i} for i in range(5)])
    mix = Mixture([ResolvedEntry(path, tmp_path, "jsonl", 1.0, None)], seed=0, epochs=None, shuffle_block=64)
    buffer = ShuffleBuffer(mix, size=1000, seed=0)
    epochs = [[buffer.next()[1].record["i"] for _ in range(5)] for _ in range(6)]
    assert all(sorted(e) == list(range(5)) for e in epochs)  # a 1000-record buffer does not read 200 epochs ahead
    assert len({tuple(e) for e in epochs}) > 1
    state = json.loads(json.dumps(buffer.state_dict()))
    again = ShuffleBuffer(Mixture([ResolvedEntry(path, tmp_path, "jsonl", 1.0, None)], seed=0, epochs=None,
                                  shuffle_block=64), size=1000, seed=0)
    again.load_state_dict(state)
    assert [again.next()[1].record["i"] for _ in range(12)] == [buffer.next()[1].record["i"] for _ in range(12)]


def test_parquet_blocks_stay_inside_their_row_group_until_it_is_read(tmp_path):
    path = _write(tmp_path, "parquet", [{"i": i} for i in range(N)])
    order = _order(Mixture([ResolvedEntry(path, tmp_path, "parquet", 1.0, None)], seed=5, shuffle_block=5))
    groups = [i // 25 for i in order]
    changes = sum(1 for a, b in itertools.pairwise(groups) if a != b)
    assert changes == 4  # five row groups, each read to its end before the next is opened


def test_mixture_weights_still_hold_with_shuffle(tmp_path):
    a = _write(tmp_path, "jsonl", [{"i": i} for i in range(400)], "a")
    b = _write(tmp_path, "parquet", [{"i": 1000 + i} for i in range(400)], "b")
    entries = [ResolvedEntry(a, tmp_path, "jsonl", 3.0, None), ResolvedEntry(b, tmp_path, "parquet", 1.0, None)]
    order = _order(ShuffleBuffer(Mixture(entries, seed=0, shuffle_block=16), size=50, seed=0))
    head = order[:200]
    share_a = sum(1 for i in head if i < 1000) / len(head)
    assert 0.65 < share_a < 0.85  # weight 3:1 while both have records
    assert sorted(order) == list(range(400)) + list(range(1000, 1400))


@pytest.mark.parametrize("chunk", [7, 64, 1 << 22])
def test_line_index_matches_a_plain_read(tmp_path, chunk):
    lines = [json.dumps({"i": i}) if i % 9 else ("" if i % 2 else " \t\r") for i in range(300)]
    for tail in ("", "\n", "\n\n", "\n  ", '\n {"i": 1}'):
        path = tmp_path / "x.jsonl"
        path.write_text("\n".join(lines) + tail)
        index = LineIndex.scan(path, stride=16, chunk=chunk)
        text = path.read_bytes()
        starts = [0] + [k + 1 for k, c in enumerate(text) if c == 10]
        physical = text.split(b"\n")
        if physical[-1] == b"":
            physical.pop()
        assert index.lines == len(physical)
        assert index.nonblank == sum(1 for line in physical if line.strip())
        assert index.starts.tolist() == [starts[k] for k in range(0, index.lines, 16)]
        src = open_source(path)
        assert src.records() == len(list(iter(src.next_record, None)))


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "arrow", "json"])
def test_stream_resume_with_shuffle_on_every_source_type(make_processor, tmp_path, kind):
    _write(tmp_path, kind, text_records(40), "t")
    cfg = DataConfig(datasets=[{"path": f"t.{kind}"}], seed=2, epochs=2, batch_size=2, shuffle=True,
                     shuffle_buffer=6, shuffle_block=3)
    proc = make_processor()
    full = [b["sample_ids"] for b in DataStream(cfg, proc, base_dir=tmp_path)]
    assert len(full) == 40
    plain = [b["sample_ids"] for b in DataStream(cfg.model_copy(update={"shuffle": False}), proc,
                                                   base_dir=tmp_path)]
    assert full != plain
    for stop in (1, 9, 20, 39):
        first = DataStream(cfg, proc, base_dir=tmp_path)
        head = [next(first)["sample_ids"] for _ in range(stop)]
        resumed = DataStream(cfg, proc, base_dir=tmp_path)
        resumed.load_state_dict(pickle.loads(pickle.dumps(first.state_dict())))
        assert head + [b["sample_ids"] for b in resumed] == full, f"stop={stop}"


@pytest.mark.parametrize(("old", "new"), [(1, 2), (2, 1), (2, 3)])
def test_resharded_resume_with_shuffle_uses_every_record_once(make_processor, tmp_path, old, new):
    write_jsonl(tmp_path / "t.jsonl", text_records(60))
    cfg = DataConfig(datasets=[{"path": "t.jsonl"}], seed=4, shuffle=True, shuffle_buffer=9, shuffle_block=4)
    proc = make_processor()
    heads, states = [], []
    for shard in range(old):
        stream = DataStream(cfg, proc, base_dir=tmp_path, shard_id=shard, num_shards=old)
        heads += [tuple(i) for _ in range(7 + 3 * shard) for i in next(stream)["sample_ids"]]
        states.append(json.loads(json.dumps(stream.state_dict())))
    tails = []
    for shard in range(new):
        stream = DataStream(cfg, proc, base_dir=tmp_path, shard_id=shard, num_shards=new)
        stream.load_state_dict(remap_data_state(states, shard, new))
        tails += [tuple(i) for b in stream for i in b["sample_ids"]]
    assert sorted(heads + tails) == sorted({tuple(i) for b in DataStream(cfg, proc, base_dir=tmp_path)
                                            for i in b["sample_ids"]})
    assert len(heads + tails) == 60


def test_resuming_with_shuffle_switched_is_one_clear_error(make_processor, tmp_path):
    from vlforge.errors import DataError

    write_jsonl(tmp_path / "t.jsonl", text_records(12))
    cfg = DataConfig(datasets=[{"path": "t.jsonl"}], shuffle=True)
    proc = make_processor()
    for saved, resumed in ((cfg, cfg.model_copy(update={"shuffle": False})),
                           (cfg.model_copy(update={"shuffle": False}), cfg)):
        stream = DataStream(saved, proc, base_dir=tmp_path)
        next(stream)
        with pytest.raises(DataError, match=r"resume with the same data\.shuffle"):
            DataStream(resumed, proc, base_dir=tmp_path).load_state_dict(stream.state_dict())
