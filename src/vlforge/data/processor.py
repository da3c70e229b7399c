"""Qwen-VL sample processing: a :class:`Conversation` -> token ids, labels, pixels, grids, mrope ids.

The chat is rendered in the ChatML layout the Qwen2-VL / Qwen2.5-VL / Qwen3-VL chat templates produce
(``<|im_start|>role\\n...<|im_end|>\\n``; images as ``<|vision_start|><|image_pad|>*n<|vision_end|>``;
Qwen3-VL videos with a ``<t seconds>`` prefix per temporal patch, as its processor inserts them) or in
GLM-4V's layout (``[gMASK]<sop><|role|>\\n...``), tokenised once with offsets, and labels keep only the
tokens of assistant replies plus the token that ends each reply (``label_mode="assistant"``, the default).
``label_mode="lmms"`` reproduces LMMS Engine 0.1.4's layout and masking instead (:mod:`vlforge.data.lmms_labels`).

Example:
    >>> proc = QwenVLProcessor(tokenizer, VisionSettings.for_family("qwen3_vl"), family="qwen3_vl")  # doctest: +SKIP
    >>> sample = proc.process(conversation, data_folder="data/")  # doctest: +SKIP
    >>> sample.input_ids.shape, sample.position_ids.shape  # doctest: +SKIP
    (torch.Size([L]), torch.Size([3, L]))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from vlforge.data.errors import SampleError
from vlforge.data.lmms_labels import VideoLayout, encode_lmms
from vlforge.data.media import load_image, resolve_item
from vlforge.data.rope import mrope_position_ids
from vlforge.data.schema import Conversation, TextPart
from vlforge.data.video import decode_video, frame_timestamps
from vlforge.data.vision import process_images, process_video_frames
from vlforge.data.vision_settings import VisionSettings, item_settings
from vlforge.errors import ConfigError
from vlforge.models.families import family as family_record
from vlforge.models.families import names
from vlforge.strict import first_problem

IGNORE_INDEX = -100
DEFAULT_SYSTEM = "You are a helpful assistant."
LABEL_MODES = ("assistant", "lmms")


@dataclass
class ProcessedSample:
    """One model-ready sample; tensors are unbatched (``position_ids`` is (3, L))."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    pixel_values_videos: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    second_per_grid_ts: torch.Tensor | None = None
    source: str = ""
    location: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_label_tokens(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())


