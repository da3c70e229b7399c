"""``vlforge tokens fix``: re-initialise flagged embedding rows and write a new checkpoint.

Strategies (for each flagged id, on the input and the output matrix):
- ``mean-of-pieces``: mean of the rows of the plain-text pieces the token's text splits into without
  its added token (``<think>`` -> ``<th`` ``ink`` ``>``), rescaled to the pieces' mean norm;
- ``trained-mean``: mean of all rows whose verdict is ``trained``, rescaled to their median norm;
plus seeded Gaussian noise of ``noise`` x (mean row norm / sqrt(hidden)) per element. Only the shards
holding the embeddings are rewritten (in their own dtype); the other files are copied; the output
directory appears atomically.

Example:
    >>> from vlforge.tokens.fix import FixOptions, fix_checkpoint
    >>> report = fix_checkpoint(FixOptions(model="ckpt", out="ckpt-fixed", tags=["<think>", "</think>"]))  # doctest: +SKIP
    >>> [row.id for row in report.rows]                                                                     # doctest: +SKIP
    [151667, 151668]
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import ClassVar, Literal

import torch
from pydantic import BaseModel, Field
from safetensors import safe_open
from safetensors.torch import save_file

from vlforge.errors import ConfigError, VlforgeError
from vlforge.models.portable import make_portable
from vlforge.outputs import (
    LEDGER,
    STAGING_PREFIX,
    atomic_write_json,
    check_output_dir,
    check_output_file,
    staged_dir,
)
from vlforge.strict import StrictModel
from vlforge.vocab import detect as det
from vlforge.vocab.reference import detect_for
from vlforge.vocab.tokenizer import added_tokens, load_tokenizer, plain_pieces
from vlforge.vocab.weights import Embeddings, MatrixSource, open_embeddings

log = logging.getLogger(__name__)

SCHEMA = "vlforge.tokens.fix/1"


class FixOptions(StrictModel):
    """What to repair and how."""

    unknown_label: ClassVar[str] = "option"

    model: Path = Field(description="Checkpoint directory (safetensors).")
    out: Path = Field(description="New checkpoint directory (must not exist or be empty).")
    strategy: Literal["mean-of-pieces", "trained-mean"] = "mean-of-pieces"
    ids: list[int] = Field(default_factory=list, description="Ids to re-initialise, as given.")
    tags: list[str] = Field(default_factory=list, description="Tags whose untrained / weak ids to fix.")
    seed: int = 0
    noise: float = Field(0.02, ge=0, description="Noise std relative to the per-element row scale.")
    trainable_rows: Path | None = Field(None, description="Write the changed ids (to unfreeze) here.")
    reference_ids: list[int] = Field(default_factory=list)
    thresholds: dict[str, float] = Field(default_factory=dict)
    chunk_rows: int = Field(8192, gt=0)


class RowChange(BaseModel):
    id: int
    token: str
    verdict_before: str
    strategy: str
    pieces: list[int]
    tensors: list[str]
    norm_before: dict[str, float]
    norm_after: dict[str, float]


class FixReport(BaseModel):
    schema_version: str = SCHEMA
    model: str
    out: str
    strategy: str
    seed: int
    tied: bool
    rows: list[RowChange]
    trainable_rows: str | None = None


def _targets(opts: FixOptions, tok, stats: det.WeightStats) -> list[int]:
    if opts.ids:
        bad = [i for i in opts.ids if not 0 <= i < stats.vocab_rows]
        if bad:
            raise ConfigError(f"--ids {bad}: outside the embedding rows [0, {stats.vocab_rows})")
        return sorted(set(opts.ids))
    if opts.tags:
        from vlforge.vocab.audit import AuditOptions, run_audit

        report = run_audit(AuditOptions(model=opts.model, tags=opts.tags, reference_ids=opts.reference_ids,
                                        thresholds=opts.thresholds, chunk_rows=opts.chunk_rows))
        flagged = {r.id for f in report.findings for r in f.id_reports
                   if r.verdict in (det.UNTRAINED, det.WEAK) and r.id < stats.tokenizer_len}
        return sorted(flagged)
    raise ConfigError("tell fix what to repair: --ids 151667,151668 or --tags '<think>,</think>'")


def _pieces(tok, token_id: int, verdicts: list[str]) -> list[int]:
    """Trained ids of the token's text split without its added token (or character by character)."""
    added = added_tokens(tok)
    text = added[token_id][0] if token_id in added else tok.decode([token_id])
    pieces = plain_pieces(tok, text)
    if pieces == [token_id] or token_id in pieces:
        pieces = [p for ch in text for p in plain_pieces(tok, ch)]
    return [p for p in pieces if p != token_id and p < len(verdicts) and verdicts[p] == det.TRAINED]


def _trained_mean(src: MatrixSource, trained: torch.Tensor, chunk_rows: int) -> torch.Tensor:
    total = torch.zeros(src.shape[1], dtype=torch.float64)
    norms = []
    for start, rows in src.chunks(chunk_rows):
        keep = rows[trained[start:start + rows.shape[0]]]
        total += keep.double().sum(dim=0)
        norms.append(keep.norm(dim=1))
    mean = (total / max(int(trained.sum()), 1)).float()
    target = torch.cat(norms).median() if norms else mean.norm()
    return mean * (target / mean.norm().clamp_min(1e-30))


