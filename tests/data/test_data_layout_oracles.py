"""Published dataset layouts as oracles: small files of our own records, written in the exact layouts of public
datasets and peers' example data, give exactly the samples of the same conversations in the ``messages`` layout.

The layouts, read from their sources:

* LLaVA-Instruct-150K (``llava_instruct_150k.json``, haotian-liu/LLaVA ``llava/train/train.py``
  ``LazySupervisedDataset``): a JSON array of ``{"id", "image", "conversations": [{"from": "human" | "gpt",
  "value"}]}``, ``<image>`` before (``"<image>\\n..."``) or after (``"...\\n<image>"``) the first question.
* LLaVA-NeXT's video records (``llava/train/train.py`` of LLaVA-VL/LLaVA-NeXT reads ``video`` with the
  ``<image>`` placeholder of the text standing for it).
* ShareGPT4V (``sharegpt4v_instruct_gpt4-vision_cap100k.json``, InternLM-XComposer ``projects/ShareGPT4V/docs/
  Data.md``): the same keys, image paths under their source's folder (``coco/train2017/...``, ``sam/images/...``);
  the SFT mix also holds text-only records without ``image``.
* LLaVA-OneVision-Data (lmms-lab/LLaVA-OneVision-Data, its card's ``dataset_info``): parquet with ``id`` (string),
  ``image`` (``datasets`` ``Image``: a struct of ``bytes`` and ``path``, null for text), ``conversations``
  (list of ``{from, value}``), ``data_source`` (string); also as the Arrow IPC stream ``save_to_disk`` writes.
* LLaMA-Factory ``data/mllm_demo.json`` and ``data/mllm_video_demo.json`` with their ``data/dataset_info.json``
  entries (``formatting: sharegpt``, ``columns``, ``tags``): ``messages`` of ``{role, content}`` with ``<image>``
  anywhere in a turn (``"What are they doing?<image>"``), ``images`` / ``videos`` lists.
* LLaMA-Factory's ``alpaca`` formatting (``data/alpaca_en_demo.json``, ``data/README.md``, its
  ``AlpacaDatasetConverter``): ``instruction`` and ``input`` joined by a newline, ``output``, ``history`` pairs
  before them, ``system``, ``images``; every key renamed through ``dataset_info.json`` ``columns``.
* The Cauldron (HuggingFaceM4/the_cauldron, its card's ``dataset_info``; torchtune's ``TheCauldronToMessages``
  and the Idefics2 fine-tuning recipes read it so): parquet with ``images`` (a list of ``Image`` structs) and
  ``texts`` (a list of ``{user, assistant, source}`` exchanges); the images go before the first question.
* transformers' chat format (``apply_chat_template`` content parts ``{"type": "image", "url" | "path" |
  "base64"}``) and TRL's vision datasets (parquet: parts ``{"type", "text", "index"}`` and an ``images``
  column of ``Image`` structs), and its prompt-completion sets (``trl-lib/llava-instruct-mix``, TRL
  ``examples/datasets/llava_instruct_mix.py``: ``prompt`` = the messages but the last, ``completion`` = the last,
  ``<image>`` removed from the text, an ``images`` column; TRL trains the completion only).

Each is streamed through ``vlforge.data.DataStream`` with the processor of two families (the HF processors the
tiny qwen2_5_vl and qwen3_vl checkpoints ship) and compared tensor by tensor with the native file.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from datakit import SMALL, write_image, write_jsonl, write_video

from vlforge.data import DataConfig, DataStream, QwenVLProcessor

FAMILIES = ("qwen2_5_vl", "qwen3_vl")
HF_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
"""The parquet type of ``datasets``' ``Image`` feature."""


def _hf_features(features: dict) -> dict[bytes, bytes]:
    """The schema metadata ``datasets`` writes into its parquet files (their features)."""
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def _user(*items) -> dict:
    """A native user turn: ``("image", path)`` / ``("video", path)`` parts and text strings, in order."""
    parts = [{"type": "text", "text": x} if isinstance(x, str) else {"type": x[0], x[0]: x[1]} for x in items]
    return {"role": "user", "content": parts}


def _reply(text: str) -> dict:
    return {"role": "assistant", "content": text}