class QwenVLProcessor:
    """Turn conversations into :class:`ProcessedSample` for one model family, without a model.

    ``tokenizer`` is the model's tokenizer; ``settings`` the vision knobs (see :class:`VisionSettings`).
    ``default_system`` inserts Qwen2/2.5-VL's default system prompt when a chat has none
    (``"auto"``: on for qwen2_vl / qwen2_5_vl, off for Qwen3-VL, matching their chat templates).
    ``label_mode``: ``"assistant"`` (assistant replies and their ``<|im_end|>``) or ``"lmms"`` (LMMS
    Engine 0.1.4's template and masking, Qwen2.5-VL and Qwen3-VL only; see docs/train.md "Label conventions").
    """

    def __init__(self, tokenizer: Any, settings: VisionSettings, family: str, *,
                 default_system: str | bool = "auto", allow_path_escape: bool = False,
                 label_mode: str = "assistant") -> None:
        record = family_record(family)
        if label_mode not in LABEL_MODES:
            raise ConfigError(f"label_mode must be one of {LABEL_MODES}, got {label_mode!r}")
        if label_mode == "lmms" and not record.lmms_labels:
            raise ConfigError(f"label_mode 'lmms' reproduces LMMS Engine's processors of {names(lmms_labels=True)}, "
                              f"not {family!r}; use label_mode 'assistant'")
        self.label_mode = label_mode
        self.tokenizer, self.settings, self.family = tokenizer, settings, family
        self.allow_path_escape = allow_path_escape
        if default_system == "auto":
            default_system = record.default_system_prompt
        self.default_system = DEFAULT_SYSTEM if default_system is True else (default_system or None)
        self.glm = record.media.style == "glm"
        self.timestamps = record.video_timestamps
        self.image_token, self.video_token = record.media.image, record.media.video
        ids = {t: tokenizer.convert_tokens_to_ids(t) for t in record.media.required}
        missing = [t for t, i in ids.items() if i is None or i == tokenizer.unk_token_id]
        if missing:
            raise ConfigError(f"tokenizer lacks the {family} special tokens {missing}")
        self.image_token_id, self.video_token_id = ids[self.image_token], ids[self.video_token]
        if self.glm:
            self.video_start_id, self.video_end_id = ids[record.media.video_start], ids[record.media.video_end]

    @classmethod
    def from_hf_processor(cls, processor: Any, family: str, **settings_overrides: Any) -> QwenVLProcessor:
        """Build from a loaded HF processor (its tokenizer and image-processor settings)."""
        settings = VisionSettings.from_image_processor(processor.image_processor, family, **settings_overrides)
        return cls(processor.tokenizer, settings, family)

    def _media_tensors(self, conv: Conversation, data_folder: str | Path, allow_path_escape: bool
                       ) -> tuple[list[str], dict[str, Any], list[VideoLayout | None]]:
        """Decode every media item; return its placeholder text, the stacked tensors and each video's layout."""
        where = {"source": conv.source, "location": conv.location}
        s, merge2 = self.settings, self.settings.merge_size ** 2
        images, texts, video_out, layouts = [], [], [], []
        for part in conv.media:
            media = resolve_item(part.kind, part.ref, part.options, data_folder, allow_path_escape=allow_path_escape,
                                 **where)
            if part.kind == "image":
                images.append((load_image(media, **where), item_settings(self.settings, part.options, part.kind, **where)))
                texts.append(("image", len(images) - 1))
                layouts.append(None)
                continue
            video_settings = item_settings(self.settings, part.options, part.kind, **where)
            video = decode_video(media, video_settings, item_frames=part.options.get("frame_num"), **where)
            tensors = process_video_frames(video.frames, video_settings)
            t, h, w = tensors["video_grid_thw"][0].tolist()
            per_frame = h * w // merge2
            tensors["second_per_grid_ts"] = torch.tensor([s.temporal_patch_size / video.sample_fps])
            video_out.append(tensors)
            texts.append(("video", self._video_text(video.indices, video.video_fps, t, per_frame)))
            layouts.append(VideoLayout(frame_timestamps(video.indices, video.video_fps, s.temporal_patch_size),
                                       per_frame))
        out: dict[str, Any] = {}
        if images and all(settings is s for _image, settings in images):
            out.update(process_images([image for image, _settings in images], s))
        elif images:  # an image with its own pixel bounds: each processed with its settings, in order
            done = [process_images([image], settings) for image, settings in images]
            out.update({key: torch.cat([d[key] for d in done]) for key in ("pixel_values", "image_grid_thw")})
        if video_out:
            for key in ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
                out[key] = torch.cat([v[key] for v in video_out])
        rendered = []
        for kind, value in texts:
            if kind == "image":
                n = int(out["image_grid_thw"][value].prod()) // merge2
                start, end = ("<|begin_of_image|>", "<|end_of_image|>") if self.glm else ("<|vision_start|>",
                                                                                           "<|vision_end|>")
                rendered.append(start + self.image_token * n + end)
            else:
                rendered.append(value)
        return rendered, out, layouts

    def _video_text(self, indices: list[int], video_fps: float, grid_t: int, per_frame: int) -> str:
        """Placeholder text of one video, as the family's HF processor writes it."""
        tp = self.settings.temporal_patch_size
        if self.glm:  # GLM-4V: one image block per temporal patch, then its first frame's whole second
            firsts = [i / video_fps for i in indices[::tp]][:grid_t]
            return "<|begin_of_video|>" + "".join(
                "<|begin_of_image|>" + "<|image|>" * per_frame + f"<|end_of_image|>{int(ts)}" for ts in firsts
            ) + "<|end_of_video|>"
        if self.timestamps:  # Qwen3-VL: "<t seconds>" before each temporal patch, t = its mean frame time
            stamps = frame_timestamps(indices, video_fps, tp)
            body = "".join(f"<{ts:.1f} seconds><|vision_start|>" + "<|video_pad|>" * per_frame + "<|vision_end|>"
                           for ts in stamps)
        else:
            body = "<|video_pad|>" * (grid_t * per_frame)
        return "<|vision_start|>" + body + "<|vision_end|>"

    def _render_glm(self, conv: Conversation, media_texts: list[str]) -> tuple[str, list[tuple[int, int]]]:
        """GLM-4V layout: ``[gMASK]<sop>`` then ``<|role|>\n`` + content per message. An assistant reply is
        trained together with the token that ends it: the next message's role token, or ``<|endoftext|>``."""
        text, spans = "[gMASK]<sop>", []
        media_iter = iter(media_texts)
        after_assistant = False
        for message in conv.messages:
            header = f"<|{message.role}|>"
            if after_assistant:
                spans.append((len(text), len(text) + len(header)))
            text += header + "\n"
            body = "".join(p.text if isinstance(p, TextPart) else next(media_iter) for p in message.parts)
            if message.role == "assistant" and message.trained:
                spans.append((len(text), len(text) + len(body)))
            text += body
            after_assistant = message.role == "assistant" and message.trained
        if after_assistant:
            spans.append((len(text), len(text) + len("<|endoftext|>")))
            text += "<|endoftext|>"
        return text, spans

    def render(self, conv: Conversation, media_texts: list[str]) -> tuple[str, list[tuple[int, int]]]:
        """The chat text and the character spans that are trained on (assistant replies)."""
        if self.glm:
            return self._render_glm(conv, media_texts)
        chunks: list[str] = []
        spans: list[tuple[int, int]] = []
        pos = 0

        def add(text: str, trained: bool = False) -> None:
            nonlocal pos
            if trained:
                spans.append((pos, pos + len(text)))
            chunks.append(text)
            pos += len(text)

        media_iter = iter(media_texts)
        if self.default_system and conv.messages[0].role != "system":
            add(f"<|im_start|>system\n{self.default_system}<|im_end|>\n")
        last_user = max((i for i, m in enumerate(conv.messages) if m.role == "user"), default=-1)
        for index, message in enumerate(conv.messages):
            add(f"<|im_start|>{message.role}\n")
            body = "".join(p.text if isinstance(p, TextPart) else next(media_iter) for p in message.parts)
            if self.timestamps and message.role == "assistant" and index < last_user and "</think>" in body:
                body = body.split("</think>")[-1].lstrip("\n")  # Qwen3: earlier turns lose their reasoning
            if message.role == "assistant":
                add(body + "<|im_end|>", trained=message.trained)
                add("\n")
            else:
                add(body + "<|im_end|>\n")
        return "".join(chunks), spans

    def _encode(self, conv: Conversation, media_texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids of the rendered chat and labels: a token is trained on when it lies in an assistant span."""
        text, spans = self.render(conv, media_texts)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        input_ids = torch.tensor(enc["input_ids"], dtype=torch.long)
        offsets = torch.tensor(enc["offset_mapping"], dtype=torch.long).view(-1, 2)
        trained = torch.zeros(len(input_ids), dtype=torch.bool)
        for start, end in spans:
            trained |= (offsets[:, 0] >= start) & (offsets[:, 1] <= end) & (offsets[:, 1] > offsets[:, 0])
        return input_ids, torch.where(trained, input_ids, torch.full_like(input_ids, IGNORE_INDEX))

    def process(self, conv: Conversation, data_folder: str | Path = ".", *,
                allow_path_escape: bool | None = None) -> ProcessedSample:
        """Process one conversation; bad media raise :class:`SampleError` naming file and line/row.

        ``allow_path_escape`` (default: the processor's setting) permits media paths outside ``data_folder``.
        """
        escape = self.allow_path_escape if allow_path_escape is None else allow_path_escape
        media_texts, tensors, layouts = self._media_tensors(conv, data_folder, escape)
        if self.label_mode == "lmms":
            input_ids, labels = encode_lmms(self.tokenizer, conv, media_texts, layouts, self.timestamps)
        else:
            input_ids, labels = self._encode(conv, media_texts)
        if not bool((labels != IGNORE_INDEX).any()):
            raise SampleError("no_labels", conv.source, conv.location, "no assistant tokens after tokenisation")
        types = torch.zeros_like(input_ids, dtype=torch.int)
        types[input_ids == self.image_token_id] = 1
        if self.glm:  # one token for both: inside <|begin_of_video|>...<|end_of_video|> it is video
            in_video = torch.cumsum(input_ids == self.video_start_id, 0) > torch.cumsum(input_ids == self.video_end_id, 0)
            types[(input_ids == self.image_token_id) & in_video] = 2
        else:
            types[input_ids == self.video_token_id] = 2
        merge2 = self.settings.merge_size ** 2
        for key, kind in (("image_grid_thw", 1), ("video_grid_thw", 2)):
            expected = int(tensors[key].prod(-1).sum()) // merge2 if key in tensors else 0
            found = int((types == kind).sum())
            if expected != found:
                raise SampleError("placeholder_mismatch", conv.source, conv.location,
                                  f"{found} {('image', 'video')[kind - 1]} tokens in the text, {expected} expected "
                                  f"(does the text contain a literal {self.image_token}?)")
        positions = mrope_position_ids(
            self.family, input_ids, types, image_grid_thw=tensors.get("image_grid_thw"),
            video_grid_thw=tensors.get("video_grid_thw"), second_per_grid_ts=tensors.get("second_per_grid_ts"),
            spatial_merge_size=self.settings.merge_size, tokens_per_second=self.settings.tokens_per_second)
        return ProcessedSample(input_ids=input_ids, labels=labels, position_ids=positions, mm_token_type_ids=types,
                               source=conv.source, location=conv.location, **tensors)


def build_processor(config: Any, tokenizer: Any, family: str, *, image_processor: Any = None) -> QwenVLProcessor:
    """A :class:`QwenVLProcessor` for a :class:`~vlforge.data.config.DataConfig`.

    Vision settings start from ``image_processor`` (a loaded checkpoint's) when given, else from the
    family defaults, and the config's pixel/frame keys override them.

    Example:
        >>> from vlforge.data import DataConfig
        >>> cfg = DataConfig(datasets=[], fps=1, video_max_pixels=224 * 224)
        >>> build_processor(cfg, tokenizer, "qwen3_vl").settings.fps  # doctest: +SKIP
        1.0
    """
    overrides = config.vision_overrides()
    try:
        if image_processor is not None:
            settings = VisionSettings.from_image_processor(image_processor, family, **overrides)
        else:
            settings = VisionSettings.for_family(family, **overrides)
    except ValidationError as error:  # the config's pixel / frame keys against the model's processor
        loc, message, _ = first_problem(error)
        raise ConfigError(f"{'.'.join(map(str, loc))}: {message}") from None
    return QwenVLProcessor(tokenizer, settings, family, allow_path_escape=config.allow_path_escape,
                           label_mode=config.label_mode)
