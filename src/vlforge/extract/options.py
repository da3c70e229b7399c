"""Typed options of a feature extraction run and the part of them that fixes the cache's contents.

Example:
    >>> opts = ExtractOptions(model="tiny:qwen3_vl", data="examples/data/dataset.yaml", out="/tmp/cache",
    ...                       features=["vision_pooled", "hidden_mean"], layers=[-1, 1])
    >>> opts.needs_language_model, opts.shard_size
    (True, 256)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from vlforge.errors import did_you_mean
from vlforge.strict import StrictModel

#: What can be stored, per sample (see docs/extract.md for the shapes).
FEATURES = {
    "vision_tokens": "vision-tower output per merged token (what enters the LLM), images then videos",
    "vision_pooled": "vision-tower output mean-pooled per image / video",
    "deepstack": "Qwen3-VL deepstack features per merged token, one per deepstack layer",
    "hidden_mean": "LLM hidden state mean-pooled over the sample's tokens, at each of --layers",
    "hidden_last": "LLM hidden state of the sample's last token, at each of --layers",
}
VISION_FEATURES = ("vision_tokens", "vision_pooled", "deepstack")
HIDDEN_FEATURES = ("hidden_mean", "hidden_last")
#: Stored keys whose first dimension varies per sample (concatenated in a shard, with offsets).
RAGGED = ("vision_tokens", "vision_pooled", "deepstack", "vision_items")


class ExtractOptions(StrictModel):
    """Everything ``vlforge extract`` needs; fields marked "cache" must match to resume a cache."""

    unknown_label: ClassVar[str] = "option"

    model: str = Field(description="checkpoint dir, tiny:FAMILY preset or hub id")
    data: str = Field(description="dataset file (jsonl/json/parquet/arrow), dataset YAML or data config YAML")
    out: Path = Field(description="cache directory")
    features: list[str] = Field(default_factory=lambda: ["vision_pooled", "hidden_mean"],
                                description="cache: what to store, see FEATURES")
    layers: list[int] = Field(default_factory=lambda: [-1],
                              description="cache: hidden_states indices for hidden_* (0 embeddings, -1 last, post-norm)")
    dtype: str = Field("float32", description="cache: model dtype (float32, bfloat16, float16)")
    batch_size: int = Field(8, gt=0, description="cache: samples per forward (changes numerics, so it is fixed)")
    shard_size: int = Field(256, gt=0, description="cache: samples (of the global order) per shard")
    format: Literal["safetensors", "parquet"] = Field("safetensors", description="cache: shard file format")
    attn_implementation: str | None = Field(None, description="cache: attention implementation (default: model's)")
    id_field: str = Field("id", description="cache: record key used as sample id when present ('' = never)")
    on_error: Literal["raise", "skip"] = Field("skip", description="bad samples: stop, or skip into errors.jsonl")
    max_skip_fraction: float = Field(0.1, ge=0.0, le=1.0, description="stop with an error (exit 2) when the cache's "
                                     "skipped share is above this (0: none may be skipped, 1: never stop)")
    weights_hash: Literal["full", "header"] = Field(
        "full", description="hash every weight file's bytes, or only their safetensors headers and sizes")
    num_workers: int = Field(0, ge=0, description="DataLoader workers preprocessing while the model runs")
    device: str = Field("auto", description="auto (cuda:LOCAL_RANK when available, else cpu), cpu, cuda, ...")
    overwrite: bool = Field(False, description="replace a cache made with another model or other options")
    token_audit: bool = Field(True, description="audit the chat template's special tokens at start-up")

    @field_validator("features")
    @classmethod
    def _features(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError(f"choose at least one feature of {sorted(FEATURES)}")
        for name in value:
            if name not in FEATURES:
                raise ValueError(f"unknown feature {name!r}{did_you_mean(name, FEATURES)} "
                                 f"(choose from {', '.join(FEATURES)})")
        return sorted(set(value), key=list(FEATURES).index)

    @field_validator("layers")
    @classmethod
    def _layers(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("layers needs at least one index")
        if len(set(value)) != len(value):
            raise ValueError(f"layers has duplicates: {value}")
        return value

    @property
    def needs_language_model(self) -> bool:
        return any(f in HIDDEN_FEATURES for f in self.features)

    @property
    def needs_hidden_states(self) -> bool:
        """True when a layer other than the final (post-norm) output is asked for."""
        return self.needs_language_model and self.layers != [-1]

    def cache_options(self) -> dict[str, Any]:
        """The options that determine the cache's bytes (compared on resume)."""
        keys = ("features", "layers", "dtype", "batch_size", "shard_size", "format", "attn_implementation",
                "id_field")
        return {k: getattr(self, k) for k in keys}
