"""Under-trained token detection from the embedding weights alone (after Land & Bartolo, 2024).

1. ``U`` = output embedding (unembedding). Its first principal component ``v`` is removed from every
   row: the top right singular vector (uncentred, block power iteration) of the rows farther from the
   reference mean than the median, i.e. the trained bulk, on a seeded in-memory sample of them. Taken
   over all rows, the component would be dominated by the shared push of the unused rows themselves.
2. Reference set of rows known to be unused: rows past the tokenizer length, all-zero rows, groups of
   bit-identical rows, byte tokens that cannot occur in valid UTF-8, ids given by the user.
3. Per id: cosine distance of its (PC-removed) row to the mean reference row; that distance divided by
   the median distance; its percentile; for untied models also its input-embedding norm divided by the
   median norm.
4. Verdicts from :data:`THRESHOLDS` (calibrated on the trained fixture in ``tests/tokens``; see
   ``docs/tokens.md``).

Example:
    >>> from vlforge.tokens.weights import open_embeddings
    >>> from vlforge.tokens.detect import detect
    >>> stats = detect(open_embeddings("ckpt"), tokenizer_len=151669, byte_invalid_ids=[])  # doctest: +SKIP
    >>> stats.verdicts[151667]                                                              # doctest: +SKIP
    'untrained'
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from vlforge.errors import ConfigError
from vlforge.tokens.weights import DEFAULT_CHUNK_ROWS, Embeddings, MatrixSource

log = logging.getLogger(__name__)

UNTRAINED, WEAK, TRAINED, UNKNOWN = "untrained", "weak", "trained", "unknown"
VERDICT_ORDER = {UNTRAINED: 3, WEAK: 2, UNKNOWN: 1, TRAINED: 0}

# Calibrated on the trained fixture of tests/tokens (docs/tokens.md gives the measurements behind them).
THRESHOLDS: dict[str, float] = {
    # cosine distance to the reference mean / median distance: below -> untrained / weak
    "distance_ratio_untrained": 0.05,
    "distance_ratio_weak": 0.1,
    # untied models: input-embedding norm / median norm: below -> untrained / weak
    "input_norm_ratio_untrained": 0.5,
    "input_norm_ratio_weak": 0.6,
}


@dataclass
class WeightStats:
    """Per-row statistics and verdicts of one checkpoint (tensors indexed by token id)."""

    vocab_rows: int
    tokenizer_len: int
    tied: bool
    distance: torch.Tensor | None
    distance_ratio: torch.Tensor | None
    percentile: torch.Tensor | None
    input_norm_ratio: torch.Tensor | None
    reference: torch.Tensor
    verdicts: list[str]
    reference_reasons: dict[str, int] = field(default_factory=dict)
    median_distance: float | None = None
    median_input_norm: float | None = None
    pc1_cos_reference: float | None = None
    thresholds: dict[str, float] = field(default_factory=lambda: dict(THRESHOLDS))

    def row(self, token_id: int) -> dict:
        """JSON-ready statistics of one id."""
        def pick(t: torch.Tensor | None) -> float | None:
            return None if t is None else round(float(t[token_id]), 6)

        return {
            "id": token_id,
            "verdict": self.verdicts[token_id],
            "reference": bool(self.reference[token_id]),
            "distance": pick(self.distance),
            "distance_ratio": pick(self.distance_ratio),
            "percentile": pick(self.percentile),
            "input_norm_ratio": pick(self.input_norm_ratio),
        }


def _row_norms(src: MatrixSource, chunk_rows: int) -> torch.Tensor:
    return torch.cat([rows.norm(dim=1) for _, rows in src.chunks(chunk_rows)])


def _identical_rows(src: MatrixSource, chunk_rows: int) -> torch.Tensor:
    """Mask of rows bit-identical to at least one other row (fingerprint, then exact check)."""
    gen = torch.Generator().manual_seed(1234)
    probe = torch.randn(src.shape[1], generator=gen, dtype=torch.float64)
    prints = torch.cat([rows.double() @ probe for _, rows in src.chunks(chunk_rows)])
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
    """Top right singular vector of the (uncentred) fp32 ``rows``: block power iteration with 4 vectors,
    fp64 accumulation."""
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


def _sample(ids: torch.Tensor, dim: int, budget_bytes: int = 64 * 2**20) -> torch.Tensor:
    """A seeded subset of ``ids`` whose fp32 rows fit in ``budget_bytes`` (at least 4096 rows)."""
    cap = max(4096, budget_bytes // (4 * dim))
    if len(ids) <= cap:
        return ids
    gen = torch.Generator().manual_seed(0)
    return torch.sort(ids[torch.randperm(len(ids), generator=gen)[:cap]]).values


def _cosine_distance(src: MatrixSource, target: torch.Tensor, v: torch.Tensor | None,
                     chunk_rows: int) -> torch.Tensor:
    """``1 - cos(row, target)`` for every row, with ``v`` projected out of the rows first when given."""
    unit = target / target.norm().clamp_min(1e-30)
    parts = []
    for _, rows in src.chunks(chunk_rows):
        if v is not None:
            rows = rows - (rows @ v)[:, None] * v[None, :]
        parts.append(1.0 - (rows @ unit) / rows.norm(dim=1).clamp_min(1e-30))
    return torch.cat(parts)


def reference_set(
    emb: Embeddings,
    *,
    tokenizer_len: int,
    byte_invalid_ids: list[int],
    user_ids: list[int],
    chunk_rows: int,
) -> tuple[torch.Tensor, dict[str, int]]:
    """Mask of known-unused rows and how many rows each rule contributed."""
    n = emb.vocab_rows
    mask = torch.zeros(n, dtype=torch.bool)
    reasons: dict[str, int] = {}

    def add(reason: str, part: torch.Tensor) -> None:
        reasons[reason] = int(part.sum())
        mask.logical_or_(part)

    past = torch.zeros(n, dtype=torch.bool)
    past[min(tokenizer_len, n):] = True
    add("past_tokenizer", past)
    sources = [emb.output] if emb.tied else [emb.output, emb.input]
    zero = torch.zeros(n, dtype=torch.bool)
    same = torch.zeros(n, dtype=torch.bool)
    for src in sources:
        zero |= _row_norms(src, chunk_rows) == 0
        same |= _identical_rows(src, chunk_rows)
    add("zero_rows", zero)
    add("identical_rows", same & ~zero)
    byte = torch.zeros(n, dtype=torch.bool)
    byte[[i for i in byte_invalid_ids if i < n]] = True
    add("invalid_utf8_bytes", byte)
    user = torch.zeros(n, dtype=torch.bool)
    bad = [i for i in user_ids if not 0 <= i < n]
    if bad:
        raise ConfigError(f"--reference-ids {bad}: outside the embedding rows [0, {n})")
    user[list(user_ids)] = True
    add("user", user)
    return mask, reasons


def detect(
    emb: Embeddings,
    *,
    tokenizer_len: int | None = None,
    byte_invalid_ids: list[int] | None = None,
    user_reference_ids: list[int] | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    thresholds: dict[str, float] | None = None,
) -> WeightStats:
    """Score every row of ``emb`` and give it a verdict (see the module docstring)."""
    th = {**THRESHOLDS, **(thresholds or {})}
    n = emb.vocab_rows
    tok_len = n if tokenizer_len is None else min(tokenizer_len, n)
    ref, reasons = reference_set(
        emb, tokenizer_len=tok_len, byte_invalid_ids=byte_invalid_ids or [],
        user_ids=user_reference_ids or [], chunk_rows=chunk_rows,
    )
    # ids whose scores define "typical": inside the tokenizer, not known-unused
    typical = torch.zeros(n, dtype=torch.bool)
    typical[:tok_len] = True
    typical &= ~ref
    if not typical.any():
        typical[:tok_len] = True

    distance = ratio = percentile = None
    median_distance = pc1_cos_reference = None
    raw_mean = torch.zeros(emb.output.shape[1])
    if ref.any():
        ref_rows = emb.output.take(torch.nonzero(ref).flatten(), chunk_rows)
        ref_rows = ref_rows[ref_rows.norm(dim=1) > 0]  # all-zero rows carry no direction
        if len(ref_rows):
            raw_mean = ref_rows.mean(dim=0)
    if float(raw_mean.norm()) > 0:
        # provisional distances without PC removal pick the trained bulk (the far half) ...
        first = _cosine_distance(emb.output, raw_mean, None, chunk_rows)
        far = typical & (first > first[typical].median())
        # ... whose first principal component is the direction every trained row shares
        # (on a seeded sample of at most 64 MiB of rows, held in memory: one streamed pass)
        sample = _sample(torch.nonzero(far).flatten(), emb.output.shape[1])
        v = first_component(emb.output.take(sample, chunk_rows))
        pc1_cos_reference = float((v @ raw_mean).abs() / raw_mean.norm().clamp_min(1e-30))
        ref_mean = raw_mean - (raw_mean @ v) * v
        distance = _cosine_distance(emb.output, ref_mean, v, chunk_rows)
        median_distance = float(distance[typical].median())
        ratio = distance / max(median_distance, 1e-12)
        ordered = torch.sort(distance[typical]).values
        percentile = 100.0 * torch.searchsorted(ordered, distance, right=True).float() / len(ordered)

    norm_ratio = median_norm = None
    if not emb.tied:
        norms = _row_norms(emb.input, chunk_rows)
        median_norm = float(norms[typical].median())
        norm_ratio = norms / max(median_norm, 1e-12)

    verdicts = _verdicts(n, ref, ratio, norm_ratio, th)
    log.info("weights audit: %d rows, %d reference rows (%s), %d untrained, %d weak", n, int(ref.sum()),
             ", ".join(f"{k}={v}" for k, v in reasons.items() if v), verdicts.count(UNTRAINED), verdicts.count(WEAK))
    return WeightStats(
        vocab_rows=n, tokenizer_len=tok_len, tied=emb.tied, distance=distance, distance_ratio=ratio,
        percentile=percentile, input_norm_ratio=norm_ratio, reference=ref, verdicts=verdicts,
        reference_reasons=reasons, median_distance=median_distance, median_input_norm=median_norm,
        pc1_cos_reference=pc1_cos_reference, thresholds=th,
    )


def _level(values: torch.Tensor, untrained: float, weak: float) -> torch.Tensor:
    """2 below ``untrained``, 1 below ``weak``, else 0."""
    return (values < untrained).long() + (values < weak).long()


def _verdicts(n: int, ref: torch.Tensor, ratio: torch.Tensor | None, norm_ratio: torch.Tensor | None,
              th: dict[str, float]) -> list[str]:
    """Tied: the distance alone. Untied with both signals: untrained when both are at least weak and
    one is untrained (levels sum >= 3), weak when either is at least weak. One signal: its own level."""
    signals = []
    if ratio is not None:
        signals.append(_level(ratio, th["distance_ratio_untrained"], th["distance_ratio_weak"]))
    if norm_ratio is not None:
        signals.append(_level(norm_ratio, th["input_norm_ratio_untrained"], th["input_norm_ratio_weak"]))
    if not signals:
        names = [UNKNOWN] * n
    elif len(signals) == 1:
        level = signals[0]
        names = [(TRAINED, WEAK, UNTRAINED)[int(x)] for x in level.tolist()]
    else:
        total = signals[0] + signals[1]
        names = [TRAINED if t == 0 else (UNTRAINED if t >= 3 else WEAK) for t in total.tolist()]
    for i in torch.nonzero(ref).flatten().tolist():
        names[i] = UNTRAINED
    return names
