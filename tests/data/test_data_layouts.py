"""Record layouts: transformers' content parts, LLaVA / ShareGPT conversations, renamed keys and roles, media in
the file, per-file detection, placement of images without placeholders, and the errors of records that fit none."""

from __future__ import annotations

import base64
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from datakit import chat, write_jsonl
from pydantic import ValidationError

from vlforge.data import DataConfig, DataStream, SampleError, parse_conversation
from vlforge.data.config import DatasetEntry, read_dataset_yaml, resolve_entry
from vlforge.data.layouts import DETECT_RECORDS, detect, file_format
from vlforge.data.sources import _array_prefix, open_source
from vlforge.errors import ConfigError, DataError


def _process(proc, record, folder, fmt=None):
    return proc.process(parse_conversation(record, "set.jsonl", "line 1", fmt), folder)


def _parts(conv) -> list[tuple[str, list]]:
    return [(m.role, [p.text if hasattr(p, "text") else (p.kind, p.ref) for p in m.parts]) for m in conv.messages]


def _entry(tmp_path, path, **keys):
    return resolve_entry(DatasetEntry(path=str(path), **keys), tmp_path)


def test_transformers_content_parts_give_the_pixels_of_a_plain_path(make_processor, media_dir):
    proc = make_processor("qwen2_5_vl")
    png = (media_dir / "img1.png").read_bytes()
    payload = base64.b64encode(png).decode()
    native = _process(proc, chat([{"type": "image", "image": "img1.png"}, {"type": "text", "text": "?"}]), media_dir)
    variants = [{"type": "image", "url": "img1.png"}, {"type": "image", "path": "img1.png"},
                {"type": "image", "url": f"file://{media_dir / 'img1.png'}"},  # file:///abs
                {"type": "image", "path": "file://img1.png"},  # file://relative, as qwen-vl-utils reads it
                {"type": "image", "base64": payload}, {"type": "image", "base64": f"data:image/png;base64,{payload}"},
                {"type": "image", "url": f"data:image/png;base64,{payload}"}, {"type": "image_url", "url": "img1.png"},
                {"type": "image", "image": {"bytes": png, "path": "elsewhere.png"}},
                {"type": "image", "image": {"bytes": None, "path": "img1.png"}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": payload}},  # Anthropic
                {"type": "image", "source": {"type": "url", "url": "img1.png"}}]
    for variant in variants:
        sample = _process(proc, chat([variant, {"type": "text", "text": "?"}]), media_dir)
        assert torch.equal(sample.input_ids, native.input_ids) and torch.equal(sample.pixel_values,
                                                                               native.pixel_values), variant
    video = {"type": "video", "path": "clip.mp4", "fps": 2}
    assert _process(proc, chat([video]), media_dir).video_grid_thw.tolist() == \
        _process(proc, chat([{"type": "video", "video": "clip.mp4", "fps": 2}]), media_dir).video_grid_thw.tolist()


@pytest.mark.parametrize("part", [{"type": "image", "url": "https://example.org/cat.png"},
                                  {"type": "image", "source": {"type": "url", "url": "https://example.org/cat.png"}},
                                  {"type": "video", "url": "http://example.org/clip.mp4"},
                                  {"type": "image", "url": "HTTPS://example.org/cat.png"},
                                  {"type": "image", "image": "s3://bucket/cat.png"},
                                  {"type": "video", "path": "gs://bucket/clip.mp4"}])
def test_remote_urls_are_one_line_sample_errors(make_processor, media_dir, part):
    with pytest.raises(SampleError) as info:
        _process(make_processor(), chat([part]), media_dir)
    assert info.value.reason == "remote_url" and "\n" not in str(info.value)
    url = list(part.values())[-1]
    url = url["url"] if isinstance(url, dict) else url
    assert str(info.value).startswith(f"set.jsonl:line 1: remote_url: remote media {url!r}")
    assert "download it and give its local path" in str(info.value)


def test_llava_conversations_equal_the_messages_layout(make_processor, media_dir):
    proc = make_processor("qwen3_vl")
    native = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image", "image": "img0.png"}, {"type": "text", "text": "\nColour?"}]},
        {"role": "assistant", "content": "Noise."},
        {"role": "user", "content": "And now?"}, {"role": "assistant", "content": "Still noise."}]}
    llava = {"id": "7", "image": "img0.png", "conversations": [
        {"from": "system", "value": "Be brief."}, {"from": "human", "value": "<image>\nColour?"},
        {"from": "gpt", "value": "Noise."}, {"from": "user", "value": "And now?"},
        {"from": "model", "value": "Still noise."}]}
    expected = _process(proc, native, media_dir)
    for record in (llava, {**llava, "image": ["img0.png"]}, {**{k: v for k, v in llava.items() if k != "image"},
                                                            "images": "img0.png"}):
        sample = _process(proc, record, media_dir)
        assert torch.equal(sample.input_ids, expected.input_ids) and torch.equal(sample.labels, expected.labels)
        assert torch.equal(sample.pixel_values, expected.pixel_values)


