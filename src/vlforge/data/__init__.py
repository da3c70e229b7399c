"""Data pipeline: chat-format multimodal datasets -> Qwen-VL model inputs, packed and resumable.

Example:
    >>> from vlforge.data import DataConfig, DataStream, QwenVLProcessor, VisionSettings
    >>> cfg = DataConfig(datasets="dataset.yaml", packing=True, packing_length=2048)  # doctest: +SKIP
    >>> proc = QwenVLProcessor(tokenizer, VisionSettings.for_family("qwen3_vl"), "qwen3_vl")  # doctest: +SKIP
    >>> batch = next(DataStream(cfg, proc, base_dir="examples/data"))  # doctest: +SKIP
"""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy): importing one light
# submodule of this package never loads the heavy ones.
_EXPORTS = {
    "DataConfig": "vlforge.data.config",
    "DatasetEntry": "vlforge.data.config",
    "load_config": "vlforge.data.config",
    "read_dataset_yaml": "vlforge.data.config",
    "resolve_entries": "vlforge.data.config",
    "REASONS": "vlforge.data.errors",
    "SampleError": "vlforge.data.errors",
    "SkipLedger": "vlforge.data.errors",
    "RecordFormat": "vlforge.data.layouts",
    "file_format": "vlforge.data.layouts",
    "ResumableLoader": "vlforge.data.loader",
    "StreamingDataset": "vlforge.data.loader",
    "Mixture": "vlforge.data.mixture",
    "Binner": "vlforge.data.packing",
    "LengthGrouper": "vlforge.data.packing",
    "PackingStats": "vlforge.data.packing",
    "collate_packed": "vlforge.data.packing",
    "collate_padded": "vlforge.data.packing",
    "IGNORE_INDEX": "vlforge.data.processor",
    "ProcessedSample": "vlforge.data.processor",
    "QwenVLProcessor": "vlforge.data.processor",
    "build_processor": "vlforge.data.processor",
    "mrope_position_ids": "vlforge.data.rope",
    "Conversation": "vlforge.data.schema",
    "parse_conversation": "vlforge.data.schema",
    "open_source": "vlforge.data.sources",
    "DataStream": "vlforge.data.stream",
    "decode_video": "vlforge.data.video",
    "frame_timestamps": "vlforge.data.video",
    "sample_frame_indices": "vlforge.data.video",
    "VisionSettings": "vlforge.data.vision_settings",
    "process_images": "vlforge.data.vision",
    "process_video_frames": "vlforge.data.vision",
    "video_frame_size": "vlforge.data.vision",
}
lazy_exports(__name__, _EXPORTS)

__all__ = [
    "IGNORE_INDEX", "REASONS", "Binner", "Conversation", "DataConfig", "DataStream", "DatasetEntry",
    "LengthGrouper", "Mixture", "PackingStats", "ProcessedSample", "QwenVLProcessor", "RecordFormat", "ResumableLoader",
    "SampleError", "SkipLedger", "StreamingDataset", "VisionSettings", "build_processor", "collate_packed",
    "collate_padded",
    "decode_video", "file_format", "frame_timestamps", "load_config", "mrope_position_ids", "open_source",
    "parse_conversation", "process_images", "process_video_frames", "read_dataset_yaml", "resolve_entries",
    "sample_frame_indices", "video_frame_size",
]
