"""Find and stream the embedding matrices of a safetensors checkpoint, one chunk of rows at a time.

Only the two matrices the token audit needs are touched, through ``safetensors.safe_open`` slices, so a
bf16 checkpoint is never turned into an fp32 copy of the model: each chunk is converted to fp32 on its own.

Example:
    >>> from vlforge.vocab.weights import open_embeddings
    >>> emb = open_embeddings("/path/to/checkpoint")            # doctest: +SKIP
    >>> emb.tied, emb.output.name, emb.output.shape               # doctest: +SKIP
    (False, 'lm_head.weight', (151936, 2048))
    >>> for start, rows in emb.output.chunks(8192): ...           # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from vlforge.errors import ModelLoadError

log = logging.getLogger(__name__)

DEFAULT_CHUNK_ROWS = 8192

# Preferred names first; any other key ending in the same suffix is accepted as a fallback.
INPUT_NAMES = (
    "model.language_model.embed_tokens.weight",  # Qwen2-VL / Qwen2.5-VL / Qwen3-VL / GLM-4V (transformers 5)
    "model.embed_tokens.weight",  # text-only Qwen2 / Qwen3 / Llama
    "language_model.model.embed_tokens.weight",  # older VLM layouts
    "model.text_model.embed_tokens.weight",
    "transformer.wte.weight",
    "transformer.embedding.word_embeddings.weight",  # ChatGLM
)
OUTPUT_NAMES = (
    "lm_head.weight",
    "language_model.lm_head.weight",
    "model.lm_head.weight",
    "transformer.output_layer.weight",
)
INPUT_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")
OUTPUT_SUFFIXES = ("lm_head.weight", "output_layer.weight")


@dataclass
class MatrixSource:
    """One 2-D tensor inside a safetensors file, read in row chunks converted to fp32.

    Matrices whose fp32 copy is at most ``cache_bytes`` are read once and kept; larger ones are streamed
    from the file on every pass (never converted as a whole).
    """

    file: Path
    name: str
    shape: tuple[int, int]
    dtype: str
    cache_bytes: int = 256 * 2**20
    _cache: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def _cached(self) -> torch.Tensor | None:
        if self._cache is None and self.shape[0] * self.shape[1] * 4 <= self.cache_bytes:
            with safe_open(str(self.file), framework="pt") as handle:
                self._cache = handle.get_tensor(self.name).to(torch.float32)
        return self._cache

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` as an fp32 tensor."""
        cached = self._cached()
        if cached is not None:
            return cached[start:stop]
        with safe_open(str(self.file), framework="pt") as handle:
            return handle.get_slice(self.name)[start:stop].to(torch.float32)

    def chunks(self, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield ``(start, fp32 rows)`` for consecutive chunks of at most ``chunk_rows`` rows."""
        cached = self._cached()
        if cached is not None:
            for start in range(0, self.shape[0], chunk_rows):
                yield start, cached[start:start + chunk_rows]
            return
        with safe_open(str(self.file), framework="pt") as handle:
            sliced = handle.get_slice(self.name)
            for start in range(0, self.shape[0], chunk_rows):
                stop = min(start + chunk_rows, self.shape[0])
                yield start, sliced[start:stop].to(torch.float32)

    def take(self, ids: list[int] | torch.Tensor, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> torch.Tensor:
        """The fp32 rows at ``ids`` (any order, duplicates allowed), read chunk by chunk."""
        index = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        out = torch.empty(len(index), self.shape[1], dtype=torch.float32)
        if len(index) == 0:
            return out
        for start, rows in self.chunks(chunk_rows):
            mask = (index >= start) & (index < start + rows.shape[0])
            if mask.any():
                out[mask] = rows[index[mask] - start]
        return out


@dataclass(frozen=True)
class Embeddings:
    """The input embedding and the output (unembedding) matrix of a checkpoint."""

    root: Path
    input: MatrixSource
    output: MatrixSource
    tied: bool
    config: dict
    tied_copy: MatrixSource | None = None  # an output tensor saved although the config ties it

    @property
    def vocab_rows(self) -> int:
        return self.output.shape[0]


def _weight_map(root: Path) -> dict[str, Path]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            mapping = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as error:
            raise ModelLoadError(f"{index}: not a safetensors index ({error})") from error
        return {name: root / fname for name, fname in mapping.items()}
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{root}: no *.safetensors weights (the token audit reads safetensors only)")
    mapping: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not mappings
                mapping[name] = file
    return mapping


def _pick(mapping: dict[str, Path], names: tuple[str, ...], suffixes: tuple[str, ...]) -> str | None:
    for name in names:
        if name in mapping:
            return name
    candidates = sorted(k for k in mapping if k.endswith(suffixes) and "visual" not in k and "vision" not in k)
    return candidates[0] if candidates else None


def read_config(root: Path) -> dict:
    """``config.json`` of ``root`` as a dict ({} when absent)."""
    path = root / "config.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as error:
        raise ModelLoadError(f"{path}: invalid JSON ({error})") from error


def config_tied(config: dict) -> bool | None:
    """``tie_word_embeddings`` from the top level or ``text_config`` (None when neither says)."""
    if "tie_word_embeddings" in config:
        return bool(config["tie_word_embeddings"])
    text = config.get("text_config") or {}
    if isinstance(text, dict) and "tie_word_embeddings" in text:
        return bool(text["tie_word_embeddings"])
    return None


def _source(mapping: dict[str, Path], name: str, cache_bytes: int) -> MatrixSource:
    with safe_open(str(mapping[name]), framework="pt") as handle:
        sliced = handle.get_slice(name)
        shape = tuple(sliced.get_shape())
        dtype = str(sliced.get_dtype())
    if len(shape) != 2:
        raise ModelLoadError(f"{mapping[name]}: tensor {name!r} has shape {shape}, expected 2-D")
    return MatrixSource(file=mapping[name], name=name, shape=(int(shape[0]), int(shape[1])), dtype=dtype,
                        cache_bytes=cache_bytes)


def open_embeddings(model_dir: str | Path, *, cache_bytes: int = 256 * 2**20) -> Embeddings:
    """Locate the input and output embedding tensors of the checkpoint in ``model_dir``.

    Tied models (config ``tie_word_embeddings`` true, or no output tensor saved) get the input matrix as
    their output matrix. Matrices up to ``cache_bytes`` in fp32 are read once; larger ones are streamed.
    """
    root = Path(model_dir)
    if not root.is_dir():
        raise ModelLoadError(f"{root}: not a checkpoint directory")
    config = read_config(root)
    mapping = _weight_map(root)
    in_name = _pick(mapping, INPUT_NAMES, INPUT_SUFFIXES)
    if in_name is None:
        raise ModelLoadError(f"{root}: no input embedding tensor (looked for {', '.join(INPUT_NAMES[:2])}, ...)")
    out_name = _pick(mapping, OUTPUT_NAMES, OUTPUT_SUFFIXES)
    tied = config_tied(config)
    if tied is None:
        tied = out_name is None
    if out_name is None and not tied:
        raise ModelLoadError(f"{root}: config says untied embeddings but no lm_head tensor is saved")
    input_src = _source(mapping, in_name, cache_bytes)
    output_src = input_src if tied else _source(mapping, out_name, cache_bytes)  # type: ignore[arg-type]
    tied_copy = _source(mapping, out_name, cache_bytes) if tied and out_name is not None else None
    if input_src.shape != output_src.shape:
        raise ModelLoadError(
            f"{root}: {in_name} {input_src.shape} and {output_src.name} {output_src.shape} differ in shape"
        )
    log.debug("embeddings: input=%s output=%s tied=%s shape=%s dtype=%s",
              in_name, output_src.name, tied, input_src.shape, input_src.dtype)
    return Embeddings(root=root, input=input_src, output=output_src, tied=tied, config=config, tied_copy=tied_copy)