def test_a_records_own_system_key_is_its_system_prompt_in_every_layout_of_turns():
    """LLaMA-Factory's sharegpt files and many chat dumps carry `"system"` beside the turns: it opens the chat
    (unless the turns have a system turn, which wins, as in LLaMA-Factory); it is never dropped."""
    turns = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Arr."}]}
    assert _parts(parse_conversation({**turns, "system": "You are a pirate."}, "f", "l"))[0] == \
        ("system", ["You are a pirate."])
    chat = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
    assert _parts(parse_conversation({**chat, "system": "Be brief."}, "f", "l"))[0] == ("system", ["Be brief."])
    own = {"messages": [{"role": "system", "content": "Own."}, *chat["messages"]], "system": "Other."}
    assert [p for p in _parts(parse_conversation(own, "f", "l")) if p[0] == "system"] == [("system", ["Own."])]
    with pytest.raises(SampleError, match="system prompt 'system' must be a string, got dict"):
        parse_conversation({**chat, "system": {"name": "x"}}, "f", "l")


def test_images_without_placeholders_go_to_the_start_of_the_first_user_turn():
    one = parse_conversation({"image": "a.png", "conversations": [
        {"from": "system", "value": "S"}, {"from": "human", "value": "What?"}, {"from": "gpt", "value": "A."}]}, "f", "l")
    assert _parts(one) == [("system", ["S"]), ("user", [("image", "a.png"), "What?"]), ("assistant", ["A."])]
    several = parse_conversation({"images": ["a.png", "b.png"], "videos": ["v.mp4"], "messages": [
        {"role": "user", "content": "Compare."}, {"role": "assistant", "content": "Same."},
        {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "Yes."}]}, "f", "l")
    assert _parts(several)[0] == ("user", [("image", "a.png"), ("image", "b.png"), ("video", "v.mp4"), "Compare."])
    # TRL / LMMS Engine parquet style: parts without a reference take the images column in order
    trl = parse_conversation({"images": [{"bytes": b"1", "path": None}, {"bytes": b"2", "path": None}], "messages": [
        {"role": "user", "content": [{"type": "image", "index": 0, "text": None}, {"type": "text", "text": "Hi"},
                                     {"type": "image_url", "image_url": None}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Two.", "index": None}]}]}, "f", "l")
    assert [ref for _, ref in _parts(trl)[0][1][::2]] == [{"bytes": b"1", "path": None}, {"bytes": b"2", "path": None}]


@pytest.mark.parametrize(("record", "reason", "detail"), [
    ({"images": ["a.png", "b.png"], "messages": [{"role": "user", "content": "<image> and?"},
                                                 {"role": "assistant", "content": "x"}]},
     "placeholder_mismatch", "1 <image> placeholder(s) in the text but 2 item(s) in 'images'"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}]}, {"role": "assistant", "content": "x"}]},
     "placeholder_mismatch", "1 image part(s) without a reference but 0 item(s) in 'images'"),
    ({"images": ["a.png", "b.png"], "messages": [
        {"role": "user", "content": [{"type": "image", "index": 1}, {"type": "image", "index": 0}]},
        {"role": "assistant", "content": "x"}]}, "schema", "image part 0 names image 1"),
    ({"image": "a.png", "conversations": [{"from": "system", "value": "S"}, {"from": "gpt", "value": "x"}]},
     "placeholder_mismatch", "no user turn to put them in"),
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "bot", "value": "x"}]},
     "schema", "message 1 has from 'bot'; expected one of user, human, assistant, gpt, model, system"),
    ({"conversations": [{"from": "human", "value": "Weather?"}, {"from": "function_call", "value": "{}"}]},
     "schema", "has from 'function_call'; expected one of user, human, assistant, gpt, model, system, developer "
     "(tool-call turns are not trained by vlforge)"),
    ({"conversations": [{"speaker": "human", "text": "hi"}]}, "schema", "neither a 'role'"),
    ({"conversations": [{"from": "human"}, {"from": "gpt", "value": "x"}]}, "schema", "message 0 has no 'value' key"),
    ({"audios": ["a.wav"], "messages": [{"role": "user", "content": "<audio>?"}, {"role": "assistant", "content": "x"}]},
     "schema", "'audios': audio is not supported"),
    ({"messages": "[{\"role\": \"user\""}, "malformed_json", "not valid JSON"),
    ({"id": 3, "image": "a.png"}, "schema", "record needs a non-empty 'messages' list of {role, content} turns, a "
     "'conversations' list of {from, value} turns (LLaVA / ShareGPT), a 'texts' list of {user, assistant} exchanges "
     "(The Cauldron), 'prompt' and 'completion' (TRL) or 'instruction' and 'output' keys (alpaca)"),
    ({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "loss": "no"}]}, "schema",
     "message 1 has loss 'no'; expected true, false or null"),
    ({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "loss": False}]},
     "no_labels", "no assistant message to train on"),
    ({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "weight": 1, "loss": False}]},
     "schema", "message 1 has weight 1 and loss False, which disagree"),
    ({"messages": [{"role": "user", "content": "<image>Find <ref-object>"}, {"role": "assistant", "content": "<bbox>"}],
      "images": ["a.png"], "objects": {"ref": ["sheep"], "bbox": [[1, 2, 3, 4]]}}, "schema",
     "ms-swift grounding record: vlforge does not fill <ref-object> / <bbox> from 'objects'"),
    ({"prompt": "Hi", "completion": [{"role": "user", "content": "x"}]}, "schema",
     "completion turn 0 has role 'user': a completion holds the assistant's reply"),
    ({"prompt": [{"role": "user", "content": "Hi"}], "completion": 3}, "schema",
     "'completion' must be a string or a non-empty list of turns (objects); expected 'prompt' and 'completion', each "
     "a string or a non-empty list of {role, content} turns (prompt_completion: prompt and completion as {role, "
     "content} turns or strings (detected from item 4))"),
    ({"prompt": [{"role": "user", "content": "<image>Q"}], "completion": "A", "images": ["a.png", "b.png"]},
     "placeholder_mismatch", "1 <image> placeholder(s) in the text but 2 item(s) in 'images'"),
    ({"instruction": "Q", "output": None}, "schema", "record has no 'output' text; expected a string 'output' (and "
     "'instruction' / 'input' strings) (alpaca: {instruction, input, output} records, earlier exchanges from history, system prompt "
     "from system (detected from item 4))"),
    ({"instruction": "Q", "input": 7, "output": "A"}, "schema", "record has an int as its 'input' text"),
    ({"instruction": "Q", "output": "A", "history": [["only a question"]]}, "schema",
     "'history' item 0 must be an [instruction, reply] pair of strings"),
    ({"instruction": "Q", "output": "A", "history": "[[\"q\", \"a\"]"}, "schema",
     "'history' must be a list of [instruction, reply] pairs, got str"),
    ({"instruction": "<image><image>Q", "output": "A", "images": ["a.png"]}, "placeholder_mismatch",
     "2 <image> placeholder(s) in the text but 1 item(s) in 'images'"),
    ({"texts": [{"user": "Q", "assistant": "A", "source": "ai2d"}, {"user": "Q2", "source": "ai2d"}]}, "schema",
     "exchange 1 has no 'assistant' text; expected a non-empty 'texts' list of {user, assistant} exchanges (pairs: texts of "
     "{user, assistant} (detected from item 4))"),
    ({"texts": [{"user": ["a part"], "assistant": "A"}]}, "schema", "exchange 0 has a list as its 'user' text"),
    ({"texts": [None, "a caption"]}, "schema", "'texts' must be a non-empty list of turns (objects), got a list "
     "whose item 0 is NoneType"),
])
def test_records_that_fit_no_layout_fail_in_one_line(record, reason, detail):
    with pytest.raises(SampleError) as info:
        parse_conversation(record, "d.json", "item 4")
    assert info.value.reason == reason and detail in str(info.value), str(info.value)
    assert str(info.value).startswith(f"d.json:item 4: {reason}: ") and "\n" not in str(info.value)


