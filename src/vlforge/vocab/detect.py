"""Under-trained token detection from the embedding weights alone (after Land & Bartolo, 2024).

1. ``U`` = the unembedding (output rows) of an untied LM, the embedding of a tied LM or an encoder.
2. Reference set, found automatically. *Structural* rows are untrained by construction: rows past the
   tokenizer length, all-zero rows, groups of bit-identical rows, byte tokens that valid UTF-8 never
   contains, ids given by the user. *Candidates* are ids that are probably never seen: ids the
   tokenizer cannot produce from their own decoded text, special / added tokens that neither the
   special-token map nor the chat template uses (:mod:`vlforge.vocab.reference`). Candidates whose
   rows do not sit with the rest of the set (a special token that was trained after all) are dropped
   from it before scoring.
3. Score of every id: the mean cosine similarity of its row to its :data:`K_NEAREST` most similar
   reference rows (itself excluded), streamed in row blocks against a seeded sample of at most
   :data:`REFERENCE_CAP` reference rows, after the first principal component of the clearly trained
   rows is projected out (the direction all trained rows share). Never-trained rows drift together
   (they only get the softmax push-down and weight decay), so their nearest reference rows are near
   copies; trained rows are not.
4. Cuts from the model's own score distribution (:func:`score_cuts`): ``untrained`` at the score that
   best separates the reference set from the other ids (smallest share of them above plus share of
   reference ids below), at least ``b + min_z * MAD`` above the bulk median ``b``, moved down into an
   empty score stretch below it when one is wide; ``weak`` from ``b + weak_fraction * (untrained cut
   - b)``. No constant is fitted to one model: each model's scale comes from its bulk and its
   reference set.
5. Verdicts: structural rows are untrained; a kept candidate is untrained from the weak cut up (two
   pieces of evidence: the tokenizer never emits it and its row sits with the reference set), weak
   below; every other id untrained from the untrained cut, weak from the weak cut, else trained.

Example:
    >>> from vlforge.vocab.weights import open_embeddings
    >>> from vlforge.vocab.detect import detect
    >>> stats = detect(open_embeddings("ckpt"), tokenizer_len=151669, byte_invalid_ids=[])  # doctest: +SKIP
    >>> stats.verdicts[151667], stats.cuts                                                  # doctest: +SKIP
    ('untrained', {'untrained': 0.965, 'weak': 0.868})
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from vlforge.errors import ConfigError
from vlforge.vocab.thresholds import CUT_KEYS, THRESHOLD_KEYS, THRESHOLDS, check_thresholds
from vlforge.vocab.weights import DEFAULT_CHUNK_ROWS, Embeddings, MatrixSource

__all__ = ["CUT_KEYS", "THRESHOLDS", "THRESHOLD_KEYS", "WeightStats", "detect", "score_cuts"]

log = logging.getLogger(__name__)

UNTRAINED, WEAK, TRAINED, UNKNOWN = "untrained", "weak", "trained", "unknown"
VERDICT_ORDER = {UNTRAINED: 3, WEAK: 2, UNKNOWN: 1, TRAINED: 0}

K_NEAREST = 3  # reference rows averaged per id
REFERENCE_CAP = 2048  # reference rows held in memory (a seeded sample of larger sets)
BULK_SAMPLE = 16384  # non-reference rows that estimate the bulk while the candidates are cleaned


@dataclass
class WeightStats:
    """Per-row statistics and verdicts of one checkpoint (tensors indexed by token id)."""

    vocab_rows: int
    tokenizer_len: int
    tied: bool
    score: torch.Tensor | None
    percentile: torch.Tensor | None
    input_norm_ratio: torch.Tensor | None
    reference: torch.Tensor  # structural rows: untrained by construction
    candidates: torch.Tensor  # candidate rows kept in the reference set
    verdicts: list[str]
    reference_reasons: dict[str, int] = field(default_factory=dict)
    reference_ids: dict[str, list[int]] = field(default_factory=dict)
    dropped_candidates: list[int] = field(default_factory=list)
    cuts: dict[str, float] = field(default_factory=dict)
    bulk_median: float | None = None
    bulk_mad: float | None = None
    reference_median: float | None = None
    median_input_norm: float | None = None
    thresholds: dict[str, float] = field(default_factory=lambda: dict(THRESHOLDS))

    def row(self, token_id: int) -> dict:
        """JSON-ready statistics of one id."""
        def pick(t: torch.Tensor | None) -> float | None:
            return None if t is None else round(float(t[token_id]), 6)

        return {
            "id": token_id,
            "verdict": self.verdicts[token_id],
            "reference": bool(self.reference[token_id]),
            "candidate": bool(self.candidates[token_id]),
            "score": pick(self.score),
            "percentile": pick(self.percentile),
            "input_norm_ratio": pick(self.input_norm_ratio),
        }


def _norms_and_prints(src: MatrixSource, chunk_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row norms and a random-projection fingerprint of every row, in one streamed pass."""
    gen = torch.Generator().manual_seed(1234)
    probe = torch.randn(src.shape[1], generator=gen, dtype=torch.float64)
    norms, prints = [], []
    for _, rows in src.chunks(chunk_rows):
        norms.append(rows.norm(dim=1))
        prints.append(rows.double() @ probe)
    return torch.cat(norms), torch.cat(prints)