def _write_layouts(root: Path) -> dict[str, tuple[dict, list[dict]]]:
    """Every layout's file and dataset entry, with the same conversations in the ``messages`` layout."""
    for folder in ("coco/train2017", "sam/images", "mllm_demo_data", "llava"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    write_image(root / "llava" / "000000215677.jpg", seed=1)
    write_image(root / "llava" / "000000033471.jpg", size=(48, 64), seed=2)
    write_image(root / "coco/train2017/000000000009.jpg", seed=3)
    write_image(root / "sam/images/sa_545504.jpg", size=(80, 40), seed=4)
    write_image(root / "mllm_demo_data/1.jpg", seed=5)
    write_image(root / "mllm_demo_data/2.jpg", size=(40, 64), seed=6)
    write_video(root / "mllm_demo_data/1.mp4")
    write_image(root / "ov_0.png", seed=7)
    write_image(root / "ov_1.png", size=(56, 56), seed=8)
    out: dict[str, tuple[dict, list[dict]]] = {}

    # LLaVA-Instruct-150K
    llava = [
        {"id": "000000215677", "image": "000000215677.jpg", "conversations": [
            {"from": "human", "value": "<image>\nWhat colours are in the image?"},
            {"from": "gpt", "value": "Mostly noise in many colours."},
            {"from": "human", "value": "Is there a pattern?"},
            {"from": "gpt", "value": "No, the pixels are random."}]},
        {"id": "000000033471", "image": "000000033471.jpg", "conversations": [
            {"from": "human", "value": "What is unusual about this picture?\n<image>"},
            {"from": "gpt", "value": "It is taller than it is wide."}]}]
    (root / "llava_instruct_150k.json").write_text(json.dumps(llava, indent=1))
    out["llava_instruct"] = ({"path": "llava_instruct_150k.json", "data_folder": "llava"}, [
        {"messages": [_user(("image", "000000215677.jpg"), "\nWhat colours are in the image?"),
                      _reply("Mostly noise in many colours."), _user("Is there a pattern?"),
                      _reply("No, the pixels are random.")]},
        {"messages": [_user("What is unusual about this picture?\n", ("image", "000000033471.jpg")),
                      _reply("It is taller than it is wide.")]}])

    # ShareGPT4V (cap100k, and the SFT mix's text-only records)
    share = [
        {"id": "000000000009", "image": "coco/train2017/000000000009.jpg", "conversations": [
            {"from": "human", "value": "What do you see happening in this image?\n<image>"},
            {"from": "gpt", "value": "A square of random pixels, slightly wider than tall."}]},
        {"id": "sa_545504", "image": "sam/images/sa_545504.jpg", "conversations": [
            {"from": "human", "value": "<image>\nAnalyze the image in a comprehensive and detailed manner."},
            {"from": "gpt", "value": "A wide strip of coloured noise."}]},
        {"id": "i6IyJda_0", "conversations": [
            {"from": "human", "value": "How many sides has a square?"}, {"from": "gpt", "value": "Four."}]}]
    (root / "sharegpt4v_instruct_gpt4-vision_cap100k.json").write_text(json.dumps(share))
    out["sharegpt4v"] = ({"path": "sharegpt4v_instruct_gpt4-vision_cap100k.json"}, [
        {"messages": [_user("What do you see happening in this image?\n", ("image", "coco/train2017/000000000009.jpg")),
                      _reply("A square of random pixels, slightly wider than tall.")]},
        {"messages": [_user(("image", "sam/images/sa_545504.jpg"),
                            "\nAnalyze the image in a comprehensive and detailed manner."),
                      _reply("A wide strip of coloured noise.")]},
        {"messages": [_user("How many sides has a square?"), _reply("Four.")]}])

    # LLaVA-NeXT's video records (LLaVA-Video-178K): a "video" key, <image> standing for it in the text
    video_records = [{"id": "v_0", "video": "mllm_demo_data/1.mp4", "data_source": "synthetic", "conversations": [
        {"from": "human", "value": "<image>\nWhat changes in the video?"}, {"from": "gpt", "value": "The colour."}]}]
    (root / "llava_video_178k.json").write_text(json.dumps(video_records))
    out["llava_video"] = ({"path": "llava_video_178k.json"}, [
        {"messages": [_user(("video", "mllm_demo_data/1.mp4"), "\nWhat changes in the video?"), _reply("The colour.")]}])

    # LLaVA-OneVision-Data: parquet, image bytes in the file
    rows = [{"id": "ov-0", "image": {"bytes": (root / "ov_0.png").read_bytes(), "path": "ov_0.png"},
             "conversations": [{"from": "human", "value": "<image>\nWhat is the dominant colour?"},
                               {"from": "gpt", "value": "None; it is noise."}], "data_source": "synthetic"},
            {"id": "ov-1", "image": None, "conversations": [{"from": "human", "value": "Say hi."},
                                                            {"from": "gpt", "value": "Hi."}], "data_source": "text"},
            {"id": "ov-2", "image": {"bytes": (root / "ov_1.png").read_bytes(), "path": None},
             "conversations": [{"from": "human", "value": "Describe it."},  # no placeholder: LLaVA's placement
                               {"from": "gpt", "value": "A square of noise."}], "data_source": "synthetic"}]
    schema = pa.schema([("id", pa.string()), ("image", HF_IMAGE),
                        ("conversations", pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())]))),
                        ("data_source", pa.string())],
                       metadata=_hf_features({"id": {"dtype": "string", "_type": "Value"}, "image": {"_type": "Image"},
                                              "conversations": [{"from": {"dtype": "string", "_type": "Value"},
                                                                 "value": {"dtype": "string", "_type": "Value"}}],
                                              "data_source": {"dtype": "string", "_type": "Value"}}))
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, root / "llava_onevision.parquet", row_group_size=2)
    with pa.ipc.new_stream(root / "llava_onevision.arrow", schema) as writer:  # what datasets' save_to_disk writes
        writer.write_table(table, max_chunksize=2)
    onevision = [
        {"messages": [_user(("image", "ov_0.png"), "\nWhat is the dominant colour?"), _reply("None; it is noise.")]},
        {"messages": [_user("Say hi."), _reply("Hi.")]},
        {"messages": [_user(("image", "ov_1.png"), "Describe it."), _reply("A square of noise.")]}]
    out["llava_onevision"] = ({"path": "llava_onevision.parquet"}, onevision)
    out["llava_onevision_arrow"] = ({"path": "llava_onevision.arrow"}, onevision)

    # LLaMA-Factory mllm_demo.json / mllm_video_demo.json, read through their dataset_info.json entries
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    demo = [{"messages": [{"content": "<image>Who are they?", "role": "user"},
                          {"content": "Two squares of noise.", "role": "assistant"},
                          {"content": "What are they doing?<image>", "role": "user"},
                          {"content": "Standing still.", "role": "assistant"}],
             "images": ["mllm_demo_data/1.jpg", "mllm_demo_data/1.jpg"]},
            {"messages": [{"content": "<image>Who is he?", "role": "user"},
                          {"content": "A tall rectangle.", "role": "assistant"}], "images": ["mllm_demo_data/2.jpg"]}]
    (root / "mllm_demo.json").write_text(json.dumps(demo, indent=2, ensure_ascii=False))
    out["llama_factory_mllm_demo"] = (
        {"path": "mllm_demo.json", "layout": "sharegpt", "columns": {"messages": "messages", "images": "images"},
         "tags": tags}, [
            {"messages": [_user(("image", "mllm_demo_data/1.jpg"), "Who are they?"), _reply("Two squares of noise."),
                          _user("What are they doing?", ("image", "mllm_demo_data/1.jpg")),
                          _reply("Standing still.")]},
            {"messages": [_user(("image", "mllm_demo_data/2.jpg"), "Who is he?"), _reply("A tall rectangle.")]}])
    video_demo = [{"messages": [{"content": "<video>Why is this video funny?", "role": "user"},
                                {"content": "Because the colour keeps changing.", "role": "assistant"}],
                   "videos": ["mllm_demo_data/1.mp4"]}]
    (root / "mllm_video_demo.json").write_text(json.dumps(video_demo, indent=2))
    out["llama_factory_mllm_video_demo"] = (
        {"path": "mllm_video_demo.json", "layout": "sharegpt", "columns": {"messages": "messages", "videos": "videos"},
         "tags": tags}, [
            {"messages": [_user(("video", "mllm_demo_data/1.mp4"), "Why is this video funny?"),
                          _reply("Because the colour keeps changing.")]}])

    # transformers' chat format: parts with url / path / base64
    payload = base64.b64encode((root / "ov_1.png").read_bytes()).decode()
    chats = [{"messages": [{"role": "user", "content": [{"type": "image", "url": "ov_0.png"},
                                                        {"type": "image", "path": f"file://{root / 'ov_1.png'}"},
                                                        {"type": "text", "text": "Compare them."}]},
                           {"role": "assistant", "content": [{"type": "text", "text": "Both are noise."}]}]},
             {"messages": [{"role": "user", "content": [{"type": "image", "base64": payload},
                                                        {"type": "video", "path": "mllm_demo_data/1.mp4"},
                                                        {"type": "text", "text": "Same colours?"}]},
                           {"role": "assistant", "content": "No."}]}]
    write_jsonl(root / "transformers_chat.jsonl", chats)
    out["transformers_chat"] = ({"path": "transformers_chat.jsonl"}, [
        {"messages": [_user(("image", "ov_0.png"), ("image", "ov_1.png"), "Compare them."), _reply("Both are noise.")]},
        {"messages": [_user(("image", "ov_1.png"), ("video", "mllm_demo_data/1.mp4"), "Same colours?"),
                      _reply("No.")]}])

    # TRL's vision datasets: parquet parts {type, text, index} and an images column of Image structs
    part = pa.struct([("index", pa.int64()), ("text", pa.string()), ("type", pa.string())])
    trl_schema = pa.schema([("images", pa.list_(HF_IMAGE)), ("messages", pa.list_(pa.struct(
        [("content", pa.list_(part)), ("role", pa.string())])))])
    trl = [{"images": [{"bytes": (root / "ov_0.png").read_bytes(), "path": None}],
            "messages": [{"role": "user", "content": [{"index": 0, "text": None, "type": "image"},
                                                      {"index": None, "text": "What is this?", "type": "text"}]},
                         {"role": "assistant", "content": [{"index": None, "text": "Noise.", "type": "text"}]}]}]
    pq.write_table(pa.Table.from_pylist(trl, schema=trl_schema), root / "trl_vision.parquet")
    out["trl_vision"] = ({"path": "trl_vision.parquet"}, [
        {"messages": [_user(("image", "ov_0.png"), "What is this?"), _reply("Noise.")]}])

    # TRL's prompt-completion vision sets (trl-lib/llava-instruct-mix, examples/datasets/llava_instruct_mix.py: the
    # last message is the completion, `<image>` removed from the text, an `images` column): only the completion trains
    turn = pa.struct([("content", pa.string()), ("role", pa.string())])
    pc_schema = pa.schema([("images", pa.list_(HF_IMAGE)), ("prompt", pa.list_(turn)), ("completion", pa.list_(turn))])
    pc = [{"images": [{"bytes": (root / "ov_0.png").read_bytes(), "path": None}],
           "prompt": [{"role": "user", "content": "What is shown?"}, {"role": "assistant", "content": "Noise."},
                      {"role": "user", "content": "Which colours?"}],
           "completion": [{"role": "assistant", "content": "Grey ones."}]},
          {"images": [{"bytes": (root / "ov_1.png").read_bytes(), "path": None}],
           "prompt": [{"role": "user", "content": "Describe it."}],
           "completion": [{"role": "assistant", "content": "A square."}]}]
    pq.write_table(pa.Table.from_pylist(pc, schema=pc_schema), root / "trl_prompt_completion.parquet")
    out["trl_prompt_completion"] = ({"path": "trl_prompt_completion.parquet"}, [
        {"messages": [_user(("image", "ov_0.png"), "What is shown?"), {**_reply("Noise."), "weight": 0},
                      _user("Which colours?"), _reply("Grey ones.")]},
        {"messages": [_user(("image", "ov_1.png"), "Describe it."), _reply("A square.")]}])

    # The Cauldron: exchanges {user, assistant, source} in `texts`, an `images` list of Image structs before them
    exchange = pa.struct([("user", pa.string()), ("assistant", pa.string()), ("source", pa.string())])
    cauldron_schema = pa.schema([("images", pa.list_(HF_IMAGE)), ("texts", pa.list_(exchange))]).with_metadata(
        _hf_features({"images": [{"_type": "Image"}], "texts": [{"user": {"dtype": "string", "_type": "Value"},
                                                                 "assistant": {"dtype": "string", "_type": "Value"},
                                                                 "source": {"dtype": "string", "_type": "Value"}}]}))
    cauldron = [{"images": [{"bytes": (root / "ov_0.png").read_bytes(), "path": None},
                            {"bytes": (root / "ov_1.png").read_bytes(), "path": None}],
                 "texts": [{"user": "Which is larger?\nAnswer briefly.", "assistant": "The first.", "source": "ai2d"},
                           {"user": "And its colour?", "assistant": "Noise.", "source": "ai2d"}]},
                {"images": [{"bytes": (root / "ov_1.png").read_bytes(), "path": None}],
                 "texts": [{"user": "What is shown?", "assistant": "A square.", "source": "vqav2"}]}]
    pq.write_table(pa.Table.from_pylist(cauldron, schema=cauldron_schema), root / "the_cauldron.parquet")
    out["the_cauldron"] = ({"path": "the_cauldron.parquet"}, [
        {"messages": [_user(("image", "ov_0.png"), ("image", "ov_1.png"), "Which is larger?\nAnswer briefly."),
                      _reply("The first."), _user("And its colour?"), _reply("Noise.")]},
        {"messages": [_user(("image", "ov_1.png"), "What is shown?"), _reply("A square.")]}])

    # LLaMA-Factory's default `alpaca` formatting (data/alpaca_en_demo.json; its converter joins instruction and input
    # with a newline and puts `history` pairs first; `images` and `system` columns), read as it is (auto)...
    alpaca = [
        {"instruction": "<image>Describe the picture.", "input": "", "output": "Noise.", "images": ["ov_0.png"]},
        {"instruction": "Translate to English.", "input": "bonjour", "output": "hello"},
        {"instruction": "And its colour?", "input": "", "output": "Grey.", "system": "Be brief.",
         "history": [["What is in <image>?", "A square."]], "images": ["ov_1.png"]},
        {"instruction": "", "input": "Name two colours.", "output": "Red, blue.", "history": []}]
    (root / "alpaca_demo.json").write_text(json.dumps(alpaca, indent=2))
    out["llama_factory_alpaca"] = ({"path": "alpaca_demo.json"}, [
        {"messages": [_user(("image", "ov_0.png"), "Describe the picture."), _reply("Noise.")]},
        {"messages": [_user("Translate to English.\nbonjour"), _reply("hello")]},
        {"messages": [{"role": "system", "content": "Be brief."}, _user("What is in ", ("image", "ov_1.png"), "?"),
                      _reply("A square."), _user("And its colour?"), _reply("Grey.")]},
        {"messages": [_user("Name two colours."), _reply("Red, blue.")]}])
    # ... and with its dataset_info.json `columns` renaming every key (a parquet file, history as JSON text; an
    # image without a placeholder goes to the start of the first user turn)
    renamed = [{"question": "What is it?", "context": None, "answer": "A picture.", "turns": None, "sys": None,
                "pics": ["ov_1.png"]},
               {"question": "Continue.", "context": "1, 2, 3", "answer": "4, 5.", "sys": "Count.",
                "turns": json.dumps([["Start counting.", "1, 2, 3"]]), "pics": None}]
    pq.write_table(pa.Table.from_pylist(renamed), root / "alpaca_renamed.parquet")
    out["llama_factory_alpaca_columns"] = (
        {"path": "alpaca_renamed.parquet", "layout": "alpaca",
         "columns": {"prompt": "question", "query": "context", "response": "answer", "history": "turns",
                     "system": "sys", "images": "pics"}}, [
            {"messages": [_user(("image", "ov_1.png"), "What is it?"), _reply("A picture.")]},
            {"messages": [{"role": "system", "content": "Count."}, _user("Start counting."), _reply("1, 2, 3"),
                          _user("Continue.\n1, 2, 3"), _reply("4, 5.")]}])

    for name, (entry, natives) in out.items():
        folder = root / (entry.get("data_folder") or "")
        write_jsonl(folder / f"native_{name}.jsonl", natives)
    return out


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    return root, _write_layouts(root)


