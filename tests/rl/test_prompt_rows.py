"""Prompts as each engine builds them from its dataset rows (no model): TRL's text and VLM rows."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from vlforge.rl.probe import render_prompt
from vlforge.rl.prompts import read_prompts


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, format="PNG")
    return buffer.getvalue()


def test_trl_text_prompts_render_as_written_and_chat_prompts_through_the_template(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "User: 2+2?\nAssistant: <think>"}) + "\n"
                    + json.dumps({"prompt": [{"role": "user", "content": "2+2?"}]}) + "\n")
    text, chat = read_prompts(path, engine="trl")
    assert (text.templated, chat.templated) == (False, True)
    assert render_prompt(None, None, text, None, {}) == "User: 2+2?\nAssistant: <think>"
    [verl_text] = read_prompts(path, engine="easyr1", limit=1)
    assert verl_text.templated  # EasyR1 and verl wrap a text prompt in a user turn and render the template


def test_trl_vlm_rows_keep_their_image_column(tmp_path):
    """TRL's VLM datasets: chat prompts with image parts and an `image` (or `images`) column of image structs."""
    rows = [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}],
             "image": {"bytes": _png(), "path": None}, "solution": "red"},
            {"prompt": [{"role": "user", "content": "Colour?"}], "images": [{"bytes": _png(), "path": None}] * 2,
             "solution": "red"}]
    for i, row in enumerate(rows):
        pq.write_table(pa.Table.from_pylist([row]), tmp_path / f"vlm{i}.parquet")
    [first], [second] = (read_prompts(tmp_path / f"vlm{i}.parquet", engine="trl") for i in range(2))
    assert len(first.images) == 1 and [part["type"] for part in first.messages[0]["content"]] == ["image", "text"]
    assert len(second.images) == 2
    assert second.messages[0]["content"] == [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Colour?"}]


def test_verl_and_easyr1_image_rows_in_the_forms_their_datasets_hold(tmp_path):
    """verl's {"image": "file://..."} dicts (qwen-vl-utils' form) and EasyR1's data.image_dir; a row whose images
    have no <image> in the text is one line (verl's processor would stop on it)."""
    import pytest

    from vlforge.errors import DataError
    from vlforge.rl.probe import _images

    Image.new("RGB", (8, 8), "red").save(tmp_path / "red.png")
    rows = [{"prompt": [{"role": "user", "content": "<image>Colour?"}],
             "images": [{"image": f"file://{tmp_path / 'red.png'}"}]},
            {"prompt": [{"role": "user", "content": "<image>Colour?"}], "images": [{"bytes": _png(), "path": None}]}]
    path = tmp_path / "verl.jsonl"
    path.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows[:1]))
    [row] = read_prompts(path, engine="verl")
    assert [im.size for im in _images(row)] == [(8, 8)]
    easy = tmp_path / "easy.jsonl"
    easy.write_text(json.dumps({"prompt": "<image>Colour?", "images": ["red.png"]}) + "\n")
    [row] = read_prompts(easy, engine="easyr1", image_dir=tmp_path)
    assert row.images == [str(tmp_path / "red.png")] and [im.size for im in _images(row)] == [(8, 8)]
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"prompt": [{"role": "user", "content": "Colour?"}], "images": ["red.png"]}) + "\n")
    with pytest.raises(DataError, match=r"bare.jsonl: row 0: 1 image\(s\) but 0 <image> placeholder\(s\) in its "
                                        r"prompt \(verl puts each image at an <image> of the text\)"):
        read_prompts(bare, engine="verl")


def test_a_parquet_train_file_is_read_only_as_far_as_the_rows_asked_for(tmp_path):
    """verl's train files hold their images: the first rows come from the first record batches, not the whole file;
    a file that is not parquet is one line naming it."""
    import pytest

    from vlforge.errors import DataError

    path = tmp_path / "train.parquet"
    rows = [{"prompt": [{"role": "user", "content": f"{i}+1?"}], "reward_model": {"ground_truth": str(i + 1)}}
            for i in range(50)]
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=8)
    got = read_prompts(path, engine="verl", limit=11)
    assert [row.answer for row in got] == [str(i + 1) for i in range(11)]
    assert len(read_prompts(path, engine="verl")) == 50 and len(read_prompts(path, engine="verl", limit=80)) == 50
    last = pq.ParquetFile(path).metadata.row_group(6).column(0)  # the last row group's pages: damaged
    data = bytearray(path.read_bytes())
    start = last.data_page_offset
    data[start:start + last.total_compressed_size] = b"\xff" * last.total_compressed_size
    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(bytes(data))
    assert [row.answer for row in read_prompts(damaged, engine="verl", limit=11)] == [str(i + 1) for i in range(11)]
    with pytest.raises(DataError, match=r"damaged\.parquet: cannot read it as parquet"):
        read_prompts(damaged, engine="verl")  # the whole file is read only when every row is asked for
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match=r"bad\.parquet: cannot read it as parquet \("):
        read_prompts(tmp_path / "bad.parquet", engine="verl", limit=3)