def test_media_under_a_key_vlforge_does_not_read_is_a_warning_per_file(tmp_path, caplog, monkeypatch):
    """A record without media whose images sit under another key (`image_path`, `img`, `video_file`, or `image` when
    the entry names `imgs`) trains on its text alone: one warning per file names the key. Metadata named like media
    (an id, a caption, a size, a remote link) is no media; media under the entry's column is read."""
    monkeypatch.setattr("vlforge.data.schema._STRAY_WARNED", set())
    turns = [{"from": "human", "value": "Colour?"}, {"from": "gpt", "value": "Red."}]
    with caplog.at_level(logging.WARNING, logger="vlforge.data.schema"):
        for extra in ({"image_id": 7}, {"image_caption": "a red square"}, {"image_size": [64, 48]}, {"image": None},
                      {"image_url": "http://x.org/a.jpg"}):
            assert not parse_conversation({**extra, "conversations": turns}, "meta.json", "item 1").media
        for n, extra in enumerate(({"image_path": "red.png"}, {"img": [{"bytes": b"\x89PNG", "path": None}]},
                                   {"video_file": "clip.MP4", "images": []})):
            assert not parse_conversation({**extra, "conversations": turns}, f"s{n}.json", "item 2").media
        named = resolve_entry(DatasetEntry(path="d.json", columns={"images": "imgs"}), tmp_path)
        other = {"image": "red.png", "conversations": turns}
        for location in ("item 3", "item 4"):  # once per file
            parse_conversation(other, "d.json", location, detect(other, named, "d.json", location))
    messages = [r.getMessage() for r in caplog.records]
    assert [m.split(":")[0] for m in messages] == ["s0.json", "s1.json", "s2.json", "d.json"], messages
    assert messages[0] == ("s0.json: records without media hold a file under 'image_path', a key vlforge does not "
                           "read (it reads images/image/videos/video; first: item 2): if those are their images or "
                           "videos, name the key with columns.images / columns.videos of the dataset entry, else they "
                           "train on their text alone")
    assert "under 'image', a key vlforge does not read (it reads imgs/videos/video; first: item 3)" in messages[3]
    entry = resolve_entry(DatasetEntry(path="d.json", columns={"images": "image_path"}), tmp_path)
    record = {"image_path": "red.png", "conversations": turns}
    conv = parse_conversation(record, "d.json", "item 1", detect(record, entry, "d.json", "item 1"))
    assert [p.ref for p in conv.media] == ["red.png"]