def _new_rows(opts: FixOptions, emb: Embeddings, targets: list[int], tok, stats: det.WeightStats,
              ) -> tuple[dict[str, dict[int, torch.Tensor]], list[RowChange]]:
    sources = {emb.input.name: emb.input} if emb.tied else {emb.input.name: emb.input, emb.output.name: emb.output}
    trained = torch.tensor([v == det.TRAINED for v in stats.verdicts])
    if not trained.any():
        raise VlforgeError(f"{opts.model}: no row has the verdict 'trained'; nothing to initialise from")
    gen = torch.Generator().manual_seed(opts.seed)
    new: dict[str, dict[int, torch.Tensor]] = {name: {} for name in sources}
    changes: list[RowChange] = []
    means = {}
    for token_id in targets:
        pieces = _pieces(tok, token_id, stats.verdicts) if opts.strategy == "mean-of-pieces" else []
        strategy = "mean-of-pieces" if pieces else "trained-mean"
        if opts.strategy == "mean-of-pieces" and not pieces:
            log.warning("id %d: no trained plain-text pieces, using the trained mean", token_id)
        before, after = {}, {}
        for name, src in sources.items():
            old = src.rows(token_id, token_id + 1)[0]
            if pieces:
                rows = src.take(pieces, opts.chunk_rows)
                base = rows.mean(dim=0)
                base = base * (rows.norm(dim=1).mean() / base.norm().clamp_min(1e-30))
            else:
                if name not in means:
                    means[name] = _trained_mean(src, trained, opts.chunk_rows)
                base = means[name]
            scale = float(base.norm()) / src.shape[1] ** 0.5
            row = base + opts.noise * scale * torch.randn(src.shape[1], generator=gen)
            new[name][token_id] = row
            before[name] = round(float(old.norm()), 6)
            after[name] = round(float(row.norm()), 6)
        changes.append(RowChange(
            id=token_id, token=str(tok.convert_ids_to_tokens([token_id])[0]),
            verdict_before=stats.verdicts[token_id], strategy=strategy, pieces=pieces,
            tensors=list(sources), norm_before=before, norm_after=after,
        ))
    if emb.tied and emb.tied_copy is not None:  # keep a redundant saved lm_head equal to the embeddings
        new[emb.tied_copy.name] = dict(new[emb.input.name])
    return new, changes


def _write(opts: FixOptions, emb: Embeddings, new: dict[str, dict[int, torch.Tensor]]) -> None:
    by_file: dict[Path, list[str]] = {}
    pairs = [(emb.input.name, emb.input), (emb.output.name, emb.output)]
    if emb.tied_copy is not None:
        pairs.append((emb.tied_copy.name, emb.tied_copy))
    for name, src in pairs:
        if name in new and name not in by_file.get(src.file, []):
            by_file.setdefault(src.file, []).append(name)
    rewritten = {f.resolve() for f in by_file}
    with staged_dir(opts.out, writer="tokens fix") as tmp:
        shutil.copytree(opts.model, tmp, dirs_exist_ok=True, ignore=lambda d, names: [
            n for n in names if Path(d, n).resolve() in rewritten or n == LEDGER or n.startswith(STAGING_PREFIX)])
        make_portable(tmp)  # processor files of older vlforge checkpoints name vlforge's own classes
        for file, names in by_file.items():
            tensors = {}
            with safe_open(str(file), framework="pt") as handle:
                metadata = handle.metadata() or {"format": "pt"}
                for key in handle.keys():  # noqa: SIM118 - safe_open handles are not mappings
                    tensors[key] = handle.get_tensor(key)
            for name in names:
                weight = tensors[name]
                for token_id, row in new[name].items():
                    weight[token_id] = row.to(weight.dtype)
            save_file(tensors, str(tmp / file.relative_to(opts.model)), metadata=metadata)


def fix_checkpoint(opts: FixOptions) -> FixReport:
    """Re-initialise the flagged rows of ``opts.model`` into a new checkpoint ``opts.out``."""
    if opts.out.resolve() == opts.model.resolve():
        raise ConfigError("--out must differ from --model (the fix writes a new checkpoint)")
    check_output_dir(opts.out, flag="--out", mode="new",
                     required_bytes=sum(f.stat().st_size for f in opts.model.rglob("*") if f.is_file()))
    if opts.trainable_rows is not None:
        check_output_file(opts.trainable_rows, flag="--trainable-rows")
    tok = load_tokenizer(opts.model)
    emb = open_embeddings(opts.model)
    stats = detect_for(tok, emb, user_reference_ids=opts.reference_ids, thresholds=opts.thresholds,
                       chunk_rows=opts.chunk_rows)
    targets = _targets(opts, tok, stats)
    if not targets:
        raise VlforgeError("nothing to fix: none of the given tags has an untrained or weak id")
    new, changes = _new_rows(opts, emb, targets, tok, stats)
    _write(opts, emb, new)
    trainable = None
    if opts.trainable_rows is not None:
        payload = {"ids": targets, "tensors": sorted(new), "tied": emb.tied,
                   "note": "unfreeze these rows of these tensors (or the whole embeddings) during RL"}
        atomic_write_json(opts.trainable_rows, payload, writer="tokens fix")
        trainable = str(opts.trainable_rows)
    log.info("fixed %d rows into %s", len(changes), opts.out)
    return FixReport(model=str(opts.model), out=str(opts.out), strategy=opts.strategy, seed=opts.seed,
                     tied=emb.tied, rows=changes, trainable_rows=trainable)
