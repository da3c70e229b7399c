"""Can the model emit a token when asked to repeat it? (forward-pass check, after Land & Bartolo, 2024)

For each id, the model reads a few prompts that ask it to repeat the token's text and end right where
the token should come next; the largest next-token probability over the prompts is the score. A token
the model cannot emit even when its text is in the prompt scores below :data:`MIN_PROB`.

Example:
    >>> from vlforge.tokens.verify import repeat_probabilities
    >>> repeat_probabilities("ckpt", [151667])          # doctest: +SKIP
    {151667: 0.0003}
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MIN_PROB = 0.01  # below: the model does not emit the token even when asked to copy it

PROMPTS = (
    'Repeat the text between the quotes exactly.\nText: "{s}"\nRepeated: "',
    "Copy the following string.\nString: {s}\nCopy: ",
    "{s}{s}{s}{s}",
)


def prompt_texts(piece: str) -> list[str]:
    """The repeat prompts for one token text (each ends where the token should follow)."""
    return [p.format(s=piece) for p in PROMPTS]


@torch.no_grad()
def repeat_probabilities_with(model, tok, ids: list[int]) -> dict[int, float]:
    """Max over :data:`PROMPTS` of the probability that ``model`` emits each id next."""
    device = next(model.parameters()).device
    out: dict[int, float] = {}
    for token_id in ids:
        text = tok.decode([token_id])
        best = 0.0
        for prompt in prompt_texts(text):
            enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
            logits = model(input_ids=enc["input_ids"].to(device)).logits[0, -1].float()
            prob = float(torch.softmax(logits, dim=-1)[token_id]) if token_id < logits.shape[-1] else 0.0
            best = max(best, prob)
        out[token_id] = best
        log.debug("verify id %d %r: max repeat probability %.4g", token_id, text, best)
    return out


def repeat_probabilities(model_dir: str | Path, ids: list[int], *, dtype: str = "float32",
                         device: str = "cpu") -> dict[int, float]:
    """Load the checkpoint with :func:`vlforge.models.load` and score ``ids``."""
    from vlforge.models import load

    loaded = load(model_dir, dtype=dtype, device=device, processor=False)
    return repeat_probabilities_with(loaded.model, loaded.tokenizer, ids)
