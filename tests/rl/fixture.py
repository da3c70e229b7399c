"""A tiny Qwen3-VL that stands in for a base model before Zero-RL: it writes a ``<thinking>`` format (tags spelt
with ordinary pieces) in about half of its answers, and never the added ``<think>`` / ``</think>`` tokens,
whose rows are set to unused padding rows (the audit's reference set: a deterministic ``untrained`` verdict).

Built once per test session in a few seconds: the tiny checkpoint is trained for a few dozen AdamW steps on
the fixture prompts with two answers each (one in the format, one plain), one CPU thread, seed 0.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

THINK, END_THINK = 151667, 151668  # the real Qwen3 tokenizer's ids (docs/tokens.md)
EMBED = "model.language_model.embed_tokens.weight"
QUESTIONS = ["What is 2+2?", "What is 3+5?", "Name a colour.", "What is 7-4?"]
ANSWERS = ["4", "8", "red", "3"]
STEPS = 30


def formatted(answer: str) -> str:
    return f"<thinking>\nadd them\n</thinking>\nso \\boxed{{{answer}}}"


def plain(answer: str) -> str:
    return f"The answer is {answer}."


def write_prompts(path: Path) -> Path:
    """The fixture prompts as TRL / JSONL rows (``prompt`` as chat messages, ``answer``)."""
    path.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": q}], "answer": a}) + "\n"
                            for q, a in zip(QUESTIONS, ANSWERS, strict=True)))
    return path


def build_base(src: Path, out: Path) -> Path:
    """``src`` (a tiny qwen3_vl checkpoint) trained to answer in the format half of the time, then its
    ``<think>`` / ``</think>`` rows replaced by padding rows."""
    import torch
    from safetensors.torch import load_file, save_file

    from vlforge.models import load

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loaded = load(src, processor=False)
        model, tok = loaded.model, loaded.tokenizer
        model.train()
        batch = []
        for question, answer in zip(QUESTIONS, ANSWERS, strict=True):
            prompt = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
            for text in (formatted(answer), plain(answer)):
                p = tok(prompt, add_special_tokens=False)["input_ids"]
                c = tok(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
                batch.append((p + c, [-100] * len(p) + c))
        width = max(len(ids) for ids, _ in batch)
        pad = tok.pad_token_id
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch])
        optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        targets = labels[:, 1:]
        keep = targets != -100  # the loss on the answers only: the lm_head over 151k rows on those positions alone
        for _ in range(STEPS):
            hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
            logits = model.lm_head(hidden[keep])
            loss = torch.nn.functional.cross_entropy(logits, targets[keep])
            loss.backward()
            optim.step()
            optim.zero_grad()
        model.eval()
        out.mkdir(parents=True)
        model.save_pretrained(out)
        for path in src.iterdir():
            if path.suffix in (".json", ".jinja") and path.name not in ("config.json", "generation_config.json"):
                shutil.copy2(path, out / path.name)
    finally:
        torch.set_num_threads(threads)
    tensors = load_file(out / "model.safetensors")
    rows = tensors[EMBED]
    tokenizer_len = len(tok)
    rows[THINK] = rows[tokenizer_len]
    rows[END_THINK] = rows[tokenizer_len + 1]
    if "lm_head.weight" in tensors and tensors["lm_head.weight"].data_ptr() != rows.data_ptr():
        tensors["lm_head.weight"][THINK] = tensors["lm_head.weight"][tokenizer_len]
        tensors["lm_head.weight"][END_THINK] = tensors["lm_head.weight"][tokenizer_len + 1]
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out
