"""Load a vlforge export with plain transformers and answer a question about an image.

An export (``OUTPUT_DIR/final`` of ``vlforge train``, or ``vlforge export``) is a Hugging Face directory naming only
stock transformers classes; this script uses nothing of vlforge but one import, and only where torchvision is
missing (transformers cannot build a Qwen-VL processor without it; ``import vlforge`` supplies one, docs/models.md).

Run (CPU, seconds for a tiny model):
    .venv/bin/python examples/generate.py output/my_run/final examples/data/images/red_circle.png "What is in this picture?"
"""

from __future__ import annotations

import argparse
import importlib.util

import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

if importlib.util.find_spec("torchvision") is None:
    import vlforge  # noqa: F401  - the processor without torchvision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="an exported model directory")
    parser.add_argument("image", help="an image file")
    parser.add_argument("question", nargs="?", default="What is in this picture?")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()

    processor = AutoProcessor.from_pretrained(args.model)
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype="auto").eval()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": args.question}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(text=[prompt], images=[Image.open(args.image).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
    answer = processor.batch_decode(output[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)[0]
    print(f"{len(output[0]) - inputs['input_ids'].shape[1]} new tokens: {answer!r}")


if __name__ == "__main__":
    main()