def _identical_rows(src: MatrixSource, prints: torch.Tensor, chunk_rows: int) -> torch.Tensor:
    """Mask of rows bit-identical to at least one other row (fingerprint, then exact check)."""
    order = torch.argsort(prints)
    ordered = prints[order]
    same_next = ordered[1:] == ordered[:-1]
    candidates = torch.zeros(src.shape[0], dtype=torch.bool)
    candidates[order[1:][same_next]] = True
    candidates[order[:-1][same_next]] = True
    mask = torch.zeros(src.shape[0], dtype=torch.bool)
    ids = torch.nonzero(candidates).flatten()
    if len(ids) == 0:
        return mask
    rows = src.take(ids, chunk_rows)
    groups: dict[float, list[int]] = defaultdict(list)
    for k, idx in enumerate(ids.tolist()):
        groups[float(prints[idx])].append(k)
    for members in groups.values():
        _, inverse, counts = torch.unique(rows[members], dim=0, return_inverse=True, return_counts=True)
        dup = counts[inverse] > 1
        mask[ids[torch.tensor(members)[dup]]] = True
    return mask


def first_component(rows: torch.Tensor, iters: int = 50, tol: float = 1e-6) -> torch.Tensor:
    """Top right singular vector of the (uncentred) fp32 ``rows``: block power iteration with 4 vectors."""
    gen = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(rows.shape[1], min(4, rows.shape[1]), generator=gen,
                                        dtype=torch.float64)).Q.float()
    for _ in range(iters):
        new = torch.linalg.qr((rows.T @ (rows @ basis)).double()).Q.float()
        done = float((new[:, 0] @ basis[:, 0]).abs()) > 1 - tol
        basis = new
        if done:
            break
    return basis[:, 0]


def _unit(rows: torch.Tensor, pc: torch.Tensor | None = None) -> torch.Tensor:
    """Rows with the bulk's first principal component ``pc`` projected out, scaled to unit length."""
    if pc is not None:
        rows = rows - (rows @ pc)[:, None] * pc[None, :]
    return rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-30)


