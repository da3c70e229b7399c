"""Data pipeline: chat-format multimodal datasets -> Qwen-VL model inputs, packed and resumable.

Example:
    >>> from vlforge.data import DataConfig, DataStream, QwenVLProcessor, VisionSettings
    >>> cfg = DataConfig(datasets="dataset.yaml", packing=True, packing_length=2048)  # doctest: +SKIP
    >>> proc = QwenVLProcessor(tokenizer, VisionSettings.for_family("qwen3_vl"), "qwen3_vl")  # doctest: +SKIP
    >>> batch = next(DataStream(cfg, proc, base_dir="examples/data"))  # doctest: +SKIP
"""

from vlforge.data.config import DataConfig, DatasetEntry, load_config, read_dataset_yaml, resolve_entries
from vlforge.data.errors import REASONS, SampleError, SkipLedger
from vlforge.data.loader import ResumableLoader, StreamingDataset
from vlforge.data.mixture import Mixture
from vlforge.data.packing import Binner, LengthGrouper, PackingStats, collate_packed, collate_padded
from vlforge.data.processor import IGNORE_INDEX, ProcessedSample, QwenVLProcessor, build_processor
from vlforge.data.rope import mrope_position_ids
from vlforge.data.schema import Conversation, parse_conversation
from vlforge.data.sources import open_source
from vlforge.data.stream import DataStream
from vlforge.data.video import decode_video, frame_timestamps, sample_frame_indices
from vlforge.data.vision import VisionSettings, process_images, process_video_frames, video_frame_size

__all__ = [
    "IGNORE_INDEX", "REASONS", "Binner", "Conversation", "DataConfig", "DataStream", "DatasetEntry",
    "LengthGrouper", "Mixture", "PackingStats", "ProcessedSample", "QwenVLProcessor", "ResumableLoader",
    "SampleError", "SkipLedger", "StreamingDataset", "VisionSettings", "build_processor", "collate_packed",
    "collate_padded",
    "decode_video", "frame_timestamps", "load_config", "mrope_position_ids", "open_source",
    "parse_conversation", "process_images", "process_video_frames", "read_dataset_yaml", "resolve_entries",
    "sample_frame_indices", "video_frame_size",
]
