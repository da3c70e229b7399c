"""Sources (json/jsonl/parquet/arrow), dataset YAML, mixture weights/max_samples and read-position resume."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datakit import text_records, write_jsonl
from pydantic import ValidationError

from vlforge.data import DataConfig, Mixture, load_config, open_source, read_dataset_yaml, resolve_entries
from vlforge.data.estimate import record_counts
from vlforge.data.mixture import shares
from vlforge.errors import ConfigError, DataError
from vlforge.strict import error_line


def _keys(source) -> list[str]:
    out = []
    while (rec := source.next_record()) is not None:
        if rec.record is None:
            out.append(rec.error.reason)
            continue
        messages = rec.record["messages"]
        messages = json.loads(messages) if isinstance(messages, str) else messages
        out.append(messages[0]["content"])
    return out


def _write_all_formats(tmp_path: Path, records: list[dict]) -> dict[str, Path]:
    paths = {"jsonl": write_jsonl(tmp_path / "d.jsonl", records)}
    paths["json"] = tmp_path / "d.json"
    paths["json"].write_text(json.dumps(records))
    table = pa.Table.from_pylist([{"messages": json.dumps(r["messages"])} for r in records])
    paths["parquet"] = tmp_path / "d.parquet"
    pq.write_table(table, paths["parquet"], row_group_size=7)
    paths["arrow"] = tmp_path / "d.arrow"
    with pa.ipc.new_file(str(paths["arrow"]), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=5):
            writer.write_batch(batch)
    paths["arrow_stream"] = tmp_path / "s.arrow"
    with pa.ipc.new_stream(str(paths["arrow_stream"]), table.schema) as writer:
        writer.write_table(table, max_chunksize=4)
    return paths


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "arrow", "arrow_stream"])
def test_every_format_reads_all_records_and_resumes_at_any_point(tmp_path, kind):
    records = text_records(23)
    path = _write_all_formats(tmp_path, records)[kind]
    got = _keys(open_source(path))
    assert got == [r["messages"][0]["content"] for r in records]
    for stop in (0, 1, 6, 7, 14, 22, 23):
        first = open_source(path)
        head = [first.next_record() for _ in range(stop)]
        state = json.loads(json.dumps(first.state_dict()))
        resumed = open_source(path)
        resumed.load_state_dict(state)
        tail = _keys(resumed)
        assert len(head) + len(tail) == 23
        assert tail == got[stop:]


def test_a_jsonl_resume_position_that_no_longer_starts_a_line_is_refused(tmp_path):
    """A same-size edit in the middle of a file (which the checkpoint's edge digests do not see) moves the lines:
    resuming at the saved byte offset would read half a line as a malformed record."""
    from vlforge.errors import DataError

    path = tmp_path / "d.jsonl"
    lines = [json.dumps(r) for r in text_records(6)]
    path.write_text("".join(line + "\n" for line in lines))
    first = open_source(path)
    [first.next_record() for _ in range(3)]
    state = first.state_dict()
    at_end = open_source(path)
    while at_end.next_record() is not None:
        pass
    open_source(path).load_state_dict(at_end.state_dict())  # the end of the file is a valid position
    text, offset = path.read_text(), state["offset"]
    assert text[offset - 1] == "\n"
    path.write_text(text[:offset - 2] + "\n" + text[offset - 2] + text[offset:])  # the same size, a newline moved
    with pytest.raises(DataError, match=r"d\.jsonl: the resume position \(byte [\d,]+, after line 3\) is not at the "
                                        r"start of a line: the file changed since the checkpoint"):
        open_source(path).load_state_dict(state)
    path.write_text(lines[0] + "\n")
    with pytest.raises(DataError, match=r"is past its end"):
        open_source(path).load_state_dict(state)


def test_locations_name_line_and_row(tmp_path):
    paths = _write_all_formats(tmp_path, text_records(3))
    assert [open_source(paths["jsonl"]).next_record().location] == ["line 1"]
    src = open_source(paths["parquet"])
    src.next_record()
    assert src.next_record().location == "row 2"
    assert open_source(paths["json"]).next_record().location == "item 1"


def test_malformed_json_line_and_non_object_are_per_record_errors(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [text_records(1)[0], "{not json", "[1, 2]", "", text_records(1)[0]])
    src = open_source(path)
    recs = list(iter(src.next_record, None))
    assert [r.location for r in recs] == ["line 1", "line 2", "line 3", "line 5"]  # blank line 4 skipped
    assert recs[1].error.reason == "malformed_json" and "bad.jsonl:line 2" in str(recs[1].error)
    assert recs[2].error.reason == "schema"
    assert recs[3].record is not None


def test_file_level_errors_are_one_line_data_errors(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: dataset file not found"):
        open_source(tmp_path / "nope.jsonl")
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(DataError, match="cannot tell the format from its suffix"):
        open_source(tmp_path / "x.txt")
    (tmp_path / "broken.json").write_text("[{")
    with pytest.raises(DataError, match=r"broken\.json: invalid JSON file"):
        open_source(tmp_path / "broken.json").next_record()
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"broken\.parquet: cannot read parquet"):
        open_source(tmp_path / "broken.parquet").next_record()


def test_a_json_file_is_read_as_what_it_holds(tmp_path):
    """JSON Lines named .json (LLaVA-style dumps, what `datasets`' json loader reads either way), one array
    named .jsonl, .ndjson; a pretty-printed array or object stays json; a compressed file is named as such."""
    records = text_records(3)
    lines = "\n".join(json.dumps(r) for r in records) + "\n"
    cases = {"lines.json": lines, "array.jsonl": json.dumps(records), "lines.ndjson": lines,
             "pretty.jsonl": json.dumps(records, indent=2), "bom.json": "\ufeff" + lines}
    for name, text in cases.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        [entry] = resolve_entries(DataConfig(datasets=[{"path": name}]), base_dir=tmp_path)
        source = open_source(entry.path, entry.data_type)
        first = source.next_record()
        assert first.location == ("line 1" if "lines" in name or name == "bom.json" else "item 1"), name
        source.reset()
        assert len(_keys(source)) == 3, name
    (tmp_path / "single.json").write_text(json.dumps(records[0]) + "\n")  # one record: `datasets` reads one row
    assert len(_keys(open_source(tmp_path / "single.json"))) == 1
    (tmp_path / "object.json").write_text(json.dumps({"data": records}, indent=2))
    assert len(_keys(open_source(tmp_path / "object.json"))) == 3
    (tmp_path / "one.json").write_text(json.dumps({"data": records}) + "\n")
    assert len(_keys(open_source(tmp_path / "one.json"))) == 3
    with pytest.raises(DataError, match=r"train\.jsonl\.gz: \.gz files are not read: decompress it first"):
        open_source(tmp_path / "train.jsonl.gz")
    with pytest.raises(ValidationError, match=r"\.gz files are not read"):
        DataConfig(datasets=[{"path": "train.jsonl.gz"}])


def test_a_directory_or_pattern_of_shards_is_its_files(tmp_path):
    """How `huggingface-cli download` and `save_to_disk` leave a set: data/train-0000N-of-0000M.parquet shards
    (beside a test split), or data-*.arrow with dataset_info.json. One entry reads them all, sharing its weight and
    max_samples; a directory holding two splits asks for a pattern."""
    data = tmp_path / "repo" / "data"
    data.mkdir(parents=True)
    for name, rows in (("train-00000-of-00002.parquet", 3), ("train-00001-of-00002.parquet", 2),
                       ("test-00000-of-00001.parquet", 1)):
        pq.write_table(pa.Table.from_pylist(text_records(rows)), data / name)
    (tmp_path / "repo" / "README.md").write_text("# card")
    [one, two] = resolve_entries(DataConfig(datasets=[{"path": "repo/data/train-*.parquet", "weight": 2,
                                                        "max_samples": 3}]), base_dir=tmp_path)
    assert [e.path.name for e in (one, two)] == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    assert (one.weight, two.weight, one.max_samples, two.max_samples, one.shard_of, two.shard_of) == (2, 2, 3, 3, 0, 0)
    assert record_counts([one, two]) == [2, 1]  # max_samples 3 shared by records (3 and 2): 1.8 + 1.2
    assert one.data_folder == tmp_path / "repo" / "data" and one.data_type == "parquet"
    assert sum(len(_keys(open_source(e.path))) for e in (one, two)) == 5
    with pytest.raises(DataError, match=r"repo: holds the splits test, train: name one with a pattern, e\.g\. "
                                        r".*repo/\*\*/\*train\*\.parquet"):
        resolve_entries(DataConfig(datasets=[{"path": "repo"}]), base_dir=tmp_path)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "README.md").write_text("# card")  # no data file
    (mixed / "a.jsonl").write_text("{}\n")
    (mixed / "b.parquet").write_bytes((data / "test-00000-of-00001.parquet").read_bytes())
    with pytest.raises(DataError, match=r"mixed/\*: mixes jsonl, parquet files"):
        resolve_entries(DataConfig(datasets=[{"path": "mixed/*"}]), base_dir=tmp_path)
    assert [e.path.name for e in resolve_entries(DataConfig(datasets=[{"path": "mixed/*", "data_type": "jsonl"}]),
                                                  base_dir=tmp_path)] == ["a.jsonl"]
    with pytest.raises(DataError, match=r"valid-\*\.parquet: the pattern matches no file"):
        resolve_entries(DataConfig(datasets=[{"path": "repo/data/valid-*.parquet"}]), base_dir=tmp_path)
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "dataset_info.json").write_text("{}")
    (saved / "state.json").write_text("{}")
    with pa.OSFile(str(saved / "data-00000-of-00001.arrow"), "wb") as sink:
        table = pa.Table.from_pylist(text_records(2))
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    [arrow] = resolve_entries(DataConfig(datasets=[{"path": "saved"}]), base_dir=tmp_path)
    assert arrow.data_type == "arrow" and len(_keys(open_source(arrow.path, arrow.data_type))) == 2
    [star] = resolve_entries(DataConfig(datasets=[{"path": "saved/*"}]), base_dir=tmp_path)  # metadata skipped
    assert star.path == arrow.path
    for split in ("train", "test"):  # a save_to_disk DatasetDict: its splits are folders
        (saved / "dict" / split).mkdir(parents=True)
        (saved / "dict" / split / "data-00000-of-00001.arrow").write_bytes((saved / "data-00000-of-00001.arrow")
                                                                           .read_bytes())
    with pytest.raises(DataError, match="holds the splits test, train"):
        resolve_entries(DataConfig(datasets=[{"path": "saved/dict"}]), base_dir=tmp_path)
    odd = tmp_path / "runs[v2]"  # glob characters in the folder of a plain file, or in its name, are no pattern
    odd.mkdir()
    (odd / "data[1].jsonl").write_text("\n".join(json.dumps(r) for r in text_records(2)) + "\n")
    [plain] = resolve_entries(DataConfig(datasets=[{"path": "data[1].jsonl"}]), base_dir=odd)
    assert plain.path == odd / "data[1].jsonl" and plain.weight == 1.0
    [dotted] = resolve_entries(DataConfig(datasets=[{"path": str(odd)}]), base_dir=tmp_path)  # a folder, no suffix
    assert dotted.path == odd / "data[1].jsonl"

def test_dataset_yaml_entries_resolve_relative_to_the_yaml(tmp_path):
    sub = tmp_path / "sets"
    sub.mkdir()
    write_jsonl(sub / "a.jsonl", text_records(2))
    (tmp_path / "mix.yaml").write_text(
        "datasets:\n"
        "  - {path: sets/a.jsonl, data_folder: media, data_type: jsonl, weight: 3, max_samples: 1}\n"
        "  - {path: sets/a.jsonl, data_folder: ''}\n")
    entries = resolve_entries(DataConfig(datasets="mix.yaml"), base_dir=tmp_path)
    assert entries[0].path == (sub / "a.jsonl").resolve() and entries[0].data_folder == (tmp_path / "media").resolve()
    assert entries[1].data_folder == sub.resolve() and entries[1].data_type == "jsonl"
    assert (entries[0].weight, entries[0].max_samples) == (3.0, 1)
    (tmp_path / "bad.yaml").write_text("- {path: a.jsonl, wieght: 2}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: datasets\[0\].wieght"):
        read_dataset_yaml(tmp_path / "bad.yaml")
    with pytest.raises(ValidationError) as raised:
        DataConfig(datasets=[], packing_lenght=5)
    assert error_line(raised.value, DataConfig) == "packing_lenght: unknown key; did you mean 'packing_length'?"
    (tmp_path / "cfg.yaml").write_text("datasets: mix.yaml\npacking_lenght: 5\n")
    with pytest.raises(ConfigError, match=r"cfg.yaml: packing_lenght: unknown key; did you mean 'packing_length'\?"):
        load_config(tmp_path / "cfg.yaml")


def test_a_linked_data_file_keeps_the_name_and_folder_it_was_given_by(tmp_path):
    """The hub cache's layout: snapshots/REV/train.json -> ../../blobs/HASH. The data type comes from the name
    given and the default data_folder is the folder holding that name, not the blob's."""
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    (blobs / "9f86d081884c7d65").write_text(json.dumps(text_records(2)))
    (snapshot / "train.json").symlink_to(Path("../../blobs/9f86d081884c7d65"))
    [entry] = resolve_entries(DataConfig(datasets=[{"path": "snapshots/rev/train.json"}]), base_dir=tmp_path)
    assert (entry.path, entry.data_folder, entry.data_type) == (snapshot / "train.json", snapshot, "json")
    assert len(_keys(open_source(entry.path, entry.data_type))) == 2


def test_shards_of_unequal_size_read_as_one_file_would(tmp_path):
    """A folder of per-source files (LLaVA-style: coco.jsonl, ocr.jsonl, ...) of very different sizes, one empty:
    max_samples is met in full and split by records; the weight is split likewise, so that the small shard does not
    end early and the folder keeps its share against another entry."""
    shards = tmp_path / "sets"
    shards.mkdir()
    write_jsonl(shards / "big.jsonl", [{"messages": f"big{i}"} for i in range(300)])
    write_jsonl(shards / "small.jsonl", [{"messages": f"small{i}"} for i in range(40)])
    (shards / "empty.jsonl").write_text("\n")
    write_jsonl(tmp_path / "other.jsonl", [{"messages": f"other{i}"} for i in range(340)])
    entries = resolve_entries(DataConfig(datasets=[{"path": "sets", "max_samples": 200}, {"path": "other.jsonl"}]),
                              tmp_path)
    assert [(e.path.name, e.shard_of) for e in entries] == [("big.jsonl", 0), ("empty.jsonl", 0), ("small.jsonl", 0),
                                                            ("other.jsonl", None)]
    assert shares(entries, [300, 0, 40, 340].__getitem__) == [(176 / 200, 176), (0.0, 0), (24 / 200, 24), (1.0, None)]
    assert record_counts(entries) == [176, 0, 24, 340]  # 200 in all (an equal split gave 67 + 0 + 40 = 107)
    drawn = [r.record["messages"] for _, r in iter(Mixture(entries, seed=3).next, None)]
    assert len(drawn) == 540 and sum(k.startswith("big") for k in drawn) == 176
    assert sum(k.startswith("small") for k in drawn) == 24
    half = drawn[:270]  # while both entries are live, draws alternate about evenly; the small shard is not used up
    assert 0.4 < sum(k.startswith("other") for k in half) / len(half) < 0.6
    assert 5 < sum(k.startswith("small") for k in half) < 20
    whole = resolve_entries(DataConfig(datasets=[{"path": "sets/*.jsonl"}]), tmp_path)  # no max_samples: every record
    assert record_counts(whole) == [300, 0, 40] and len(list(iter(Mixture(whole, seed=0).next, None))) == 340
    sizes = [e.path.stat().st_size for e in whole]  # without max_samples JSON Lines are weighed by bytes, not scanned
    assert Mixture(whole, seed=0).weights == tuple(size / sum(sizes) for size in sizes)


def test_mixture_weights_max_samples_and_epochs(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"messages": f"a{i}"} for i in range(400)])
    write_jsonl(tmp_path / "b.jsonl", [{"messages": f"b{i}"} for i in range(400)])
    cfg = DataConfig(datasets=[{"path": "a.jsonl", "weight": 3}, {"path": "b.jsonl", "max_samples": 50}])
    mix = Mixture(resolve_entries(cfg, tmp_path), seed=1)
    drawn = [r.record["messages"] for _, r in iter(mix.next, None)]
    assert sorted(drawn) == sorted([f"a{i}" for i in range(400)] + [f"b{i}" for i in range(50)])
    first_200 = drawn[:200]
    share_a = sum(k.startswith("a") for k in first_200[:100]) / 100
    assert 0.6 < share_a < 0.9  # weight 3:1 while both are live
    two = Mixture(resolve_entries(cfg, tmp_path), seed=1, epochs=2)
    assert len(list(iter(two.next, None))) == 2 * 450


