"""A torchvision-free video processor for Qwen-VL-family models: already-decoded frames -> patches.

transformers 5.23 ships its video processors only for the torchvision backend. This class takes
frames that were decoded elsewhere (``vlforge.data`` decodes with PyAV) and applies the family's
resize and patch rules with numpy and Pillow. It does not open files and does not sample frames:
the frames it receives are the frames the model sees (their count is padded up to a multiple of
``temporal_patch_size`` by repeating the last frame).

Two resize rules exist (both :func:`vlforge.media.resize.smart_resize`, as transformers computes them):
- ``"per_frame"`` (Qwen2-VL, Qwen2.5-VL): rule ``image``: each frame is resized so its pixel count lies in
  ``[size.shortest_edge, size.longest_edge]`` with sides divisible by ``patch_size * merge_size``.
- ``"video"`` (Qwen3-VL, GLM-4V): rule ``video``: the pixel bounds apply to ``frames * height * width``
  (a clip shorter than ``temporal_patch_size`` counts as that many frames; transformers refuses it).

Files name only stock classes: the per-family subclasses save themselves under the torchvision class
they stand in for (``Qwen2VLVideoProcessor``, ``Qwen3VLVideoProcessor``, ``Glm4vVideoProcessor``) with only
the keys that class understands (``resize_rule`` is implied by the class), so stock transformers reads the files
(and vLLM's CPU build, docs/models.md); :mod:`vlforge.models.compat` maps those names back to these classes at load time
when torchvision is missing.

Example (CPU, milliseconds):
    >>> import numpy as np
    >>> from vlforge.models.frames_video import FramesVideoProcessor
    >>> vp = FramesVideoProcessor(patch_size=16, size={"shortest_edge": 1024, "longest_edge": 65536})
    >>> out = vp(np.zeros((4, 64, 64, 3), dtype=np.uint8), fps=2.0)
    >>> out["video_grid_thw"].tolist()
    [[2, 4, 4]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from PIL import Image
from transformers.feature_extraction_utils import BatchFeature
from transformers.processing_utils import VideosKwargs
from transformers.video_utils import VideoMetadata

from vlforge.media.resize import smart_resize
from vlforge.models.families import CLIP_MEAN, CLIP_STD, FAMILIES, Family


def _video_processor_base() -> type:
    """The base class of vlforge's frames video processor: transformers' torchvision-free
    ``VideoProcessorMixin`` (transformers >= 5.19). Before 5.19 the only base is ``BaseVideoProcessor``, a
    ``TorchvisionBackend``: vlforge's processor replaces its processing methods, and this subclass skips the
    backend's ``__init__`` (which writes every option onto the instance), as ``VideoProcessorMixin`` does."""
    from transformers import video_processing_utils
    from transformers.image_processing_utils import BaseImageProcessor

    if hasattr(video_processing_utils, "VideoProcessorMixin"):
        return video_processing_utils.VideoProcessorMixin

    class VideoProcessorBase(video_processing_utils.BaseVideoProcessor):
        def __init__(self, **kwargs: Any) -> None:
            BaseImageProcessor.__init__(self, **kwargs)

    return VideoProcessorBase


