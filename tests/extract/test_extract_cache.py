"""Cache contents, errors, manifest checks and reading back, on a real tiny Qwen3-VL and real files."""

from __future__ import annotations

import json
import re

import pytest
import torch
from extractkit import cache_files, image_record, text_record, write_config, write_images, write_jsonl

from vlforge.errors import DataError
from vlforge.extract import CacheError, open_cache, run_extract


@pytest.fixture(scope="module")
def loaded(qwen3_ckpt):
    from vlforge.models import load

    return load(str(qwen3_ckpt))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, qwen3_ckpt, loaded):
    """4 good image samples (one with an id), a text-only one, a corrupt PNG, a missing file, a bad JSON line."""
    folder = tmp_path_factory.mktemp("extract-mixed")
    names = write_images(folder, 4)
    (folder / "images" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    records = [image_record(names[0]), image_record(names[1], id="custom-7"), image_record("images/broken.png"),
               text_record("Two plus two?", "Four."), '{"messages": [oops', image_record(names[2]),
               image_record("images/nowhere.png"), image_record(names[3])]
    write_jsonl(folder / "mixed.jsonl", records)
    data = write_config(folder, "mixed.jsonl")
    out = folder / "cache"
    summary = run_extract(model=str(qwen3_ckpt), data=str(data), out=out, batch_size=2, shard_size=3, loaded=loaded,
                          features=["vision_tokens", "vision_pooled", "hidden_mean", "hidden_last"], layers=[0, -1],
                          max_skip_fraction=0.5)  # 3 of 8 skipped on purpose
    return data, out, summary


def test_bad_samples_go_to_errors_jsonl_and_are_counted(mixed):
    data, out, summary = mixed
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [(e["sample_id"], e["reason"]) for e in errors] == [
        ("mixed:3", "corrupt_image"), ("mixed:5", "malformed_json"), ("mixed:7", "missing_file")]
    assert all(e["message"].startswith(f"{data.with_suffix('.jsonl')}:line {e['sample_id'].split(':')[1]}: ") for e in errors)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["skipped"] == {"corrupt_image": 1, "malformed_json": 1, "missing_file": 1}
    assert (manifest["num_rows"], manifest["num_skipped"]) == (5, 3)
    assert summary.skipped == manifest["skipped"] and summary.rows_written == 5
    assert [s["sample_ids"] for s in manifest["shards"]] == [["mixed:1", "custom-7"], ["mixed:4", "mixed:6"],
                                                              ["mixed:8"]]


def test_open_cache_by_id_and_index_matches_a_direct_forward(mixed, loaded):
    data, out, _ = mixed
    cache = open_cache(out, verify=True)
    assert len(cache) == 5 and cache.ids == ["mixed:1", "custom-7", "mixed:4", "mixed:6", "mixed:8"]
    by_id, by_index = cache["custom-7"], cache[1]
    assert by_id["index"] == 1 and by_id["sample_id"] == "custom-7"
    for key in ("vision_tokens", "vision_pooled", "hidden_mean", "hidden_last", "vision_items"):
        assert torch.equal(by_id[key], by_index[key])
    text_only = cache["mixed:4"]
    assert text_only["vision_tokens"].shape == (0, 64) and text_only["vision_items"].shape == (0, 2)

    # the same sample through the data pipeline and the model on its own
    from vlforge.data import build_processor, load_config, parse_conversation

    proc = build_processor(load_config(data), loaded.tokenizer, "qwen3_vl",
                           image_processor=loaded.processor.image_processor)
    record = json.loads(data.with_suffix(".jsonl").read_text().splitlines()[1])
    sample = proc.process(parse_conversation(record, "mixed.jsonl", "line 2"), data.parent)
    assert sample.image_grid_thw.tolist() == [[1, 4, 4]]
    inner = loaded.model.model
    with torch.no_grad():
        vision = inner.get_image_features(sample.pixel_values, sample.image_grid_thw).pooler_output[0]
        hidden = inner(input_ids=sample.input_ids[None], position_ids=sample.position_ids[:, None],
                       pixel_values=sample.pixel_values, image_grid_thw=sample.image_grid_thw,
                       output_hidden_states=True, use_cache=False).hidden_states
    assert by_id["vision_items"].tolist() == [[1, vision.shape[0]]]
    torch.testing.assert_close(by_id["vision_tokens"], vision, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(by_id["vision_pooled"][0], vision.mean(0), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(by_id["hidden_mean"], torch.stack([hidden[0][0].mean(0), hidden[-1][0].mean(0)]),
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(by_id["hidden_last"], torch.stack([hidden[0][0, -1], hidden[-1][0, -1]]),
                               atol=1e-4, rtol=1e-4)

    batches = list(cache.iter_batches(2))
    assert [b["sample_ids"] for b in batches] == [["mixed:1", "custom-7"], ["mixed:4", "mixed:6"], ["mixed:8"]]
    assert batches[0]["hidden_mean"].shape == (2, 2, 64) and isinstance(batches[0]["vision_tokens"], list)
    assert torch.equal(batches[1]["hidden_last"][1], cache["mixed:6"]["hidden_last"])
    with pytest.raises(KeyError, match="nope"):
        cache["nope"]


def test_rerun_reuses_shards_and_keeps_bytes(mixed, qwen3_ckpt, loaded):
    data, out, _ = mixed
    before = {p.name: p.read_bytes() for p in [out / "manifest.json", out / "errors.jsonl", *out.glob("shards/*")]}
    summary = run_extract(model=str(qwen3_ckpt), data=str(data), out=out, batch_size=2, shard_size=3, loaded=loaded,
                          features=["vision_tokens", "vision_pooled", "hidden_mean", "hidden_last"], layers=[0, -1],
                          max_skip_fraction=0.5)  # 3 of 8 skipped on purpose
    assert (summary.shards_written, summary.shards_reused, summary.shards_total) == (0, 3, 3)
    after = {p.name: p.read_bytes() for p in [out / "manifest.json", out / "errors.jsonl", *out.glob("shards/*")]}
    assert after == before


def test_other_options_are_refused_unless_overwrite(tmp_path, qwen3_ckpt, image_dataset, loaded):
    out = tmp_path / "cache"
    common = {"model": str(qwen3_ckpt), "data": str(image_dataset), "out": out, "features": ["hidden_last"],
              "loaded": loaded}
    run_extract(**common, batch_size=8, shard_size=16)
    with pytest.raises(CacheError) as err:
        run_extract(**common, batch_size=4, shard_size=16)
    message = str(err.value)
    assert "\n" not in message and "options.batch_size was 8, now 4" in message and "--overwrite" in message
    with pytest.raises(CacheError, match=r"model\.weights_sha256 was '[0-9a-f]+', now '[0-9a-f]+'; the cache's "
                                         r"model is '.+', this run's 'tiny:qwen3_vl@1'\)"):
        run_extract(**{**common, "model": "tiny:qwen3_vl@1", "loaded": None}, batch_size=8, shard_size=16)
    # options are compared before the model loads (this preset's weights are nowhere here)
    with pytest.raises(CacheError, match=r"other options \(options\.features was \['hidden_last'\], now "
                                         r"\['hidden_mean'\]\)"):
        run_extract(**{**common, "model": "real:qwen3_vl_2b", "loaded": None, "features": ["hidden_mean"]},
                    batch_size=8, shard_size=16)
    records = image_dataset.parent / "train.jsonl"  # one more record: the entry's first differing value, not the list
    changed = records.parent / "changed.jsonl"
    changed.write_text(records.read_text() + records.read_text().splitlines()[0] + "\n")
    with pytest.raises(CacheError) as err:
        run_extract(**{**common, "data": str(changed)}, batch_size=8, shard_size=16)
    assert re.search(r"\(data\.entries\[0\]\.file was 'train\.jsonl', now 'changed\.jsonl'\)", str(err.value)), \
        err.value
    summary = run_extract(**common, batch_size=4, shard_size=16, overwrite=True)
    assert summary.shards_written == 2 and summary.complete
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["batch_size"] == 4 and manifest["num_rows"] == 17
    assert manifest["options"]["dtype"] == "float32"
    summary = run_extract(**common, batch_size=4, shard_size=16, dtype="fp32")  # an alias is the same cache
    assert (summary.shards_written, summary.shards_reused) == (0, 2)


def test_a_cache_made_with_a_dtype_alias_keeps_its_spelling(tmp_path):
    """Caches written before dtypes were canonical hold the alias they were given, inside their fingerprint."""
    from vlforge.extract.manifest import MANIFEST, as_cached

    (tmp_path / MANIFEST).write_text(json.dumps({"options": {"dtype": "bf16", "batch_size": 8}}))
    assert as_cached(tmp_path, {"dtype": "bfloat16", "batch_size": 8}) == {"dtype": "bf16", "batch_size": 8}
    assert as_cached(tmp_path, {"dtype": "float16", "batch_size": 8}) == {"dtype": "float16", "batch_size": 8}
    assert as_cached(tmp_path / "new", {"dtype": "bfloat16"}) == {"dtype": "bfloat16"}


def test_not_a_cache_directory_is_refused(tmp_path, qwen3_ckpt, image_dataset, loaded):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CacheError, match=r"no manifest\.json"):
        run_extract(model=str(qwen3_ckpt), data=str(image_dataset), out=tmp_path, overwrite=True, loaded=loaded)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_parquet_shards_read_back_like_safetensors(tmp_path, qwen3_ckpt, image_dataset, loaded):
    common = {"model": str(qwen3_ckpt), "data": str(image_dataset), "features": ["vision_pooled", "hidden_mean"],
              "batch_size": 4, "shard_size": 8, "loaded": loaded}
    run_extract(**common, out=tmp_path / "st")
    run_extract(**common, out=tmp_path / "pq", format="parquet")
    st, pq = open_cache(tmp_path / "st"), open_cache(tmp_path / "pq", verify=True)
    assert st.ids == pq.ids and len(pq) == 17
    assert sorted(p.suffix for p in (tmp_path / "pq" / "shards").glob("*.parquet")) == [".parquet"] * 3
    for i in (0, 9, 16):
        for key in ("vision_pooled", "hidden_mean", "vision_items"):
            assert torch.equal(st[i][key], pq[i][key]), (i, key)
    for name in ("st", "pq"):  # a shard cut after the run: one line naming it when read
        shard = sorted((tmp_path / name / "shards").glob("*.safetensors" if name == "st" else "*.parquet"))[0]
        shard.write_bytes(shard.read_bytes()[:100])
        with pytest.raises(CacheError, match=rf"{re.escape(str(shard))}: cannot be read \(.*the same vlforge extract "
                                             r"command recomputes a damaged one"):
            open_cache(tmp_path / name)[0]


def test_bad_options_are_one_line_errors(tmp_path, qwen3_ckpt, image_dataset, loaded):
    from vlforge.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown feature 'hidden_men'; did you mean 'hidden_mean'"):
        run_extract(model=str(qwen3_ckpt), data=str(image_dataset), out=tmp_path / "a", features=["hidden_men"])
    with pytest.raises(ConfigError, match="--layers 7: the model has 3 hidden states"):
        run_extract(model=str(qwen3_ckpt), data=str(image_dataset), out=tmp_path / "b", layers=[7],
                    features=["hidden_mean"], loaded=loaded)
    # Without a loaded model the indices are checked against config.json, before anything loads or is written.
    with pytest.raises(ConfigError, match="--layers -4: the model has 3 hidden states"):
        run_extract(model=str(qwen3_ckpt), data=str(image_dataset), out=tmp_path / "c", layers=[-4],
                    features=["hidden_mean"])
    assert not (tmp_path / "c").exists()
    with pytest.raises(ConfigError, match=r"dtype: unknown dtype 'auto'; use one of bf16, "):
        run_extract(model=str(qwen3_ckpt), data=str(image_dataset), out=tmp_path / "d", dtype="auto")
    with pytest.raises(ConfigError, match=r"layers: 1 picks the hidden states of hidden_mean and hidden_last: add "
                                          r"one to --features, or leave --layers out"):
        run_extract(model=str(qwen3_ckpt), data=str(image_dataset), out=tmp_path / "e", layers=[1],
                    features=["vision_pooled"])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match=r"empty\.jsonl: the datasets hold no records"):
        run_extract(model=str(qwen3_ckpt), data=str(empty), out=tmp_path / "f", loaded=loaded)


def test_a_duplicate_sample_id_names_both_records(tmp_path, qwen3_ckpt, loaded):
    data = write_jsonl(tmp_path / "dup.jsonl", [{**text_record(f"Question {i}?"), "id": name}
                                                for i, name in enumerate(["a", "b", "c", "a"])])
    with pytest.raises(CacheError) as err:
        run_extract(model=str(qwen3_ckpt), data=str(data), out=tmp_path / "cache", batch_size=2, shard_size=2,
                    features=["hidden_mean"], loaded=loaded)
    assert str(err.value) == (f"duplicate sample id 'a': {data}:line 1 and {data}:line 4; ids come from the 'id' field: "
                              "make them unique or pass --id-field ''")


def test_dataloader_workers_give_the_same_cache(mixed, qwen3_ckpt, loaded, tmp_path):
    data, out, _ = mixed
    workers = tmp_path / "workers"
    run_extract(model=str(qwen3_ckpt), data=str(data), out=workers, batch_size=2, shard_size=3, loaded=loaded,
                features=["vision_tokens", "vision_pooled", "hidden_mean", "hidden_last"], layers=[0, -1],
                num_workers=2, max_skip_fraction=0.5)
    assert cache_files(workers) == cache_files(out)


def test_on_error_raise_stops_at_the_first_bad_sample(mixed, qwen3_ckpt, loaded, tmp_path):
    from vlforge.errors import DataError

    data, _, _ = mixed
    with pytest.raises(DataError, match=r"mixed\.jsonl:line 3: corrupt_image: .*--on-error skip"):
        run_extract(model=str(qwen3_ckpt), data=str(data), out=tmp_path / "c", batch_size=2, shard_size=3,
                    loaded=loaded, features=["hidden_mean"], on_error="raise")
    assert not list((tmp_path / "c" / "shards").glob("*.json"))


def test_glm4v_video_and_image_items(tmp_path, tiny_checkpoint):
    """GLM-4V with an image and a video sample: item kinds and token counts, and a mixed batch equal to
    one-sample batches (the two share one placeholder token id)."""
    from pathlib import Path

    video = Path(__file__).resolve().parents[2] / "examples" / "data" / "videos" / "moving_square.mp4"
    names = write_images(tmp_path, 1)
    clip = {"messages": [{"role": "user", "content": [{"type": "video", "video": str(video)},
                                                      {"type": "text", "text": "Where does it go?"}]},
                         {"role": "assistant", "content": "Right."}]}
    write_jsonl(tmp_path / "glm.jsonl", [image_record(names[0]), clip])
    data = write_config(tmp_path, "glm.jsonl", video_max_pixels=16384, allow_path_escape="true")
    from vlforge.models import load

    ckpt = tiny_checkpoint("glm4v")
    glm = load(str(ckpt))
    for batch_size in (2, 1):  # 2: image + video in one forward (shared placeholder id); 1: the stock path
        run_extract(model=str(ckpt), data=str(data), out=tmp_path / f"b{batch_size}", batch_size=batch_size,
                    features=["vision_tokens", "vision_pooled", "hidden_mean"], loaded=glm)
    cache, alone = open_cache(tmp_path / "b2"), open_cache(tmp_path / "b1")
    for i in range(2):
        torch.testing.assert_close(cache[i]["hidden_mean"], alone[i]["hidden_mean"], atol=1e-5, rtol=1e-4)
    image, clip_row = cache["glm:1"], cache["glm:2"]
    assert image["vision_items"].tolist() == [[1, image["vision_tokens"].shape[0]]]
    kind, tokens = clip_row["vision_items"][0].tolist()
    assert kind == 2 and tokens == clip_row["vision_tokens"].shape[0] > 0
    torch.testing.assert_close(clip_row["vision_pooled"][0], clip_row["vision_tokens"].mean(0))
    assert image["hidden_mean"].shape == clip_row["hidden_mean"].shape == (1, 64)