def _nearest(rows: torch.Tensor, row_ids: torch.Tensor, ref: torch.Tensor, ref_ids: torch.Tensor,
             pc: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cosine of each row to its K_NEAREST most similar (unit, PC-free) reference rows, itself excluded."""
    k = min(K_NEAREST, len(ref_ids) - 1) if len(ref_ids) > 1 else 1
    sims = _unit(rows, pc) @ ref.T
    sims[row_ids[:, None] == ref_ids[None, :]] = -2.0
    return sims.topk(k, dim=1).values.mean(dim=1)


def _sample(ids: torch.Tensor, cap: int, seed: int) -> torch.Tensor:
    if len(ids) <= cap:
        return ids
    gen = torch.Generator().manual_seed(seed)
    return torch.sort(ids[torch.randperm(len(ids), generator=gen)[:cap]]).values


def _robust(values: torch.Tensor) -> tuple[float, float]:
    """Median and 1.4826 x median absolute deviation."""
    med = values.median()
    return float(med), float(1.4826 * (values - med).abs().median())


def score_cuts(typical: torch.Tensor, reference: torch.Tensor, bulk: float, mad: float,
               th: dict[str, float]) -> tuple[float, float]:
    """(untrained, weak) cuts from the model's own scores.

    The untrained cut is the score that best separates the reference ids from the typical ids: the
    smallest share of typical ids at or above it plus share of reference ids below it (the middle of
    the widest score gap where that sum is lowest), and at least ``bulk + min_z * mad``. An empty
    stretch of scores below it, at least ``gap`` x (reference median - bulk median) wide, moves the cut
    down into its middle: the ids above it form a cluster as far from the bulk as the reference set. Typical ids above it are the
    under-trained ones outside the reference set. Weak from ``bulk + weak_fraction * (cut - bulk)``.
    """
    floor = bulk + th["min_z"] * mad
    if len(reference) == 0 or not float(reference.median()) > floor:
        return math.inf, math.inf  # the reference set does not stand apart from the bulk
    scores = torch.cat([typical, reference]).double()
    is_ref = torch.cat([torch.zeros(len(typical)), torch.ones(len(reference))])
    order = torch.argsort(scores, descending=True)
    scores, is_ref = scores[order], is_ref[order]
    # a cut just below position i (ids 0..i at or above it): the share of typical ids above plus the share
    # of reference ids below (each class weighs the same, so a small reference set still counts)
    typical_above = torch.cumsum(1 - is_ref, 0) / len(typical)
    reference_below = (is_ref.sum() - torch.cumsum(is_ref, 0)) / len(reference)
    errors = typical_above + reference_below
    best = float(errors.min())
    at = torch.nonzero(errors <= best + 1e-9).flatten()
    # the widest gap between consecutive scores among the best positions
    nxt = torch.clamp(at + 1, max=len(scores) - 1)
    gaps = scores[at] - scores[nxt]
    i = int(at[int(torch.argmax(gaps))])
    below = float(scores[min(i + 1, len(scores) - 1)]) if i + 1 < len(scores) else float(scores[i]) - 1e-6
    untrained = max((float(scores[i]) + below) / 2, floor)
    # an empty stretch of scores below that cut, wider than `gap` x (reference median - bulk median),
    # splits off a cluster of typical ids as far from the bulk as the reference set: cut in its middle
    inside = scores[(scores > floor) & (scores < untrained)]
    edges = torch.cat([torch.tensor([untrained], dtype=scores.dtype), inside,
                       torch.tensor([floor], dtype=scores.dtype)])
    widths = edges[:-1] - edges[1:]
    if len(widths) and float(widths.max()) >= th["gap"] * (float(reference.median()) - bulk):
        k = int(torch.argmax(widths))
        if k > 0:  # the widest stretch ends below the first typical id under the cut
            untrained = float(edges[k] + edges[k + 1]) / 2
    weak = bulk + th["weak_fraction"] * (untrained - bulk)
    return untrained, weak


def _structural(emb: Embeddings, *, tokenizer_len: int, byte_invalid_ids: list[int], user_ids: list[int],
                chunk_rows: int) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """Masks of the structural reference rules, and the input-embedding norms (untied models)."""
    n = emb.vocab_rows
    past = torch.zeros(n, dtype=torch.bool)
    past[min(tokenizer_len, n):] = True
    zero = torch.zeros(n, dtype=torch.bool)
    same = torch.zeros(n, dtype=torch.bool)
    input_norms = None
    for src in ([emb.output] if emb.tied else [emb.output, emb.input]):
        norms, prints = _norms_and_prints(src, chunk_rows)
        zero |= norms == 0
        same |= _identical_rows(src, prints, chunk_rows)
        if src is emb.input and not emb.tied:
            input_norms = norms
    byte = torch.zeros(n, dtype=torch.bool)
    byte[[i for i in byte_invalid_ids if 0 <= i < n]] = True
    bad = [i for i in user_ids if not 0 <= i < n]
    if bad:
        raise ConfigError(f"--reference-ids {bad}: outside the embedding rows [0, {n})")
    user = torch.zeros(n, dtype=torch.bool)
    user[list(user_ids)] = True
    return ({"past_tokenizer": past, "zero_rows": zero, "identical_rows": same & ~zero,
             "invalid_utf8_bytes": byte, "user": user}, input_norms)


def _trained_component(src: MatrixSource, bulk_ids: torch.Tensor, bulk_rows: torch.Tensor, pool: torch.Tensor,
                       chunk_rows: int) -> torch.Tensor | None:
    """First principal component of the clearly trained rows: the half of the bulk sample farthest from
    the reference rows. Over all rows it would partly be the shared push of the rarely seen ones."""
    ref_ids = _sample(torch.nonzero(pool).flatten(), REFERENCE_CAP, seed=0)
    if len(bulk_ids) < 4:
        return None
    if len(ref_ids) >= 2:
        raw = _nearest(bulk_rows, bulk_ids, _unit(src.take(ref_ids, chunk_rows)), ref_ids)
        bulk_rows = bulk_rows[raw <= raw.median()]
    return first_component(bulk_rows)


def _score_pass(src: MatrixSource, ref_ids: torch.Tensor, pc: torch.Tensor | None, chunk_rows: int) -> torch.Tensor:
    ref = _unit(src.take(ref_ids, chunk_rows), pc)
    out = torch.empty(src.shape[0])
    for start, rows in src.chunks(chunk_rows):
        ids = torch.arange(start, start + rows.shape[0])
        out[start:start + rows.shape[0]] = _nearest(rows, ids, ref, ref_ids, pc)
    return out


def _clean_candidates(src: MatrixSource, structural: torch.Tensor, candidates: torch.Tensor,
                      bulk_ids: torch.Tensor, bulk_rows: torch.Tensor, nonzero: torch.Tensor,
                      pc: torch.Tensor | None, th: dict[str, float], chunk_rows: int) -> torch.Tensor:
    """Candidates whose rows sit apart from the reference set (below the weak cut on a bulk sample)."""
    pool = torch.nonzero((structural | candidates) & nonzero).flatten()
    ref_ids = _sample(pool, REFERENCE_CAP, seed=0)
    cand_ids = torch.nonzero(candidates & nonzero).flatten()
    if len(ref_ids) < 2 or len(bulk_ids) == 0 or len(cand_ids) == 0:
        return torch.zeros_like(candidates)
    ref = _unit(src.take(ref_ids, chunk_rows), pc)
    bulk_scores = _nearest(bulk_rows, bulk_ids, ref, ref_ids, pc)
    cand_scores = torch.cat([_nearest(src.take(part, chunk_rows), part, ref, ref_ids, pc)
                             for part in torch.split(cand_ids, chunk_rows)])
    bulk, mad = _robust(bulk_scores)
    _, weak = score_cuts(bulk_scores, _nearest(ref, ref_ids, ref, ref_ids), bulk, mad, th)
    drop = torch.zeros_like(candidates)
    if math.isfinite(weak):
        drop[cand_ids[cand_scores < weak]] = True
    return drop


def detect(
    emb: Embeddings,
    *,
    tokenizer_len: int | None = None,
    byte_invalid_ids: list[int] | None = None,
    user_reference_ids: list[int] | None = None,
    candidate_ids: dict[str, list[int]] | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    thresholds: dict[str, float] | None = None,
) -> WeightStats:
    """Score every row of ``emb`` and give it a verdict (see the module docstring).

    ``candidate_ids`` maps a reason (``unreachable``, ``unused_special``) to ids that are probably never
    seen (:func:`vlforge.vocab.reference.reference_candidates`).
    """
    th = {**THRESHOLDS, **check_thresholds(dict(thresholds or {}))}
    n = emb.vocab_rows
    tok_len = n if tokenizer_len is None else min(tokenizer_len, n)
    rules, input_norms = _structural(emb, tokenizer_len=tok_len, byte_invalid_ids=byte_invalid_ids or [],
                                     user_ids=user_reference_ids or [], chunk_rows=chunk_rows)
    structural = torch.zeros(n, dtype=torch.bool)
    for mask in rules.values():
        structural |= mask
    reasons = {k: int(v.sum()) for k, v in rules.items()}
    ids_by_reason = {k: torch.nonzero(v).flatten().tolist() for k, v in rules.items()}
    candidates = torch.zeros(n, dtype=torch.bool)
    for reason, ids in (candidate_ids or {}).items():
        part = torch.zeros(n, dtype=torch.bool)
        part[[i for i in ids if 0 <= i < tok_len]] = True
        part &= ~structural
        reasons[reason] = int(part.sum())
        ids_by_reason[reason] = torch.nonzero(part).flatten().tolist()
        candidates |= part
    nonzero = ~rules["zero_rows"]
    typical = torch.zeros(n, dtype=torch.bool)
    typical[:tok_len] = True
    typical &= ~structural & ~candidates

    src = emb.output
    # the direction every trained row shares (frequency, softmax bias) dominates raw cosines: removed,
    # as in Land & Bartolo (2024), using the first principal component of a sample of the bulk
    bulk_ids = _sample(torch.nonzero(typical & nonzero).flatten(), BULK_SAMPLE, seed=1)
    bulk_rows = src.take(bulk_ids, chunk_rows)
    pc = _trained_component(src, bulk_ids, bulk_rows, (structural | candidates) & nonzero, chunk_rows)
    dropped = _clean_candidates(src, structural, candidates, bulk_ids, bulk_rows, nonzero, pc, th, chunk_rows)
    candidates &= ~dropped
    pool = torch.nonzero((structural | candidates) & nonzero).flatten()

    score = percentile = None
    cuts: dict[str, float] = {}
    bulk = mad = reference = None
    if len(pool) >= 2 and typical.any():
        ref_ids = _sample(pool, REFERENCE_CAP, seed=0)
        score = _score_pass(src, ref_ids, pc, chunk_rows)
        bulk, mad = _robust(score[typical])
        reference = float(score[pool].median())
        untrained, weak = score_cuts(score[typical], score[pool], bulk, mad, th)
        untrained = th.get("untrained", untrained)
        weak = min(th.get("weak", weak), untrained)
        cuts = {"untrained": untrained, "weak": weak}
        ordered = torch.sort(score[typical]).values
        percentile = 100.0 * torch.searchsorted(ordered, score, right=True).float() / len(ordered)

    norm_ratio = median_norm = None
    if input_norms is not None:
        median_norm = float(input_norms[:tok_len][typical[:tok_len]].median()) if typical.any() else None
        norm_ratio = input_norms / max(median_norm or 0.0, 1e-12)

    verdicts = _verdicts(n, structural, candidates, score, cuts)
    log.info("weights: %d rows, reference %d structural + %d candidates (%s; %d candidates dropped), cuts %s, "
             "%d untrained, %d weak", n, int(structural.sum()), int(candidates.sum()),
             ", ".join(f"{k}={v}" for k, v in reasons.items() if v), int(dropped.sum()),
             {k: round(v, 4) for k, v in cuts.items()}, verdicts.count(UNTRAINED), verdicts.count(WEAK))
    return WeightStats(
        vocab_rows=n, tokenizer_len=tok_len, tied=emb.tied, score=score, percentile=percentile,
        input_norm_ratio=norm_ratio, reference=structural, candidates=candidates, verdicts=verdicts,
        reference_reasons=reasons, reference_ids=ids_by_reason,
        dropped_candidates=torch.nonzero(dropped).flatten().tolist(), cuts=cuts, bulk_median=bulk,
        bulk_mad=mad, reference_median=reference, median_input_norm=median_norm, thresholds=th,
    )


def _verdicts(n: int, structural: torch.Tensor, candidates: torch.Tensor, score: torch.Tensor | None,
              cuts: dict[str, float]) -> list[str]:
    """Structural reference rows are untrained. A kept candidate (the tokenizer says it is never seen, its
    row sits with the reference set) is untrained from the weak cut up, weak below it. Every other id
    by its score: untrained from the untrained cut, weak from the weak cut."""
    if score is None:
        names = [UNKNOWN] * n
    else:
        level = (score >= cuts["untrained"]).long() + (score >= cuts["weak"]).long()
        if math.isfinite(cuts["weak"]):  # without a cut the weights say nothing about the candidates either
            level[candidates] = 1 + (score[candidates] >= cuts["weak"]).long()
        names = [(TRAINED, WEAK, UNTRAINED)[int(x)] for x in level.tolist()]
    for i in torch.nonzero(structural).flatten().tolist():
        names[i] = UNTRAINED
    return names