def test_a_reply_before_any_user_turn_is_context_with_a_warning(caplog, monkeypatch):
    """LLaVA drops a record's opening `gpt` turn and LLaMA-Factory skips the record: vlforge keeps it as context,
    untrained, and says so once per file; `weight: 0` says the same without a warning; TRL's prompt may be a system
    turn alone."""
    monkeypatch.setattr("vlforge.data.schema._OPENING_WARNED", set())
    record = {"system": "S", "conversations": [{"from": "gpt", "value": "Welcome!"}, {"from": "human", "value": "Hi"},
                                               {"from": "gpt", "value": "Hello."}]}
    with caplog.at_level(logging.WARNING, logger="vlforge.data.schema"):
        conv = parse_conversation(record, "llava.json", "item 3")
        parse_conversation(record, "llava.json", "item 4")
    assert [(m.role, m.trained) for m in conv.messages] == [("system", True), ("assistant", False), ("user", True),
                                                             ("assistant", True)]
    assert [r.getMessage() for r in caplog.records] == [
        "llava.json: replies before any user turn are kept as context, not trained (LLaVA drops them; first: item 3)"]
    with pytest.raises(SampleError, match="no_labels"):  # nothing else to learn from
        parse_conversation({"conversations": [{"from": "gpt", "value": "Welcome!"}]}, "llava.json", "item 5")
    quiet = {"messages": [{"role": "system", "content": "S"}, {"role": "assistant", "content": "Welcome!", "weight": 0},
                          {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
    assert [m.trained for m in parse_conversation(quiet, "d.jsonl", "line 1").messages] == [True, False, True, True]
    trl = parse_conversation({"prompt": [{"role": "system", "content": "Be brief."}], "completion": "Hello."},
                             "t.jsonl", "line 1")
    assert [(m.role, m.trained) for m in trl.messages] == [("system", True), ("assistant", True)]


def test_ms_swift_loss_false_keeps_a_reply_as_context():
    """ms-swift's per-message ``loss`` (docs Custom-dataset.md): false shows the reply without training it."""
    record = {"messages": [{"role": "user", "content": "<image>What is this"},
                           {"role": "assistant", "content": "This is a rabbit", "loss": False},
                           {"role": "user", "content": "Colour?"}, {"role": "assistant", "content": "Red.", "loss": True}],
              "images": ["/abs/red.png"]}
    conv = parse_conversation(record, "d.jsonl", "line 1")
    assert [(m.role, m.trained) for m in conv.messages] == [("user", True), ("assistant", False), ("user", True),
                                                             ("assistant", True)]


def test_pairs_with_one_placeholder_per_item_place_them_as_ms_swift_does(tmp_path):
    """ms-swift's sharegpt records (``conversation`` of ``{human, assistant}``): `<image>` in the text is where the
    image goes when the counts match; otherwise The Cauldron's rule (text, images first) holds."""
    entry = resolve_entry(DatasetEntry(path="d.jsonl", layout="pairs", columns={"messages": "conversation"},
                                       tags={"user_tag": "human", "assistant_tag": "assistant"}), tmp_path)
    record = {"system": "Be brief.", "conversation": [{"human": "Look: <image>Colour?", "assistant": "Red."},
                                                      {"human": "Sure?", "assistant": "Yes."}], "images": ["red.png"]}
    conv = parse_conversation(record, "d.jsonl", "line 1", detect(record, entry, "d.jsonl", "line 1"))
    assert _texts(conv)[:2] == [["Be brief."], ["Look: ", "[image]", "Colour?"]]
    cauldron = {"texts": [{"user": "Is <image> a tag?", "assistant": "Yes."}], "images": ["a.png", "b.png"]}
    assert _texts(parse_conversation(cauldron, "c.parquet", "row 1"))[0] == ["[image]", "[image]", "Is <image> a tag?"]
    both = {"images": ["a.png"], "texts": [{"user": "What tag is <image>?", "assistant": "It is <image>."}]}
    assert _texts(parse_conversation(both, "c.parquet", "row 2")) == [["What tag is ", "[image]", "?"],
                                                                      ["It is <image>."]]  # a reply's is text


def test_trl_prompt_completion_trains_the_completion_only():
    """TRL's prompt-completion records: a string or turns on either side; the prompt's replies are context."""
    conv = parse_conversation({"prompt": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q"}]},
                                          {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}],
                               "completion": [{"role": "assistant", "content": "A2"}], "images": ["a.png"]},
                              "d.jsonl", "line 1")
    assert [(m.role, m.trained) for m in conv.messages] == [("system", True), ("user", True), ("assistant", False),
                                                             ("user", True), ("assistant", True)]
    assert [p.ref for p in conv.media] == ["a.png"]
    plain = parse_conversation({"prompt": "What is 2+2?", "completion": "4"}, "d.jsonl", "line 2")
    assert [(m.role, m.parts[0].text, m.trained) for m in plain.messages] == [("user", "What is 2+2?", True),
                                                                              ("assistant", "4", True)]
    with pytest.raises(ValidationError, match="layout prompt_completion reads TRL's 'prompt' and 'completion'"):
        DatasetEntry(path="d.jsonl", layout="prompt_completion", columns={"messages": "chat"})


def test_validate_reads_a_trl_prompt_completion_parquet(tmp_path, media_dir):
    from typer.testing import CliRunner

    from vlforge.cli import app

    turn = pa.struct([("content", pa.string()), ("role", pa.string())])
    rows = [{"images": [(media_dir / "img0.png").read_bytes()], "prompt": [{"role": "user", "content": "What?"}],
             "completion": [{"role": "assistant", "content": "Noise."}]},
            {"images": [], "prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "user", "content": "x"}]}]
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("images", pa.list_(pa.binary())), ("prompt",
                   pa.list_(turn)), ("completion", pa.list_(turn))])), tmp_path / "pc.parquet")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "data": {"dataset_path": str(tmp_path / "pc.parquet"), "on_error": "skip", "max_skip_fraction": 0.6},
        "model": {"load_from_pretrained_path": "tiny:qwen3_vl"}, "training": {"max_steps": 1}}))
    done = CliRunner().invoke(app, ["validate", str(tmp_path / "run.yaml"), "--json"])
    report = json.loads(done.stdout)
    assert done.exit_code == 0, report
    assert report["datasets"][0]["layout"]["layout"] == "prompt_completion" and report["datasets"][0]["read"] == 2
    assert report["datasets"][0]["skipped"] == {"schema": 1}, report["datasets"]


