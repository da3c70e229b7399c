"""``vlforge tokens scan``: every vocabulary id of a checkpoint scored and given a verdict.

The weights are read in row blocks (:mod:`vlforge.vocab.weights`), scored against the automatic
reference set and cut where the model's own score distribution says (:mod:`vlforge.vocab.detect`).
``--verify`` adds the repeat-prompt check of the flagged ids for causal LMs (:mod:`vlforge.vocab.verify`).

Example:
    >>> from vlforge.tokens.scan import ScanOptions, run_scan
    >>> report = run_scan(ScanOptions(model="ckpt"))                   # doctest: +SKIP
    >>> report.counts, report.flagged[0].token                          # doctest: +SKIP
    ({'untrained': 6921, 'weak': 1702, 'trained': 253521, 'unknown': 0}, '<unused1100>')
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, Field

from vlforge.errors import ModelLoadError
from vlforge.strict import StrictModel
from vlforge.vocab import detect as det
from vlforge.vocab.audit import Verdict, WeightsSummary, weights_summary
from vlforge.vocab.verify import MIN_PROB

log = logging.getLogger(__name__)

SCHEMA = "vlforge.tokens.scan/1"
MAX_VERIFY_IDS = 512


class ScanOptions(StrictModel):
    """What to scan."""

    unknown_label: ClassVar[str] = "option"

    model: Path = Field(description="Checkpoint directory (safetensors).")
    tokenizer: Path | None = Field(None, description="Tokenizer directory (default: the model directory).")
    top: int | None = Field(None, gt=0, description="Keep only the N highest-scoring flagged ids in the report.")
    reference_ids: list[int] = Field(default_factory=list, description="Extra known-unused ids.")
    thresholds: dict[str, float] = Field(default_factory=dict, description="Overrides of detect.THRESHOLDS / cuts.")
    verify: bool = Field(False, description="Repeat-prompt check of the flagged ids (causal LMs).")
    verify_dtype: str = Field("float32", description="dtype to load the model in for --verify.")
    verify_batch: int = Field(32, gt=0, description="Prompts per forward pass for --verify.")
    verify_max: int = Field(MAX_VERIFY_IDS, gt=0, description="At most this many flagged ids are verified.")
    chunk_rows: int = Field(det.DEFAULT_CHUNK_ROWS, gt=0, description="Rows per streamed block.")


class ScanRecord(BaseModel):
    id: int
    token: str  # the decoded string
    piece: str  # the vocabulary entry
    verdict: Verdict
    score: float | None
    percentile: float | None
    reference: str | None = None  # the reference rule that holds the id, if any
    verify_prob: float | None = None
    verify_verdict: Verdict | None = None


class ScanReport(BaseModel):
    schema_version: str = SCHEMA
    model: str
    tokenizer: str
    weights: WeightsSummary
    counts: dict[str, int]
    reference: dict[str, list[int]]  # the reference set used: ids per rule (dropped candidates apart)
    dropped_candidates: list[int]
    flagged: list[ScanRecord]
    flagged_total: int
    top: int | None = None
    verify_min_prob: float = MIN_PROB
    verified: int = 0
    seconds: float  # the weights scan (tokenizer rules, streamed scoring, cuts)
    verify_seconds: float | None = None
    notes: list[str] = Field(default_factory=list)


def check_vocab(model: Path, tok, emb) -> None:
    """A tokenizer with more entries than the weights have rows does not belong to them."""
    if len(tok) > emb.vocab_rows:
        raise ModelLoadError(
            f"{emb.output.file}: {emb.output.name} has {emb.vocab_rows} rows but the tokenizer of {model} has "
            f"{len(tok)} entries; tokenizer and weights do not belong together")


def run_scan(opts: ScanOptions) -> ScanReport:
    """Score the whole vocabulary of ``opts.model`` (see the module docstring)."""
    from vlforge.vocab.reference import detect_for
    from vlforge.vocab.tokenizer import load_tokenizer
    from vlforge.vocab.weights import open_embeddings

    t0 = time.perf_counter()
    emb = open_embeddings(opts.model)
    tok_path = opts.tokenizer or opts.model
    tok = load_tokenizer(tok_path)
    check_vocab(opts.model, tok, emb)
    stats = detect_for(tok, emb, user_reference_ids=opts.reference_ids, thresholds=opts.thresholds,
                       chunk_rows=opts.chunk_rows)
    notes = []
    if stats.score is None:
        notes.append("no reference set (no known-unused rows): verdicts are 'unknown'; pass --reference-ids")
    weights = weights_summary(opts.model, emb, stats)
    rule_of = {}
    for reason, ids in stats.reference_ids.items():
        for i in ids:
            rule_of.setdefault(i, reason)
    dropped = set(stats.dropped_candidates)
    flagged_ids = [i for i in range(stats.tokenizer_len) if stats.verdicts[i] in (det.UNTRAINED, det.WEAK)]

    def key(i: int) -> tuple:
        score = float(stats.score[i]) if stats.score is not None else 0.0
        return (-det.VERDICT_ORDER[stats.verdicts[i]], -score, i)

    flagged_ids.sort(key=key)
    total = len(flagged_ids)
    if opts.top is not None:
        flagged_ids = flagged_ids[: opts.top]
    texts = tok.batch_decode([[i] for i in flagged_ids], skip_special_tokens=False,
                             clean_up_tokenization_spaces=False)
    pieces = tok.convert_ids_to_tokens(flagged_ids)
    records = []
    for i, text, piece in zip(flagged_ids, texts, pieces, strict=True):
        row = stats.row(i)
        records.append(ScanRecord(id=i, token=text, piece=str(piece), verdict=row["verdict"], score=row["score"],
                                  percentile=row["percentile"],
                                  reference=None if i in dropped else rule_of.get(i)))
    seconds = time.perf_counter() - t0
    verified, verify_seconds = 0, None
    if opts.verify:
        t1 = time.perf_counter()
        verified = _verify(opts, records, notes)
        verify_seconds = round(time.perf_counter() - t1, 2)
    reference = {k: v for k, v in stats.reference_ids.items() if v}
    for reason in reference:
        reference[reason] = [i for i in reference[reason] if i not in dropped]
    return ScanReport(
        model=str(opts.model), tokenizer=str(tok_path), weights=weights,
        counts={v: stats.verdicts[: stats.tokenizer_len].count(v) for v in det.VERDICT_ORDER},
        reference=reference, dropped_candidates=sorted(dropped), flagged=records, flagged_total=total, top=opts.top,
        verified=verified, seconds=round(seconds, 2), verify_seconds=verify_seconds, notes=notes,
    )


def _verify(opts: ScanOptions, records: list[ScanRecord], notes: list[str]) -> int:
    """Repeat-prompt probabilities of the flagged ids (the first ``verify_max``), in place."""
    from vlforge.vocab.verify import repeat_probabilities

    want = records[: opts.verify_max]
    if len(records) > len(want):
        notes.append(f"--verify checked the {len(want)} highest-scoring of {len(records)} flagged ids "
                     "(--verify-max)")
    if not want:
        return 0
    probs = repeat_probabilities(opts.model, [r.id for r in want], dtype=opts.verify_dtype,
                                 batch_size=opts.verify_batch, progress=True)
    for r in want:
        r.verify_prob = probs[r.id]
        r.verify_verdict = det.UNTRAINED if probs[r.id] < MIN_PROB else det.TRAINED
    return len(want)

