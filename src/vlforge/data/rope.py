"""3-D rotary (mrope) position ids computed by the model family's own ``get_rope_index``.

transformers 5.23 keeps ``get_rope_index`` on the ``*VLModel`` classes; it reads only
``config.vision_config`` (``spatial_merge_size``, and ``tokens_per_second`` for Qwen2.5-VL) and the
stateless ``get_vision_position_ids``. We call it on a small stand-in object, so no model instance is
needed and the positions are exactly what the model would compute.

Example:
    >>> import torch
    >>> ids = torch.tensor([1, 2, 151655, 151655, 151655, 151655, 3])
    >>> types = (ids == 151655).int()
    >>> mrope_position_ids("qwen3_vl", ids, types, image_grid_thw=torch.tensor([[1, 4, 4]]),
    ...                    spatial_merge_size=2)[:, :].tolist()
    [[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]]
"""

from __future__ import annotations

import functools
import importlib
from types import SimpleNamespace

import torch

from vlforge.models.families import family, supports


@functools.cache
def _model_class(name: str) -> type:
    """The family's inner ``*Model`` class (it owns ``get_rope_index``)."""
    record = family(name)
    return getattr(importlib.import_module(record.modeling_module), record.inner_model_class)


def mrope_position_ids(family: str, input_ids: torch.Tensor, mm_token_type_ids: torch.Tensor, *,
                       image_grid_thw: torch.Tensor | None = None, video_grid_thw: torch.Tensor | None = None,
                       second_per_grid_ts: torch.Tensor | None = None, spatial_merge_size: int = 2,
                       tokens_per_second: float = 2.0) -> torch.Tensor:
    """(3, L) positions for one unpadded sample (``input_ids`` and ``mm_token_type_ids`` of shape (L,))."""
    cls = _model_class(family)
    # an integral scale as an int, as checkpoints give it: transformers < 5.19 builds the temporal positions with
    # it and then meets integer positions in one meshgrid (which refuses mixed dtypes)
    if float(tokens_per_second).is_integer():
        tokens_per_second = int(tokens_per_second)
    vision_config = SimpleNamespace(spatial_merge_size=spatial_merge_size, tokens_per_second=tokens_per_second)
    stand_in = SimpleNamespace(
        config=SimpleNamespace(vision_config=vision_config),
        get_vision_position_ids=functools.partial(cls.get_vision_position_ids, None),
    )
    kwargs = {}
    if supports(family, "rope_uses_seconds_per_grid") and second_per_grid_ts is not None:
        kwargs["second_per_grid_ts"] = second_per_grid_ts
    positions, _ = cls.get_rope_index(
        stand_in, input_ids[None], mm_token_type_ids=mm_token_type_ids[None],
        image_grid_thw=None if image_grid_thw is None else image_grid_thw.clone(),
        video_grid_thw=None if video_grid_thw is None else video_grid_thw.clone(), **kwargs)
    return positions[:, 0]