def test_pairs_layout_named_with_renamed_keys(tmp_path):
    record = {"qa": [{"question": "What is it?", "answer": "A cat."}, {"question": "Colour?", "answer": "Grey."}],
              "pictures": ["c.png"], "sys": "Be brief."}
    entry = _entry(tmp_path, "d.json", layout="pairs", columns={"messages": "qa", "images": "pictures", "system": "sys"},
                   tags={"user_tag": "question", "assistant_tag": "answer"})
    fmt = detect(record, entry, "d.json", "item 1")
    assert fmt.describe() == "pairs: qa of {question, answer}; images from pictures, system prompt from sys (named in " \
                             "the dataset entry)"
    assert _parts(parse_conversation(record, "d.json", "item 1", fmt)) == [
        ("system", ["Be brief."]), ("user", [("image", "c.png"), "What is it?"]), ("assistant", ["A cat."]),
        ("user", ["Colour?"]), ("assistant", ["Grey."])]


def test_pairs_text_is_text_and_the_images_go_first(tmp_path):
    """As The Cauldron's readers (torchtune's TheCauldronToMessages) build the chat: ``<image>`` in an exchange is
    literal text; every image goes before the first question."""
    record = {"images": ["a.png", "b.png"], "texts": [{"user": "Is <image> a tag?", "assistant": "In HTML, <image> is."}]}
    assert _parts(parse_conversation(record, "d.json", "item 1")) == [
        ("user", [("image", "a.png"), ("image", "b.png"), "Is <image> a tag?"]), ("assistant", ["In HTML, <image> is."])]
    with pytest.raises(ValidationError, match=r"layout pairs: an exchange's keys are tags.user_tag and tags.assistant_tag"):
        _entry(tmp_path, "d.json", layout="pairs", tags={"role_tag": "q", "content_tag": "a"})


