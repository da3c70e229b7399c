"""Can the model emit a token when asked to repeat it? (forward-pass check, after Land & Bartolo, 2024)

For each id, the model reads a few prompts that ask it to repeat the token's text and end right where
the token should come next; the largest next-token probability over the prompts is the score. A token
the model cannot emit even when its text is in the prompt scores below :data:`MIN_PROB`.

Example:
    >>> from vlforge.vocab.verify import repeat_probabilities
    >>> repeat_probabilities("ckpt", [151667])          # doctest: +SKIP
    {151667: 0.0003}
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from vlforge.tables import progress_bar

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


def _encode(tok, text: str) -> list[int]:
    """The prompt's ids with the tokenizer's own leading specials (Gemma needs its <bos>), no trailing eos."""
    ids = list(tok(text, add_special_tokens=True)["input_ids"])
    eos = getattr(tok, "eos_token_id", None)
    if len(ids) > 1 and isinstance(eos, int) and ids[-1] == eos and not text.endswith(str(tok.eos_token)):
        ids = ids[:-1]
    return ids


@torch.no_grad()
def repeat_probabilities_with(model, tok, ids: list[int], *, batch_size: int = 32,
                              progress: bool = False) -> dict[int, float]:
    """Max over :data:`PROMPTS` of the probability that ``model`` emits each id next.

    Prompts are left-padded into batches of ``batch_size`` (positions follow the attention mask, so a
    padded prompt scores as it would alone); ``progress`` shows a progress bar on stderr.
    """
    device = next(model.parameters()).device
    jobs = [(token_id, _encode(tok, prompt)) for token_id in ids
            for prompt in prompt_texts(tok.decode([token_id]))]
    jobs = [job for job in jobs if job[1]]  # an empty text repeated four times is no prompt
    jobs.sort(key=lambda job: len(job[1]))  # similar lengths share a batch: less padding
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    out = dict.fromkeys(ids, 0.0)
    bar = progress_bar("repeat check", len(jobs)) if progress else None
    try:
        for start in range(0, len(jobs), batch_size):
            batch = jobs[start:start + batch_size]
            width = max(len(p) for _, p in batch)
            input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, (_, prompt) in enumerate(batch):
                input_ids[row, width - len(prompt):] = torch.tensor(prompt)
                mask[row, width - len(prompt):] = 1
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                           position_ids=positions.to(device)).logits[:, -1].float()
            probs = torch.softmax(logits, dim=-1)
            for row, (token_id, _) in enumerate(batch):
                if token_id < probs.shape[-1]:
                    out[token_id] = max(out[token_id], float(probs[row, token_id]))
            if bar is not None:
                bar[0].update(bar[1], advance=len(batch))
    finally:
        if bar is not None:
            bar[0].stop()
    for token_id in ids:
        log.debug("verify id %d: max repeat probability %.4g", token_id, out[token_id])
    return out


def repeat_probabilities(model_dir: str | Path, ids: list[int], *, dtype: str = "float32",
                         device: str = "cpu", batch_size: int = 32, progress: bool = False) -> dict[int, float]:
    """Load the checkpoint with :func:`vlforge.models.load` and score ``ids``."""
    from vlforge.models import load

    loaded = load(model_dir, dtype=dtype, device=device, processor=False)
    return repeat_probabilities_with(loaded.model, loaded.tokenizer, ids, batch_size=batch_size,
                                     progress=progress)