def test_mixture_resume_is_exact(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", text_records(30))
    write_jsonl(tmp_path / "b.jsonl", text_records(30, start=100))
    entries = resolve_entries(DataConfig(datasets=[{"path": "a.jsonl"}, {"path": "b.jsonl", "weight": 0.5}]),
                              tmp_path)
    full = [(i, r.location) for i, r in iter(Mixture(entries, seed=7, epochs=2).next, None)]
    assert len(full) == 120
    for stop in (1, 17, 59, 60, 61, 100):
        mix = Mixture(entries, seed=7, epochs=2)
        head = [(i, r.location) for i, r in (mix.next() for _ in range(stop))]
        state = json.loads(json.dumps(mix.state_dict()))
        resumed = Mixture(entries, seed=123, epochs=2)
        resumed.load_state_dict(state)
        assert head + [(i, r.location) for i, r in iter(resumed.next, None)] == full


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_jsonl_and_parquet_stream_with_flat_memory(tmp_path):
    line = json.dumps(text_records(1)[0] | {"pad": "x" * 400})
    path = tmp_path / "big.jsonl"
    with open(path, "w") as fh:
        for _ in range(100_000):
            fh.write(line + "\n")
    assert path.stat().st_size > 45_000_000
    before = _rss_kib()
    src = open_source(path)
    count = 0
    while src.next_record() is not None:
        count += 1
    grown = _rss_kib() - before
    assert count == 100_000
    assert grown < 20_000, f"RSS grew by {grown} KiB while streaming a {path.stat().st_size >> 20} MiB file"

    table = pa.Table.from_pylist([{"messages": line}] * 20_000)
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=2_000)
    del table
    before = _rss_kib()
    src = open_source(tmp_path / "big.parquet")
    n = 0
    while src.next_record() is not None:
        n += 1
    assert n == 20_000
    assert _rss_kib() - before < 30_000


def test_empty_inputs_are_errors_not_endless_loops(tmp_path):
    with pytest.raises(ConfigError, match="no dataset entries"):
        resolve_entries(DataConfig(datasets=[]), tmp_path)
    (tmp_path / "empty.jsonl").write_text("\n")
    mix = Mixture(resolve_entries(DataConfig(datasets=[{"path": "empty.jsonl"}]), tmp_path), epochs=None)
    with pytest.raises(DataError, match="hold no records"):
        mix.next()


@pytest.mark.parametrize("name", ["d.json", "d.jsonl"])
def test_a_byte_order_mark_at_the_start_is_read_past(tmp_path, name):
    """Windows editors start UTF-8 files with a BOM; both the array's prefix read and the whole parse skip it."""
    records = text_records(3)
    body = json.dumps(records) if name.endswith(".json") else "\n".join(json.dumps(r) for r in records)
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    assert _keys(open_source(path)) == [r["messages"][0]["content"] for r in records]
    assert [raw.location for raw in open_source(path).head(2)] == (["item 1", "item 2"] if name.endswith(".json")
                                                                   else ["line 1", "line 2"])
