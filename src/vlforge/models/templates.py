"""Chat templates (Jinja) of the Qwen-VL families, written for vlforge's tiny checkpoints.

Each renders a list of ``{"role", "content"}`` messages, where ``content`` is a string or a list of
items ``{"type": "text"|"image"|"video", ...}``, into the prompt layout the family was trained on:

- ``qwen2_chatml`` (Qwen2-VL, Qwen2.5-VL): ChatML roles, a default system prompt when none is given, and
  ``<|vision_start|><|image_pad|><|vision_end|>`` / ``<|vision_start|><|video_pad|><|vision_end|>``.
- ``qwen3_chatml`` (Qwen3-VL, Qwen3-VL-MoE): ChatML roles, no default system prompt, the same vision
  markup (the processor expands ``<|video_pad|>`` into per-frame ``<t seconds>`` blocks and keeps
  this outer pair); ``<think>`` blocks of assistant turns before the last user turn are dropped.
- ``glm_chat`` (GLM-4.1V): ``[gMASK]<sop>`` then ``<|system|>``/``<|user|>``/``<|assistant|>`` turns,
  ``<|begin_of_image|><|image|><|end_of_image|>`` and ``<|begin_of_video|><|video|><|end_of_video|>``.

Assistant turns sit in ``{% generation %}`` blocks (``return_assistant_tokens_mask`` works).
``add_vision_id=True`` prefixes each image/video with "Picture N: " / "Video N: " (Qwen families).

Example:
    >>> from vlforge.models.templates import render
    >>> render("qwen3_chatml", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}])
    '<|im_start|>user\\n<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

from typing import Any

# Shared Jinja macro: the content of one message, with the family's image and video markup.
_CONTENT_MACRO = """\
{%- macro render_content(content, image_markup, video_markup) -%}
{%- if content is string -%}{{- content -}}
{%- else -%}{%- for item in content -%}
{%- if item.type == 'image' or 'image' in item or 'image_url' in item -%}
{%- set ns.images = ns.images + 1 -%}
{%- if add_vision_id is defined and add_vision_id -%}{{- 'Picture ' ~ ns.images ~ ': ' -}}{%- endif -%}
{{- image_markup -}}
{%- elif item.type == 'video' or 'video' in item -%}
{%- set ns.videos = ns.videos + 1 -%}
{%- if add_vision_id is defined and add_vision_id -%}{{- 'Video ' ~ ns.videos ~ ': ' -}}{%- endif -%}
{{- video_markup -}}
{%- elif 'text' in item -%}{{- item.text -}}
{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(images=0, videos=0) -%}
"""

_QWEN2_VL = _CONTENT_MACRO + """\
{%- set img = '<|vision_start|><|image_pad|><|vision_end|>' -%}
{%- set vid = '<|vision_start|><|video_pad|><|vision_end|>' -%}
{%- for message in messages -%}
{%- if loop.first and message.role != 'system' -%}
{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}
{%- endif -%}
{{- '<|im_start|>' ~ message.role ~ '\\n' -}}
{%- if message.role == 'assistant' -%}
{%- generation -%}{{- render_content(message.content, img, vid) ~ '<|im_end|>' -}}{%- endgeneration -%}
{{- '\\n' -}}
{%- else -%}{{- render_content(message.content, img, vid) ~ '<|im_end|>\\n' -}}{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""

_QWEN3_VL = _CONTENT_MACRO + """\
{%- set img = '<|vision_start|><|image_pad|><|vision_end|>' -%}
{%- set vid = '<|vision_start|><|video_pad|><|vision_end|>' -%}
{%- set last = namespace(user=-1) -%}
{%- for message in messages -%}{%- if message.role == 'user' -%}{%- set last.user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for message in messages -%}
{%- set body = render_content(message.content, img, vid) -%}
{{- '<|im_start|>' ~ message.role ~ '\\n' -}}
{%- if message.role == 'assistant' -%}
{%- if '</think>' in body and loop.index0 < last.user -%}
{%- set body = body.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
{%- generation -%}{{- body ~ '<|im_end|>' -}}{%- endgeneration -%}
{{- '\\n' -}}
{%- else -%}{{- body ~ '<|im_end|>\\n' -}}{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}
"""

_GLM4V = _CONTENT_MACRO + """\
{%- set img = '<|begin_of_image|><|image|><|end_of_image|>' -%}
{%- set vid = '<|begin_of_video|><|video|><|end_of_video|>' -%}
{{- '[gMASK]<sop>' -}}
{%- for message in messages -%}
{{- '<|' ~ message.role ~ '|>\\n' -}}
{%- if message.role == 'assistant' -%}
{%- generation -%}{{- render_content(message.content, img, vid) -}}{%- endgeneration -%}
{%- else -%}{{- render_content(message.content, img, vid) -}}{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}
"""

TEMPLATES: dict[str, str] = {"qwen2_chatml": _QWEN2_VL, "qwen3_chatml": _QWEN3_VL, "glm_chat": _GLM4V}


def template(style: str) -> str:
    """The Jinja chat template of a style (a key of :data:`TEMPLATES`; each family record names its own)."""
    try:
        return TEMPLATES[style]
    except KeyError:
        raise KeyError(f"unknown chat template style {style!r}; known: {', '.join(TEMPLATES)}") from None


def render(style: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, **extra: Any) -> str:
    """Render messages with a style's template (the same Jinja environment as transformers)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[messages],
        chat_template=template(style),
        add_generation_prompt=add_generation_prompt,
        **extra,
    )
    return rendered[0]