@pytest.fixture(scope="module")
def processors(tokenizer):
    from vlforge.models.tiny import build_processor

    return {family: QwenVLProcessor.from_hf_processor(build_processor(family, tokenizer), family, **SMALL)
            for family in FAMILIES}


def _samples(processor, root: Path, entry: dict) -> list[dict]:
    batches = list(DataStream(DataConfig(datasets=[entry]), processor, base_dir=root))
    return [{k: v for k, v in batch.items() if k != "sample_ids"} for batch in batches]


@pytest.mark.parametrize("name", ["llava_instruct", "sharegpt4v", "llava_video", "llava_onevision", "llava_onevision_arrow",
                                  "llama_factory_mllm_demo",
                                  "llama_factory_mllm_video_demo", "transformers_chat", "trl_vision",
                                  "trl_prompt_completion", "the_cauldron", "llama_factory_alpaca", "llama_factory_alpaca_columns"])
def test_published_layout_gives_the_samples_of_the_messages_layout(layouts, processors, name):
    root, files = layouts
    entry, natives = files[name]
    native_entry = {"path": f"{entry.get('data_folder') or '.'}/native_{name}.jsonl"}  # media beside it
    for family, processor in processors.items():
        got, expected = _samples(processor, root, entry), _samples(processor, root, native_entry)
        assert len(got) == len(expected) == len(natives), family
        for ours, theirs in zip(got, expected, strict=True):
            assert ours.keys() == theirs.keys(), family
            for key, value in theirs.items():
                assert torch.equal(ours[key], value) if isinstance(value, torch.Tensor) else ours[key] == value, \
                    (family, key)
        media = sum(int(b[k].shape[0]) for b in got for k in ("image_grid_thw", "video_grid_thw") if k in b)
        assert media == sum(not isinstance(p, str) and p["type"] != "text" for n in natives for m in n["messages"]
                            if m["role"] == "user" for p in m["content"])
