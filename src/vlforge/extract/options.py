"""Typed options of a feature extraction run and the part of them that fixes the cache's contents.

Example:
    >>> opts = ExtractOptions(model="tiny:qwen3_vl", data="examples/data/dataset.yaml", out="/tmp/cache",
    ...                       features=["vision_pooled", "hidden_mean"], layers=[-1, 1])
    >>> opts.needs_language_model, opts.shard_size
    (True, 256)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from vlforge.errors import did_you_mean
from vlforge.flags import Flag
from vlforge.models.refs import dtype_name
from vlforge.strict import StrictModel, field_error

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
    """Everything ``vlforge extract`` needs; the fields of :meth:`cache_options` must match to resume a cache."""

    unknown_label: ClassVar[str] = "option"

    model: Annotated[str, Flag("--model", "-m")]
    """Checkpoint dir, preset (tiny:qwen3_vl, real:qwen3_vl_2b) or hub id."""
    data: str
    """Dataset file (.jsonl/.json/.parquet/.arrow), dataset YAML or data config."""
    out: Path
    """Cache directory (created; resumed when it holds the same run)."""
    features: Annotated[list[str], Flag(split=str)] = Field(default_factory=lambda: ["vision_pooled", "hidden_mean"])
    """Comma-separated: vision_tokens, vision_pooled, deepstack, hidden_mean, hidden_last (fixed for a cache)."""
    layers: Annotated[list[int], Flag(split=int)] = Field(default_factory=lambda: [-1])
    """hidden_states indices for hidden_*: 0 embeddings, -1 last (post-norm) (fixed for a cache)."""
    dtype: str = "float32"
    """float32, bfloat16 or float16 (or fp32, bf16, fp16; fixed for a cache)."""
    batch_size: int = Field(8, gt=0)
    """Samples per forward (fixed for a cache: it changes numerics)."""
    shard_size: int = Field(256, gt=0)
    """Samples of the global order per shard (fixed for a cache)."""
    format: Literal["safetensors", "parquet"] = "safetensors"
    """Shard file format: safetensors or parquet (fixed for a cache)."""
    num_workers: int = Field(0, ge=0)
    """DataLoader workers preprocessing while the model runs."""
    on_error: Literal["raise", "skip"] = "skip"
    """Bad samples: skip (into errors.jsonl) or raise."""
    max_skip_fraction: float = Field(0.1, ge=0.0, le=1.0)
    """Exit 2 when more than this share of the samples is skipped (0 none, 1 never)."""
    attn_implementation: Annotated[str | None, Flag("--attn")] = None
    """Attention implementation (default: the model's; fixed for a cache)."""
    id_field: str = "id"
    """Record key used as sample id when present ('' = never; fixed for a cache)."""
    weights_hash: Literal["full", "header"] = "full"
    """full (hash weight bytes) or header (headers + sizes)."""
    device: str = "auto"
    """auto (cuda:LOCAL_RANK when available, else cpu), cpu, cuda, ..."""
    overwrite: bool = False
    """Replace a cache of another model/options."""
    token_audit: Annotated[bool, Flag(negatable=True)] = True
    """Audit the chat template's special tokens at start-up (a few seconds)."""

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

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        return dtype_name(value)  # canonical (bf16 and bfloat16 are one cache); unknown or auto refused here

    @model_validator(mode="after")
    def _layers_need_hidden_features(self) -> ExtractOptions:
        if "layers" in self.model_fields_set and self.layers != [-1] and not self.needs_language_model:
            raise field_error("layers", f"{','.join(map(str, self.layers))} picks the hidden states of "
                                        f"{' and '.join(HIDDEN_FEATURES)}: add one to --features, or leave --layers "
                                        "out")
        return self

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
