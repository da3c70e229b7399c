"""An independent first-step loss written with transformers only: the yardstick of vlforge's labels and loss.

Nothing of vlforge builds the text, the labels or the loss here. Per record of a JSONL dataset (LMMS
Engine's layout): the checkpoint's own chat template (``processor.apply_chat_template``) renders the
chat; the checkpoint's processor expands the image and video placeholders and makes the pixels
(images opened with Pillow; video frames decoded here with PyAV, every frame, passed with their
metadata); labels follow the convention stated by a token rule: after each ``<|im_start|>assistant\\n``,
every token up to and including the next ``<|im_end|>`` is supervised (so not that ``\\n``, not the
prompt); the loss is the summed cross-entropy of the shifted labels from the model's logits (fp32).
``import vlforge`` happens only so that ``AutoProcessor`` loads without torchvision (its
torchvision-free video processor); the processing itself is transformers'.

Example:
    >>> rows = reference(Path("tiny-q25"), Path("parity.jsonl"), "qwen2_5_vl")  # doctest: +SKIP
    >>> sum(r["loss_sum"] for r in rows) / sum(r["predicted"] for r in rows)  # doctest: +SKIP
    12.06...
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from parity_data import MAX_PIXELS, MIN_PIXELS


def hf_messages(record: dict) -> tuple[list[dict], list[str], list[str]]:
    """The chat as transformers' templates take it, and the image and video paths in order."""
    messages, images, videos = [], [], []
    for message in record["messages"]:
        parts = []
        for part in message["content"]:
            if part["type"] == "image_url":
                images.append(part["image_url"]["url"])
                parts.append({"type": "image"})
            elif part["type"] == "video_url":
                videos.append(part["video_url"]["url"])
                parts.append({"type": "video"})
            else:
                parts.append({"type": "text", "text": part["text"]})
        messages.append({"role": message["role"], "content": parts})
    return messages, images, videos


def decode_frames(path: Path) -> tuple[Any, float]:
    """Every frame of a video as a (T, H, W, 3) uint8 array, and its frame rate."""
    import av
    import numpy as np

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        return np.stack(frames), float(stream.average_rate)


def assistant_labels(input_ids: list[int], tokenizer: Any) -> list[int]:
    """-100 everywhere but the tokens after each ``<|im_start|>assistant\\n`` up to its ``<|im_end|>``."""
    start, end = tokenizer.convert_tokens_to_ids("<|im_start|>"), tokenizer.convert_tokens_to_ids("<|im_end|>")
    header = [start, *tokenizer.encode("assistant\n", add_special_tokens=False)]
    labels = [-100] * len(input_ids)
    i = 0
    while i < len(input_ids):
        if input_ids[i:i + len(header)] == header:
            i += len(header)
            while i < len(input_ids):
                labels[i] = input_ids[i]
                i += 1
                if input_ids[i - 1] == end:
                    break
        else:
            i += 1
    return labels


def load(checkpoint: Path) -> tuple[Any, Any]:
    """The checkpoint's processor (pixel bounds of the parity data) and its model in fp32, eval mode."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    import vlforge  # noqa: F401  (the torchvision-free video processor; nothing else of vlforge is used)

    processor = AutoProcessor.from_pretrained(checkpoint)
    processor.image_processor.size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    processor.video_processor.size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS * 16}
    model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return processor, model


def encode(processor: Any, record: dict, folder: Path) -> dict[str, Any]:
    """One record -> the processor's tensors (batch of one) plus ``labels`` (a list)."""
    from PIL import Image

    messages, image_paths, video_paths = hf_messages(record)
    text = processor.apply_chat_template(messages, tokenize=False)
    images = [Image.open(folder / p).convert("RGB") for p in image_paths] or None
    kwargs: dict[str, Any] = {}
    if video_paths:
        clips = [decode_frames(folder / p) for p in video_paths]
        kwargs["videos"] = [frames for frames, _ in clips]
        kwargs["video_metadata"] = [{"fps": fps, "frames_indices": list(range(len(frames))),
                                     "total_num_frames": len(frames)} for frames, fps in clips]
        kwargs["do_sample_frames"] = False
    enc = processor(text=[text], images=images, return_tensors="pt", **kwargs)
    out = dict(enc)
    out["labels"] = assistant_labels(enc["input_ids"][0].tolist(), processor.tokenizer)
    return out


def loss_sum(model: Any, enc: dict[str, Any]) -> tuple[float, int]:
    """Summed fp32 cross-entropy of the shifted labels, and how many labels were predicted."""
    import torch
    from torch.nn import functional as F

    inputs = {k: v for k, v in enc.items() if k != "labels"}
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits[0]
    labels = torch.tensor(enc["labels"][1:])
    keep = labels != -100
    return float(F.cross_entropy(logits[:-1][keep].float(), labels[keep], reduction="sum")), int(keep.sum())


def reference(checkpoint: Path, data: Path, family: str) -> list[dict[str, Any]]:
    """Per record: ``input_ids``, ``labels``, ``loss_sum``, ``predicted`` (labels at positions >= 1)."""
    processor, model = load(checkpoint)
    rows = []
    for line in data.read_text(encoding="utf-8").splitlines():
        enc = encode(processor, json.loads(line), data.parent)
        total, count = loss_sum(model, enc)
        rows.append({"input_ids": enc["input_ids"][0].tolist(), "labels": enc["labels"], "loss_sum": total,
                     "predicted": count})
    return rows