def test_alpaca_records_as_llama_factory_builds_their_chat(tmp_path):
    record = {"instruction": "Describe <image>.", "input": "In one word.", "output": "Noise.", "images": ["a.png"],
              "history": [["Hi", "Hello."]], "system": "Be brief."}
    assert _parts(parse_conversation(record, "d.json", "item 1")) == [
        ("system", ["Be brief."]), ("user", ["Hi"]), ("assistant", ["Hello."]),
        ("user", ["Describe ", ("image", "a.png"), ".\nIn one word."]), ("assistant", ["Noise."])]
    fmt = detect(record, None, "d.json", "item 1")  # as LLaMA-Factory: no instruction, or an empty history, is fine
    assert _parts(parse_conversation({"input": "Only input.", "output": "A.", "history": ""}, "d.json", "item 2",
                                     fmt)) == [("user", ["Only input."]), ("assistant", ["A."])]
    # a layout of turns wins where a record has both; alpaca keys in the entry read every record as alpaca
    both = {"instruction": "I", "output": "O", "messages": [{"role": "user", "content": "q"},
                                                           {"role": "assistant", "content": "a"}]}
    assert detect(both, None, "d.json", "item 1").layout == "messages"
    (tmp_path / "d.json").write_text(json.dumps([{"q": "Why?", "a": "Because."}]))
    entry = _entry(tmp_path, "d.json", columns={"prompt": "q", "response": "a"})
    fmt = detect({"q": "Why?", "a": "Because."}, entry, "d.json", "item 1")
    assert (fmt.layout, fmt.origin) == ("alpaca", "alpaca keys named in the dataset entry")
    assert file_format(entry).describe() == ("alpaca: {q, input, a} records, earlier exchanges from history, system "
                                             "prompt from system (alpaca keys named in the dataset entry)")
    (tmp_path / "none.jsonl").write_text("")
    assert file_format(_entry(tmp_path, "none.jsonl", layout="alpaca")).origin == "an empty file"
    for bad, key in (({"layout": "sharegpt", "columns": {"prompt": "q"}}, "columns.prompt"),
                     ({"layout": "alpaca", "columns": {"messages": "chat"}}, "columns.messages"),
                     ({"layout": "alpaca", "tags": {"user_tag": "human"}}, "tags.user_tag"),
                     ({"columns": {"history": "h"}, "tags": {"role_tag": "r", "content_tag": "c"}}, "tags.role_tag")):
        (tmp_path / "data.yaml").write_text(yaml.safe_dump([{"path": "d.json", **bad}]))
        with pytest.raises(ConfigError, match=rf"data.yaml: datasets\[0\]\.{key.replace('.', '[.]')}: layout"):
            read_dataset_yaml(tmp_path / "data.yaml")


def test_entry_renames_keys_and_roles_as_llama_factory_does(tmp_path):
    record = {"chat": [{"speaker": "asker", "text": "<image>Hi"}, {"speaker": "bot", "text": "Hello."},
                       {"speaker": "human", "text": "?"}], "pic": "a.png", "sys": "Be kind."}
    entry = _entry(tmp_path, "d.json", layout="sharegpt", columns={"messages": "chat", "images": "pic", "system": "sys"},
                   tags={"role_tag": "speaker", "content_tag": "text", "user_tag": "asker", "assistant_tag": "bot"})
    fmt = detect(record, entry, "d.json", "item 1")
    assert (fmt.layout, fmt.messages, fmt.images, fmt.origin) == ("sharegpt", "chat", ("pic",),
                                                                   "named in the dataset entry")
    conv = parse_conversation({**record, "chat": record["chat"][:2]}, "d.json", "item 1", fmt)
    assert _parts(conv) == [("system", ["Be kind."]), ("user", [("image", "a.png"), "Hi"]), ("assistant", ["Hello."])]
    with pytest.raises(SampleError, match="message 2 has speaker 'human'; expected one of asker, bot, system"):
        parse_conversation(record, "d.json", "item 2", fmt)  # a named role replaces the usual names


