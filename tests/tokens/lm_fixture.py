"""A tiny Qwen3 causal LM trained for real on CPU, with known never-used token ids (test fixture).

The tokenizer is the real Qwen3 one cut down to its first ``keep`` ordinary ids (added tokens such as
``<think>`` renumbered after them), so a full-softmax training step costs milliseconds. Training is what
pretraining does to a token that never occurs: its input row gets no gradient (AdamW weight decay only),
its output row only the push-down of the softmax.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from vlforge.vocab.tokenizer import byte_invalid_ids, load_tokenizer

from .helpers import qwen3_tokenizer_dir, write_reduced


@dataclass
class TrainedLM:
    path: Path
    unused: list[int]  # tokenizer ids never used as input or target (the positives)
    used: list[int]  # tokenizer ids used as inputs and targets
    tokenizer_len: int
    vocab_rows: int
    final_loss: float
    seconds: float
    counts: list[int]  # occurrences of each tokenizer id in the training stream


def train_tiny_lm(out: Path, *, tied: bool, seed: int = 0, keep: int = 2048, hidden: int = 32,
                  steps: int = 120, batch: int = 8, seq: int = 64, lr: float = 1e-2,
                  weight_decay: float = 0.1, n_random_unused: int = 100, zipf: float = 1.0,
                  uniform: float = 0.25) -> TrainedLM:
    """Train a 1-layer Qwen3 LM and save it (safetensors, config, tokenizer files) into ``out``.

    Never used: the added tokens after ``<|im_end|>`` (``<think>``, ``</think>``, ``<tool_call>``, ...),
    the invalid-UTF-8 byte tokens and ``n_random_unused`` random ordinary ids. Everything else is drawn
    with Zipf-like frequencies (``zipf`` exponent) mixed with a ``uniform`` share, so that some used
    tokens are rare but each occurs.
    """
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    write_reduced(qwen3_tokenizer_dir(), out, keep=keep)
    tok = load_tokenizer(out)
    n_tok = len(tok)
    never = set(range(keep + 3, n_tok)) | set(byte_invalid_ids(tok))
    pool = torch.tensor(sorted(set(range(keep)) - never))
    extra = pool[torch.randperm(len(pool), generator=gen)[:n_random_unused]].tolist()
    unused = sorted(never | set(extra))
    used = torch.tensor(sorted(set(range(n_tok)) - set(unused)))
    rows = (n_tok + 127) // 128 * 128  # padded like real Qwen checkpoints: rows past the tokenizer
    cfg = Qwen3Config(vocab_size=rows, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      tie_word_embeddings=tied, max_position_embeddings=seq + 1,
                      eos_token_id=keep + 2, bos_token_id=keep, pad_token_id=None)
    model = Qwen3ForCausalLM(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread is fastest, and the cores are shared
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    # Zipf-like frequencies (p ~ 1 / (rank + 10)); the rank follows the id with jitter, as BPE ids roughly
    # follow merge order, i.e. frequency (the byte alphabet and short pieces first, added tokens last)
    jitter = torch.rand(len(used), generator=gen) * 500
    ranked = used[torch.argsort(used.double() + jitter)]
    probs = 1.0 / (torch.arange(len(ranked), dtype=torch.float64) + 10.0) ** zipf
    probs = (1 - uniform) * probs / probs.sum() + uniform / len(ranked)  # every used id occurs
    counts = torch.zeros(rows, dtype=torch.long)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        ids = ranked[torch.multinomial(probs, batch * (seq + 1), replacement=True, generator=gen)]
        ids = ids.reshape(batch, seq + 1)
        counts += torch.bincount(ids.flatten(), minlength=rows)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.set_num_threads(threads)
    model.save_pretrained(out)
    final = float(loss.detach())
    # ground truth from what the stream really contained (a rare id may never have been drawn)
    seen = counts[:n_tok] > 0
    unused = torch.nonzero(~seen).flatten().tolist()
    used_ids = torch.nonzero(seen).flatten().tolist()
    (out / "vlforge_fixture.json").write_text(json.dumps({"unused": unused, "final_loss": final}))
    return TrainedLM(path=out, unused=unused, used=used_ids, tokenizer_len=n_tok, vocab_rows=rows,
                     final_loss=final, seconds=time.perf_counter() - t0, counts=counts[:n_tok].tolist())
