"""One batched forward -> the requested features of every sample in it.

The vision tower runs once per batch (``model.model.get_image_features`` / ``get_video_features``: merged
tokens split per image / video, plus Qwen3-VL's deepstack features); when hidden states are wanted its
outputs are handed to the language model as ``mm_encoder_outputs``, so nothing is computed twice and the
``lm_head`` never runs.

Per sample (``D`` the LLM hidden size, ``T`` its merged vision tokens, ``N`` its images + videos):

* ``vision_tokens`` (T, D), ``vision_pooled`` (N, D), ``deepstack`` (T, K, D) - images first, then videos;
* ``vision_items`` (N, 2) int64: kind (1 image, 2 video) and token count of each item;
* ``hidden_mean`` / ``hidden_last`` (len(layers), D).

Example:
    >>> extractor = FeatureExtractor(loaded.model, loaded.family, options, torch.device("cpu"))  # doctest: +SKIP
    >>> rows = extractor(chunk.batch, chunk.items)  # doctest: +SKIP
    >>> rows[0]["hidden_mean"].shape  # doctest: +SKIP
    torch.Size([1, 64])
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from vlforge.errors import ConfigError
from vlforge.extract.options import VISION_FEATURES, ExtractOptions
from vlforge.extract.preflight import check_layers
from vlforge.models.families import FAMILIES, names, supports


def stored_keys(features: list[str]) -> list[str]:
    """The tensor names a cache with these features holds per sample."""
    keys = list(features)
    if any(f in VISION_FEATURES for f in features):
        keys.append("vision_items")
    return keys


class FeatureExtractor:
    """Callable: ``(collated batch, [(images, videos)] per sample) -> [{key: tensor}]`` on CPU."""

    def __init__(self, model: Any, family: str, options: ExtractOptions, device: torch.device) -> None:
        inner = getattr(model, "model", None)
        if inner is None or not hasattr(inner, "get_image_features"):
            raise ConfigError(f"{type(model).__name__} has no .model.get_image_features; vlforge extract supports "
                              "Qwen2-VL, Qwen2.5-VL, Qwen3-VL(-MoE) and GLM-4V checkpoints")
        if "deepstack" in options.features and not supports(family, "deepstack"):
            raise ConfigError(f"--features deepstack: {family} has no deepstack features "
                              f"(only {', '.join(names(deepstack=True))})")
        self.inner, self.options, self.device = inner, options, device
        self.hidden_size = int(model.config.get_text_config().hidden_size)
        self.num_hidden = int(model.config.get_text_config().num_hidden_layers) + 1
        check_layers(options.layers, self.num_hidden)
        self.accepts = set(inspect.signature(inner.forward).parameters)
        self.dtype = next(model.parameters()).dtype
        record = FAMILIES.get(family)
        if record is not None and record.media.shared_placeholder:  # GLM-4V: images and videos in one batch
            from vlforge.models.media_mask import separate_video_placeholders

            separate_video_placeholders(model)

    @torch.no_grad()
    def __call__(self, batch: dict[str, Any], items: list[tuple[int, int]]) -> list[dict[str, torch.Tensor]]:
        opts, dev = self.options, self.device
        encoded: dict[str, Any] = {}
        per_item: list[torch.Tensor] = []  # (tokens, D) per image, then per video - in batch order
        deep_item: list[torch.Tensor] = []
        for kind, pixels, grid in (("image", "pixel_values", "image_grid_thw"),
                                   ("video", "pixel_values_videos", "video_grid_thw")):
            if pixels not in batch:
                continue
            fn = self.inner.get_image_features if kind == "image" else self.inner.get_video_features
            out = fn(batch[pixels].to(dev), batch[grid].to(dev), return_dict=True)
            encoded[kind] = out
            per_item.append(list(out.pooler_output))
            if "deepstack" in opts.features:
                layers = out.deepstack_features
                deep_item.append([torch.stack([layer[i] for layer in layers], dim=1) for i in range(len(layers[0]))])
        images = per_item[0] if "image" in encoded else []
        videos = per_item[-1] if "video" in encoded else []
        deep_images = deep_item[0] if deep_item and "image" in encoded else []
        deep_videos = deep_item[-1] if deep_item and "video" in encoded else []

        hidden = self._hidden(batch, encoded) if opts.needs_language_model else None
        rows: list[dict[str, torch.Tensor]] = []
        ci = cv = 0
        for b, (n_img, n_vid) in enumerate(items):
            mine = list(images[ci:ci + n_img]) + list(videos[cv:cv + n_vid])
            row: dict[str, torch.Tensor] = {}
            if any(f in VISION_FEATURES for f in opts.features):
                kinds = [1] * n_img + [2] * n_vid
                row["vision_items"] = torch.tensor([[k, t.shape[0]] for k, t in zip(kinds, mine, strict=True)],
                                                   dtype=torch.int64).reshape(-1, 2)
            if "vision_tokens" in opts.features:
                row["vision_tokens"] = self._cat(mine, (self.hidden_size,))
            if "vision_pooled" in opts.features:
                pooled = [t.float().mean(0).to(t.dtype) for t in mine]
                row["vision_pooled"] = torch.stack(pooled) if pooled else self._empty((self.hidden_size,))
            if "deepstack" in opts.features:
                deep = list(deep_images[ci:ci + n_img]) + list(deep_videos[cv:cv + n_vid])
                k = len(self.inner.visual.deepstack_visual_indexes)
                row["deepstack"] = self._cat(deep, (k, self.hidden_size))
            if hidden is not None:
                for name, value in hidden.items():
                    row[name] = value[b]
            rows.append({k: v.detach().to("cpu").contiguous() for k, v in row.items()})
            ci, cv = ci + n_img, cv + n_vid
        return rows

    def _hidden(self, batch: dict[str, Any], encoded: dict[str, Any]) -> dict[str, torch.Tensor]:
        opts, dev = self.options, self.device
        kwargs: dict[str, Any] = {"input_ids": batch["input_ids"].to(dev),
                                  "attention_mask": batch["attention_mask"].to(dev),
                                  "position_ids": batch["position_ids"].to(dev), "use_cache": False}
        for key in ("mm_token_type_ids", "image_grid_thw", "video_grid_thw", "second_per_grid_ts"):
            if key in batch and key in self.accepts:
                kwargs[key] = batch[key].to(dev)
        if encoded:
            kwargs["mm_encoder_outputs"] = dict(encoded)
        if opts.needs_hidden_states:
            kwargs["output_hidden_states"] = True
        out = self.inner(**kwargs)
        states = out.hidden_states if opts.needs_hidden_states else None
        picked = [out.last_hidden_state if states is None else states[layer] for layer in opts.layers]
        mask = batch["attention_mask"].to(dev).bool()
        lengths = mask.sum(1)
        result: dict[str, torch.Tensor] = {}
        if "hidden_mean" in opts.features:
            weights = mask.unsqueeze(-1).float()
            means = [((h.float() * weights).sum(1) / lengths.unsqueeze(-1)).to(h.dtype) for h in picked]
            result["hidden_mean"] = torch.stack(means, dim=1)
        if "hidden_last" in opts.features:
            rows = torch.arange(mask.shape[0], device=dev)
            result["hidden_last"] = torch.stack([h[rows, lengths - 1] for h in picked], dim=1)
        return result

    def _cat(self, parts: list[torch.Tensor], tail: tuple[int, ...]) -> torch.Tensor:
        return torch.cat(parts) if parts else self._empty(tail)

    def _empty(self, tail: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros((0, *tail), dtype=self.dtype)