def test_layout_is_decided_per_file_from_its_first_chat_record(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", ["{broken", {"id": 1}, {"conversations": [
        {"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}, chat("q", "a")])
    fmt = file_format(_entry(tmp_path, "d.jsonl"))
    assert (fmt.layout, fmt.messages, fmt.origin) == ("sharegpt", "conversations", "detected from line 3")
    assert fmt.describe() == "sharegpt: conversations of {from, value} (detected from line 3)"
    with pytest.raises(SampleError, match=r"d.jsonl:line 4: schema: record needs a non-empty 'conversations' list of "
                                          r"\{from, value\} turns \(sharegpt: .* \(detected from line 3\)\)"):
        parse_conversation(chat("q", "a"), "d.jsonl", "line 4", fmt)
    write_jsonl(tmp_path / "m.jsonl", [chat("q", "a")])
    assert file_format(_entry(tmp_path, "m.jsonl", layout="messages")).describe() == \
        "messages: messages of {role, content} (layout named in the dataset entry, turns key from line 1)"
    named = file_format(_entry(tmp_path, "d.jsonl", layout="messages", columns={"messages": "messages"}))
    assert (named.layout, named.origin) == ("messages", "named in the dataset entry")
    write_jsonl(tmp_path / "none.jsonl", [{"text": f"plain {i}"} for i in range(DETECT_RECORDS + 5)])
    with pytest.raises(DataError, match=r"none.jsonl:line 1: no chat record in the first 100 record\(s\) of the file "
                                        r"\(first: schema: record needs"):
        file_format(_entry(tmp_path, "none.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    assert file_format(_entry(tmp_path, "empty.jsonl")).origin == "an empty file"


def test_detection_reads_only_the_start_of_a_json_array(tmp_path):
    items = [{"id": i, "conversations": [{"from": "human", "value": "x" * 5000}]} for i in range(400)]
    (tmp_path / "big.json").write_text(json.dumps(items))
    assert [item["id"] for item in _array_prefix(tmp_path / "big.json", 3, chunk=4096)] == [0, 1, 2]
    assert _array_prefix(tmp_path / "big.json", 1000, chunk=4096) == items
    (tmp_path / "n.json").write_text("[1, 2, 345]")
    assert _array_prefix(tmp_path / "n.json", 3, chunk=8) == [1, 2, 345]  # never a number cut at a chunk's end
    (tmp_path / "wrapped.json").write_text(json.dumps({"data": items[:2]}))
    assert _array_prefix(tmp_path / "wrapped.json", 1) is None
    head = list(open_source(tmp_path / "wrapped.json").head(5))
    assert [(r.location, r.record["id"]) for r in head] == [("item 1", 0), ("item 2", 1)]
    assert file_format(_entry(tmp_path, "big.json")).describe() == \
        "sharegpt: conversations of {from, value} (detected from item 1)"


def test_parquet_image_bytes_stream_page_by_page(tmp_path, media_dir):
    """One row group of 200 images (about 10 MB): reading the records holds a few pages, not the row group."""
    import numpy as np

    rng = np.random.default_rng(0)
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rows = 200
    table = pa.table({
        "id": [str(i) for i in range(rows)],
        "image": pa.array([{"bytes": rng.integers(0, 256, 50_000, dtype=np.uint8).tobytes(), "path": f"{i}.png"}
                           for i in range(rows)], image),
        "conversations": [[{"from": "human", "value": f"<image>\nQ{i}"}, {"from": "gpt", "value": "A"}]
                          for i in range(rows)]})
    pq.write_table(table, tmp_path / "ov.parquet", row_group_size=rows, use_dictionary=["id"], write_batch_size=8)
    del table
    source, base = open_source(tmp_path / "ov.parquet"), pa.total_allocated_bytes()
    peak, seen = 0, 0
    while (raw := source.next_record()) is not None:
        seen += 1
        assert raw.record["image"]["path"] == f"{seen - 1}.png" and len(raw.record["image"]["bytes"]) == 50_000
        peak = max(peak, pa.total_allocated_bytes() - base)
    assert seen == rows and peak < 8_000_000  # 64-row batches of 50 kB images: 3.2 MB; the row group: 10 MB


def test_skip_report_is_the_same_in_every_layout(make_processor, tmp_path, media_dir):
    """The same good and bad conversations as messages JSONL, LLaVA JSON and parquet with image bytes: the same
    samples, the same counts per reason, the same locations."""
    png = (media_dir / "img0.png").read_bytes()
    messages = [chat([{"type": "image", "image": "img0.png"}, {"type": "text", "text": "Q1"}], "A1"),
                chat([{"type": "image", "image": "gone.png"}, {"type": "text", "text": "Q2"}], "A2"),
                {"messages": [{"role": "user", "content": "Q3"}]},
                chat("Q4", "A4")]
    write_jsonl(media_dir / "m.jsonl", messages)
    llava = [{"image": "img0.png", "conversations": [{"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"}]},
             {"image": "gone.png", "conversations": [{"from": "human", "value": "Q2"}, {"from": "gpt", "value": "A2"}]},
             {"conversations": [{"from": "human", "value": "Q3"}]},
             {"conversations": [{"from": "human", "value": "Q4"}, {"from": "gpt", "value": "A4"}]}]
    (media_dir / "l.json").write_text(json.dumps(llava))
    rows = [{**r, "image": {"bytes": png, "path": None} if r.get("image") == "img0.png" else
             {"bytes": None, "path": r["image"]} if "image" in r else None} for r in llava]
    pq.write_table(pa.Table.from_pylist(rows), media_dir / "p.parquet")
    reports = {}
    for name in ("m.jsonl", "l.json", "p.parquet"):
        cfg = DataConfig(datasets=[{"path": name}], on_error="skip")
        stream = DataStream(cfg, make_processor(), base_dir=media_dir)
        batches = list(stream)
        report = stream.report()
        where = [e.split(": ")[0].rsplit(":", 1)[1] for v in report["examples"].values() for e in v]
        reports[name] = ([b["input_ids"].tolist() for b in batches], report["skipped"], report["samples_seen"], where)
    assert reports["m.jsonl"][3] == ["line 2", "line 3"] and reports["l.json"][3] == ["item 2", "item 3"]
    assert reports["p.parquet"][3] == ["row 2", "row 3"]
    assert reports["m.jsonl"][:3] == reports["l.json"][:3] == reports["p.parquet"][:3]
    assert reports["m.jsonl"][1:3] == ({"missing_file": 1, "no_labels": 1}, 4) and len(reports["m.jsonl"][0]) == 2


def _texts(conv) -> list[list[str]]:
    return [[getattr(p, "text", f"[{getattr(p, 'kind', '?')}]") for p in m.parts] for m in conv.messages]


def test_tags_in_text_are_text_in_messages_without_a_media_list(caplog, monkeypatch):
    """transformers' chat templates leave ``<video>`` in text alone: a chat about HTML is not a broken record."""
    html = parse_conversation(chat("What does the HTML <video> tag do? And <image>?"), "d.jsonl", "line 1")
    assert _texts(html)[0] == ["What does the HTML <video> tag do? And <image>?"]
    named = parse_conversation(chat([{"type": "image", "url": "red.png"}, {"type": "text", "text": "<image>\nColour?"}]),
                               "d.jsonl", "line 2")
    assert _texts(named)[0] == ["[image]", "<image>\nColour?"]
    with_list = parse_conversation({**chat("<image>Colour?"), "images": ["red.png"]}, "d.jsonl", "line 3")
    assert _texts(with_list)[0] == ["[image]", "Colour?"]
    with pytest.raises(SampleError, match="placeholder_mismatch: 2 <image> placeholder"):  # a list given, counts
        parse_conversation({**chat("<image><image>?"), "images": ["red.png"]}, "d.jsonl", "line 4")
    with pytest.raises(SampleError, match=r"1 image\(s\) in 'images' and 1 image part\(s\) that name their own file"):
        parse_conversation({**chat([{"type": "image", "image": "red.png"}, {"type": "text", "text": "c?"}]),
                            "images": ["red.png"]}, "d.jsonl", "line 5")  # the picture twice, or which?
    # LLaVA's own loader: a row without an `image` key is text (its ShareGPT rows about HTML <video> tags), read
    # as such with one warning per file; a row with a media key has placeholders
    monkeypatch.setattr("vlforge.data.schema._TEXT_TAGS_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="vlforge.data.schema"):
        for n in (1, 2):
            text = parse_conversation({"conversations": [{"from": "human", "value": "Autoplay a <video>?"},
                                                         {"from": "gpt", "value": "Use <video autoplay>."}]},
                                      "l.json", f"item {n}")
    assert _texts(text)[0] == ["Autoplay a <video>?"]
    assert [r.getMessage() for r in caplog.records] == [
        "l.json: records without an images/image/videos/video key read <image> / <video> in their text as text "
        "(LLaVA's rule; first: item 1)"]
    with pytest.raises(SampleError, match="placeholder_mismatch"):
        parse_conversation({"conversations": [{"from": "human", "value": "<image>?"}, {"from": "gpt", "value": "x"}],
                            "images": []}, "l.json", "item 3")
    null_struct = parse_conversation({"image": {"bytes": None, "path": None}, "conversations": [
        {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]}, "ov.parquet", "row 2")  # an Image column
    assert _parts(null_struct) == [("user", ["Hi"]), ("assistant", ["Yo"])]
    with pytest.raises(SampleError, match="placeholder_mismatch: <image> / <video> in the text and no "
                                          "images/image/videos/video key, but a 'image_path' key: name it with "
                                          "columns\\.images"):  # a misnamed media key is not a text-only row
        parse_conversation({"image_path": "coco/1.jpg", "conversations": [
            {"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "x"}]}, "l.json", "item 4")


def test_validate_json_carries_the_warnings_of_reading_the_data(tmp_path, monkeypatch):
    """The data pipeline's warnings while validate reads the records (here LLaVA's rule for <video> in text)
    reach `--json`, per file and in the report's warnings, not only stderr."""
    from typer.testing import CliRunner

    from vlforge.cli import app

    monkeypatch.setattr("vlforge.data.schema._TEXT_TAGS_WARNED", set())
    rows = [{"conversations": [{"from": "human", "value": "Autoplay a <video>?"}, {"from": "gpt", "value": "Yes."}]}]
    write_jsonl(tmp_path / "l.jsonl", rows)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "data": {"dataset_path": str(tmp_path / "l.jsonl")}, "model": {"load_from_pretrained_path": "tiny:qwen3_vl"},
        "training": {"max_steps": 1}}))
    done = CliRunner().invoke(app, ["validate", str(tmp_path / "run.yaml"), "--json"])
    report = json.loads(done.stdout)
    assert done.exit_code == 0, report
    expected = (f"{tmp_path / 'l.jsonl'}: records without an images/image/videos/video key read <image> / <video> in "
                "their text as text (LLaVA's rule; first: line 1)")
    assert report["datasets"][0]["warnings"] == [expected] and expected in report["warnings"], report


@pytest.mark.parametrize(("keys", "detail"), [
    ({"tags": {"observation_tag": "observation"}}, "LLaMA-Factory's tool-call key: vlforge trains no tool turns"),
    ({"tags": {"function_tag": "function_call"}}, "LLaMA-Factory's tool-call key"),
    ({"columns": {"tools": "tools"}}, "LLaMA-Factory's tool-call key"),
    ({"layout": "openai"}, "LLaMA-Factory's 'openai' formatting is layout messages here"),
])
def test_llama_factory_keys_vlforge_does_not_read_say_why(keys, detail):
    """A dataset_info.json entry copied as it is: its tool-call keys and `formatting: openai` name what they are
    (were "did you mean 'user_tag'?" and the list of layouts)."""
    with pytest.raises(ValidationError, match=detail):
        DatasetEntry(path="d.json", **keys)
