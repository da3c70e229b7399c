"""Read checkpoint directories with stock transformers only: run by the portability tests, never imports vlforge.

For each directory: every class-name-like value of every JSON file (``*_type``, ``*_class``,
``architectures``, ``auto_map``) is looked up in this transformers (``hasattr(transformers, name)``; a
``model_type`` in its config mapping), then ``AutoConfig`` and ``AutoTokenizer`` load it. With
``--processor`` (needs torchvision, or vlforge imported first with ``--import-vlforge``),
``AutoProcessor`` loads it too and processes an image and a 4-frame video through the chat template.
Prints one JSON document.

Example:
    python tests/models/stock_loader.py /tmp/tiny-qwen3-vl --processor
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
from pathlib import Path

NAME_KEY = re.compile(r"(_type|_class|^architectures|^auto_map)$")
CLASS_NAME = re.compile(r"^[A-Z][A-Za-z0-9_]*$")
#: A tokenizer model's vocabulary (piece -> id) and merges (piece pairs): most of tokenizer.json, and no value
#: there sits under a name-like key, so the walk does not descend into them.
TOKEN_TABLES = ("vocab", "merges")


def class_like_values(node, key=None, found=None):
    """(key, value) of every string under a ``*_type`` / ``*_class`` / ``architectures`` / ``auto_map`` key."""
    found = [] if found is None else found
    if isinstance(node, dict):
        for child_key, value in node.items():
            if child_key in TOKEN_TABLES and key == "model":
                continue
            class_like_values(value, key if key == "auto_map" else child_key, found)
    elif isinstance(node, list):
        for value in node:
            class_like_values(value, key, found)
    elif isinstance(node, str) and key is not None and NAME_KEY.search(key):
        found.append((key, node))
    return found


def unknown_names(directory: Path) -> tuple[list[str], list[str]]:
    """(class names checked, names this transformers does not have) over the JSON files of ``directory``."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    checked, unknown = [], []
    for path in sorted(directory.rglob("*.json")):
        for key, value in class_like_values(json.loads(path.read_text()), None):
            where = f"{path.name}: {key}={value}"
            if key == "auto_map":
                unknown.append(f"{where} (custom code)")
            elif key == "model_type":
                checked.append(value)
                if value not in CONFIG_MAPPING_NAMES:
                    unknown.append(where)
            elif CLASS_NAME.match(value):
                checked.append(value)
                if not hasattr(transformers, value):
                    unknown.append(where)
    return sorted(set(checked)), unknown


def process(directory: Path) -> dict:
    """AutoProcessor on an image and a video (frames): class names, grids and placeholder counts."""
    import numpy as np
    from PIL import Image
    from transformers import AutoConfig, AutoProcessor, AutoVideoProcessor

    config = AutoConfig.from_pretrained(directory)
    processor = AutoProcessor.from_pretrained(directory)
    video_processor = AutoVideoProcessor.from_pretrained(directory)
    pixels = (np.arange(52 * 72 * 3) % 251).astype(np.uint8).reshape(52, 72, 3)
    image = Image.fromarray(pixels)
    video = np.stack([np.asarray(image.resize((40, 40)).rotate(10 * i)) for i in range(4)])
    content = [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "What changes?"}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)
    batch = processor(text=[text], images=[image], videos=[video], return_tensors="pt")
    ids = batch["input_ids"][0].tolist()
    merge = processor.image_processor.merge_size ** 2
    return {
        "processor": type(processor).__name__,
        "image_processor": type(processor.image_processor).__name__,
        "video_processor": type(processor.video_processor).__name__,
        "auto_video_processor": type(video_processor).__name__,
        "image_grid": batch["image_grid_thw"].tolist(),
        "video_grid": batch["video_grid_thw"].tolist(),
        "image_rows": int(batch["pixel_values"].shape[0]),
        "video_rows": int(batch["pixel_values_videos"].shape[0]),
        "image_placeholders": ids.count(config.image_token_id),
        "video_placeholders": ids.count(config.video_token_id),
        "image_tokens": int(batch["image_grid_thw"].prod(-1).sum()) // merge,
        "video_tokens": int(batch["video_grid_thw"].prod(-1).sum()) // merge,
    }


def main() -> None:
    # A short-lived reader: without the cyclic collector, which would walk torch's heap again and again while
    # tokenizer files are parsed (what is read and loaded does not change).
    gc.disable()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="+", type=Path)
    parser.add_argument("--processor", action="store_true", help="also load and run AutoProcessor")
    parser.add_argument("--import-vlforge", action="store_true", help="`import vlforge` first (and only that)")
    args = parser.parse_args()
    if args.import_vlforge:
        import vlforge  # noqa: F401 - the point: nothing else of vlforge is used

    import transformers
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import is_torchvision_available

    report = {}
    for directory in args.directories:
        checked, unknown = unknown_names(directory)
        config = AutoConfig.from_pretrained(directory)
        tokenizer = AutoTokenizer.from_pretrained(directory)
        entry = {"checked": checked, "unknown": unknown, "model_type": config.model_type,
                 "tokenizer": type(tokenizer).__name__, "tokenizer_length": len(tokenizer)}
        if args.processor:
            entry.update(process(directory))
        report[str(directory)] = entry
    print(json.dumps({
        "transformers": transformers.__version__,
        "torchvision": is_torchvision_available(),
        "vlforge_modules": sorted(name for name in sys.modules if name.split(".")[0] == "vlforge"),
        "directories": report,
    }))


if __name__ == "__main__":
    main()
