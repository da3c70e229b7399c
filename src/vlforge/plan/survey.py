"""What a dataset holds, from a seeded sample of its records processed as training would process them.

``vlforge init`` sizes a starter config from this: token lengths (text and media together, with the model's own
tokenizer and processor), the share of label and visual tokens, how many images and videos a record carries
and how large they are after the processor's resize. Records that cannot be used are counted per reason, and
the first one is kept as a one-line example.

Example (CPU, seconds):
    >>> from vlforge.config.schema import TrainConfig
    >>> cfg = TrainConfig(data={"dataset_path": "examples/data/train.jsonl"},
    ...                   model={"load_from_pretrained_path": "tiny:qwen3_vl"})
    >>> survey = survey_data(cfg, sample=16)  # doctest: +SKIP
    >>> survey.sampled, survey.with_images > 0, max(survey.lengths) < 1024  # doctest: +SKIP
    (12, True, True)
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from typing import Any

from vlforge.config.data import data_config
from vlforge.config.schema import TrainConfig
from vlforge.errors import DataError

logger = logging.getLogger(__name__)


@dataclass
class DataSurvey:
    """The sampled records' sizes (pixels after the processor's resize, at the limits the survey ran with)."""

    files: list[str]
    records: int
    """Records in the data (from file metadata)."""
    sampled: int = 0
    lengths: list[int] = field(default_factory=list)
    """Tokens of each usable sampled record."""
    label_tokens: int = 0
    visual_tokens: int = 0
    with_images: int = 0
    with_videos: int = 0
    most_images: int = 0
    """Images of the record that has the most."""
    largest_image: tuple[int, int] = (0, 0)
    """(height, width) in pixels of the largest sampled image, after resizing."""
    largest_frame: tuple[int, int] = (0, 0)
    """(height, width) in pixels of the largest sampled video frame, after resizing."""
    most_frames: int = 0
    """Frames taken from the longest sampled video."""
    videos: int = 0
    """Sampled videos (a record may hold several)."""
    frame_lists: int = 0
    """Sampled videos given as lists of frame images: read whole at their own ``sample_fps`` (``fps`` samples only
    video files), capped by ``video_max_frames``."""
    skipped: dict[str, int] = field(default_factory=dict)
    first_problem: str | None = None

    @property
    def usable(self) -> int:
        return len(self.lengths)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def median(self) -> int:
        return int(statistics.median(self.lengths)) if self.lengths else 0

    @property
    def longest(self) -> int:
        return max(self.lengths, default=0)

    @property
    def label_share(self) -> float:
        return self.label_tokens / self.tokens if self.tokens else 0.0

    @property
    def visual_share(self) -> float:
        return self.visual_tokens / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"files": self.files, "records": self.records, "sampled": self.sampled, "usable": self.usable,
                "tokens": {"median": self.median, "longest": self.longest, "shortest": min(self.lengths, default=0)},
                "label_share": round(self.label_share, 4), "visual_share": round(self.visual_share, 4),
                "records_with_images": self.with_images, "records_with_videos": self.with_videos,
                "most_images_per_record": self.most_images, "largest_image_hw": list(self.largest_image),
                "largest_video_frame_hw": list(self.largest_frame), "most_video_frames": self.most_frames,
                "videos": self.videos, "video_frame_lists": self.frame_lists,
                "skipped": dict(self.skipped), "first_problem": self.first_problem}


def _area(hw: tuple[int, int]) -> int:
    return hw[0] * hw[1]


def survey_data(cfg: TrainConfig, *, sample: int = 64, processor: Any = None) -> DataSurvey:
    """Sample ``sample`` records of ``cfg``'s training data and process them with ``processor`` (default: the
    data pipeline's processor for ``cfg``'s model, built from the checkpoint's tokenizer and image processor).
    A dataset none of whose sampled records is usable is a :class:`~vlforge.errors.DataError` naming the first
    problem."""
    from vlforge.data.config import resolve_entries
    from vlforge.data.errors import SampleError
    from vlforge.data.estimate import record_counts, sample_records
    from vlforge.data.schema import parse_conversation

    data_cfg = data_config(cfg)
    entries = resolve_entries(data_cfg, ".")
    if processor is None:
        processor = pipeline_processor(cfg, data_cfg)
    survey = DataSurvey([str(e.path) for e in entries], sum(record_counts(entries)))
    if survey.records == 0:
        raise DataError(f"{', '.join(survey.files)}: holds no records")
    patch = processor.settings.patch_size
    temporal = processor.settings.temporal_patch_size
    for entry, fmt, raw in sample_records(entries, sample, data_cfg.data_seed):
        survey.sampled += 1
        try:
            if raw.error is not None:
                raise raw.error
            conv = parse_conversation(raw.record, str(entry.path), raw.location, fmt)
            done = processor.process(conv, entry.data_folder, allow_path_escape=data_cfg.allow_path_escape or None)
        except SampleError as error:
            survey.skipped[error.reason] = survey.skipped.get(error.reason, 0) + 1
            survey.first_problem = survey.first_problem or str(error)
            continue
        survey.lengths.append(len(done))
        survey.label_tokens += done.num_label_tokens
        survey.visual_tokens += int((done.mm_token_type_ids != 0).sum())
        if done.image_grid_thw is not None and len(done.image_grid_thw):
            survey.with_images += 1
            survey.most_images = max(survey.most_images, len(done.image_grid_thw))
            for _t, h, w in done.image_grid_thw.tolist():
                survey.largest_image = max(survey.largest_image, (h * patch, w * patch), key=_area)
        if done.video_grid_thw is not None and len(done.video_grid_thw):
            survey.with_videos += 1
            survey.videos += len(done.video_grid_thw)
            survey.frame_lists += sum(isinstance(p.ref, (list, tuple)) for p in conv.media if p.kind == "video")
            for t, h, w in done.video_grid_thw.tolist():
                survey.largest_frame = max(survey.largest_frame, (h * patch, w * patch), key=_area)
                survey.most_frames = max(survey.most_frames, t * temporal)
    if not survey.lengths:
        raise DataError(f"none of the {survey.sampled} sampled records of {', '.join(survey.files)} can be used; "
                        f"the first: {survey.first_problem} (the layouts vlforge reads: docs/data.md)")
    logger.info("data: %d of %d sampled records usable, %d to %d tokens (median %d)", survey.usable,
                survey.sampled, min(survey.lengths), survey.longest, survey.median)
    return survey


def pipeline_processor(cfg: TrainConfig, data_cfg: Any = None) -> Any:
    """The data pipeline's processor of ``cfg``, as ``vlforge train`` builds it (the checkpoint's tokenizer and
    image processor, the config's pixel and frame limits), without loading any weights."""
    from vlforge.data import build_processor
    from vlforge.models.load import resolve
    from vlforge.models.readers import read_processor
    from vlforge.models.refs import model_family

    data_cfg = data_cfg or data_config(cfg)
    path = resolve(cfg.model.load_from_pretrained_path)
    hf = read_processor(path)
    family = cfg.processor.processor_type or model_family(path)
    return build_processor(data_cfg, hf.tokenizer, family, image_processor=getattr(hf, "image_processor", None))