class FramesVideoKwargs(VideosKwargs, total=False):
    """Options of :class:`FramesVideoProcessor` on top of transformers' ``VideosKwargs``."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    resize_rule: str
    min_frames: int
    max_frames: int


def _frames_of(video: Any) -> list[np.ndarray]:
    """One video as a list of HxWx3 uint8 arrays (accepts PIL frames, a THWC/TCHW array or a list)."""
    if isinstance(video, (str, bytes)) or hasattr(video, "read"):
        raise ValueError(
            "FramesVideoProcessor takes decoded frames, not files: decode the video first (vlforge.data)"
        )
    if hasattr(video, "detach"):  # torch tensor
        video = video.detach().cpu().numpy()
    if isinstance(video, np.ndarray):
        if video.ndim != 4:
            raise ValueError(f"a video array must be 4-D (T,H,W,C or T,C,H,W), got shape {video.shape}")
        frames = list(video)
    elif isinstance(video, Sequence) and len(video) > 0:
        frames = list(video)
    else:
        raise ValueError(f"cannot read a video from {type(video).__name__}")
    out = []
    for frame in frames:
        if isinstance(frame, Image.Image):
            array = np.asarray(frame.convert("RGB"))
        else:
            array = np.asarray(frame)
            if array.ndim != 3:
                raise ValueError(f"a video frame must be 3-D, got shape {array.shape}")
            if array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
                array = array.transpose(1, 2, 0)
            if array.shape[-1] == 1:
                array = np.repeat(array, 3, axis=-1)
            if array.dtype != np.uint8:
                array = np.clip(array * (255.0 if array.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
        out.append(array)
    return out


def _is_single_video(videos: Any) -> bool:
    if isinstance(videos, np.ndarray) or hasattr(videos, "detach"):
        return videos.ndim == 4
    if isinstance(videos, Sequence) and videos:
        first = videos[0]
        if isinstance(first, Image.Image):
            return True
        return (isinstance(first, np.ndarray) or hasattr(first, "detach")) and first.ndim == 3
    return False


class FramesVideoProcessor(_video_processor_base()):  # type: ignore[misc]
    """Video processor working on decoded frames with numpy/Pillow (no torchvision).

    Produces ``pixel_values_videos`` (rows of ``3 * temporal_patch_size * patch_size**2`` values in
    Qwen's patch order), ``video_grid_thw`` and, with ``return_metadata=True``, ``video_metadata``.
    """

    valid_kwargs = FramesVideoKwargs
    model_input_names: ClassVar[list[str]] = ["pixel_values_videos", "video_grid_thw"]

    do_resize = True
    do_rescale = True
    do_normalize = True
    do_convert_rgb = True
    rescale_factor = 1 / 255
    image_mean = CLIP_MEAN
    image_std = CLIP_STD
    resample = 3  # PIL bicubic
    size: ClassVar[dict[str, int]] = {"shortest_edge": 128 * 28 * 28, "longest_edge": 768 * 28 * 28}
    patch_size = 14
    temporal_patch_size = 2
    merge_size = 2
    resize_rule = "per_frame"
    fps = 2.0
    min_frames = 4
    max_frames = 768
    do_sample_frames = False
    return_metadata = False
    stock_name: ClassVar[str | None] = None
    """The transformers (torchvision) class this one stands in for; written to disk instead of our name."""
    vlforge_only_keys: ClassVar[tuple[str, ...]] = ("resize_rule",)
    """Settings the stock class does not know; left out of saved files (the class implies them)."""

    def __init__(self, **kwargs: Any) -> None:
        for key in ("_valid_kwargs_names", "_valid_processor_keys", "video_processor_type", "image_processor_type"):
            kwargs.pop(key, None)
        # Older Qwen configs give the pixel limits as min_pixels / max_pixels.
        min_pixels, max_pixels = kwargs.pop("min_pixels", None), kwargs.pop("max_pixels", None)
        if min_pixels is not None or max_pixels is not None:
            size = dict(kwargs.get("size") or self.size)
            size["shortest_edge"] = min_pixels if min_pixels is not None else size["shortest_edge"]
            size["longest_edge"] = max_pixels if max_pixels is not None else size["longest_edge"]
            kwargs["size"] = size
        rule = kwargs.get("resize_rule")
        if self.stock_name is not None and rule is not None and rule != type(self).resize_rule:
            raise ValueError(
                f"{type(self).__name__} implies resize_rule {type(self).resize_rule!r}, got {rule!r}; "
                "use FramesVideoProcessor for another rule"
            )
        super().__init__(**kwargs)
        if self.resize_rule not in ("per_frame", "video"):
            raise ValueError(f"resize_rule must be 'per_frame' or 'video', got {self.resize_rule!r}")

    def to_dict(self) -> dict[str, Any]:
        """Every setting (class defaults included), so the saved file is self-describing.

        A per-family subclass answers its stock class name and only the keys that class understands.
        """
        out = {key: getattr(self, key) for key in FramesVideoKwargs.__annotations__ if hasattr(self, key)}
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items() if v is not None}
        out.update({k: v for k, v in self.__dict__.items() if not k.startswith("_")})
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}
        out.pop("image_processor_type", None)
        if self.stock_name is None:
            out["video_processor_type"] = type(self).__name__
            return out
        for key in self.vlforge_only_keys:
            out.pop(key, None)
        out["video_processor_type"] = self.stock_name
        return out

    def get_num_of_video_patches(self, num_frames: int, height: int, width: int, videos_kwargs=None) -> int:
        """Number of patches (before merging) for a video of that shape."""
        kw = videos_kwargs or {}
        patch = kw.get("patch_size", self.patch_size)
        merge = kw.get("merge_size", self.merge_size)
        tps = kw.get("temporal_patch_size", self.temporal_patch_size)
        h, w = self._target(num_frames, height, width, patch * merge, tps)
        return math.ceil(num_frames / tps) * (h // patch) * (w // patch)

    def _target(
        self, num_frames: int, height: int, width: int, factor: int, tps: int, size: Any = None
    ) -> tuple[int, int]:
        size = dict(self.size if size is None else size)
        video = self.resize_rule == "video"
        return smart_resize(
            height,
            width,
            factor=factor,
            min_pixels=size["shortest_edge"],
            max_pixels=size["longest_edge"],
            rule="video" if video else "image",
            num_frames=max(num_frames, tps) if video else 1,
            temporal_factor=tps,
        )

    def _options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Call-time options over the instance's settings; unknown or unsupported ones are errors."""
        if kwargs.pop("do_sample_frames", None) or kwargs.pop("num_frames", None):
            raise ValueError(
                "FramesVideoProcessor does not sample frames: pass the frames to use (vlforge.data samples them)"
            )
        for ignored in ("device", "input_data_format", "data_format", "do_convert_rgb", "min_frames", "max_frames"):
            kwargs.pop(ignored, None)
        names = ("fps", "patch_size", "merge_size", "temporal_patch_size", "size", "do_resize", "resample",
                 "do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std", "return_metadata")
        options = {name: kwargs.pop(name, None) for name in names}
        options = {name: getattr(self, name) if value is None else value for name, value in options.items()}
        options["return_tensors"] = kwargs.pop("return_tensors", None)
        options["video_metadata"] = kwargs.pop("video_metadata", None)
        if kwargs:
            raise ValueError(f"FramesVideoProcessor got unsupported options: {', '.join(sorted(kwargs))}")
        return options

    def preprocess(self, videos: Any, **kwargs: Any) -> BatchFeature:
        """Frames -> ``pixel_values_videos``, ``video_grid_thw`` (and ``video_metadata``)."""
        opt = self._options(dict(kwargs))
        fps, patch, merge, tps = opt["fps"], opt["patch_size"], opt["merge_size"], opt["temporal_patch_size"]
        metadata = opt["video_metadata"]
        batch = [videos] if _is_single_video(videos) else list(videos)
        if metadata is not None and not isinstance(metadata, (list, tuple)):
            metadata = [metadata]
        pixel_rows, grids, metas = [], [], []
        mean = np.asarray(opt["image_mean"], dtype=np.float32).reshape(1, 3, 1, 1)
        std = np.asarray(opt["image_std"], dtype=np.float32).reshape(1, 3, 1, 1)
        for index, video in enumerate(batch):
            frames = _frames_of(video)
            count = len(frames)
            height, width = frames[0].shape[:2]
            h, w = (height, width)
            if opt["do_resize"]:
                h, w = self._target(count, height, width, patch * merge, tps, opt["size"])
            if h % (patch * merge) or w % (patch * merge):
                raise ValueError(f"frame size {h}x{w} is not a multiple of {patch * merge}")
            resample = Image.Resampling(int(opt["resample"]))
            resized = [np.asarray(Image.fromarray(f).resize((w, h), resample=resample)) if f.shape[:2] != (h, w)
                       else f for f in frames]
            while len(resized) % tps:
                resized.append(resized[-1])
            array = np.stack(resized).astype(np.float32).transpose(0, 3, 1, 2)  # T, C, H, W
            if opt["do_rescale"]:
                array = array * opt["rescale_factor"]
            if opt["do_normalize"]:
                array = (array - mean) / std
            grid_t, grid_h, grid_w = array.shape[0] // tps, h // patch, w // patch
            array = array.reshape(grid_t, tps, 3, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
            array = array.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
            pixel_rows.append(array.reshape(grid_t * grid_h * grid_w, 3 * tps * patch * patch))
            grids.append([grid_t, grid_h, grid_w])
            meta = metadata[index] if metadata is not None and index < len(metadata) else None
            if isinstance(meta, dict):
                meta = VideoMetadata(**meta)
            if meta is None:
                meta = VideoMetadata(total_num_frames=count, fps=fps, frames_indices=list(range(count)))
            if meta.frames_indices is None:
                meta.frames_indices = list(range(count))
            if meta.fps is None:
                meta.fps = fps
            metas.append(meta)
        data: dict[str, Any] = {
            "pixel_values_videos": np.concatenate(pixel_rows, axis=0),
            "video_grid_thw": np.asarray(grids, dtype=np.int64),
        }
        feature = BatchFeature(data=data, tensor_type=opt["return_tensors"])
        if opt["return_metadata"]:
            feature["video_metadata"] = metas
        return feature

    def __call__(self, videos: Any, **kwargs: Any) -> BatchFeature:
        return self.preprocess(videos, **kwargs)


def _standin(record: Family) -> type[FramesVideoProcessor]:
    """The frames processor that stands in for ``record``'s stock video processor, with its released defaults."""
    settings = record.video_processor
    attrs: dict[str, Any] = {
        "__module__": __name__,
        "__doc__": f"{record.title} video frames without torchvision (saved as {record.stock_video_processor}).",
        "stock_name": record.stock_video_processor,
        "resize_rule": record.video_resize_rule,
        "patch_size": settings["patch_size"],
        "temporal_patch_size": settings["temporal_patch_size"],
        "merge_size": settings["merge_size"],
        "image_mean": tuple(settings["image_mean"]),
        "image_std": tuple(settings["image_std"]),
        "size": dict(settings["size"]),
        "fps": settings.get("fps", FramesVideoProcessor.fps),
    }
    if "min_frames" not in settings:  # the stock class counts num_frames: the frame bounds stay vlforge's
        attrs["vlforge_only_keys"] = ("resize_rule", "min_frames", "max_frames")
    return type(record.video_standin, (FramesVideoProcessor,), attrs)


def _standins() -> dict[str, type[FramesVideoProcessor]]:
    out: dict[str, type[FramesVideoProcessor]] = {}
    for record in FAMILIES.values():
        made = _standin(record)
        if record.stock_video_processor in out:
            first = out[record.stock_video_processor]
            if first.to_dict(first()) != made.to_dict(made()):
                raise AssertionError(f"families sharing {record.stock_video_processor} disagree on its defaults")
            continue
        out[record.stock_video_processor] = made
        globals()[made.__name__] = made  # importable (and picklable) by name
    return out


#: Per-family classes by the stock name they are saved under (one class per name), made from the family records.
STOCK_STANDINS: dict[str, type[FramesVideoProcessor]] = _standins()
