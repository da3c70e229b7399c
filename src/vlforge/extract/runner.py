"""``run_extract``: load + guard + patch the model, extract the shards this process owns, merge the manifest.

Under ``torchrun`` (``WORLD_SIZE`` > 1, :mod:`vlforge.dist` over gloo) rank 0 checks the directory,
hashes model and data and lists the unfinished shards; it broadcasts them and rank ``r`` takes every
``W``-th of them. Each rank writes only its own shards; after a barrier rank 0 merges the receipts into
``manifest.json`` and ``errors.jsonl``. A killed run restarted with any number of processes redoes only
unfinished shards.

Skipped samples (``on_error="skip"``) are logged as they happen (a warning per reason, naming the first
sample's file and line, then a running count at most once a minute) and totalled at the end; when the
cache's skipped share exceeds ``max_skip_fraction``, every rank raises the same
:class:`~vlforge.data.errors.SkipLimitError` once the manifest and ``errors.jsonl`` are written.

Example (CPU, seconds):
    >>> summary = run_extract(model="tiny:qwen3_vl", data="examples/data/dataset.yaml", out="/tmp/feats")  # doctest: +SKIP
    >>> summary.rows_written, summary.skipped  # doctest: +SKIP
    (10, {})
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from vlforge.data.errors import SkipLedger, SkipLimitError, SkipWarnings, limit_error, over_limit
from vlforge.dist import DistContext, init_distributed
from vlforge.errors import ConfigError, DataError
from vlforge.extract import manifest as mf
from vlforge.extract.features import FeatureExtractor, stored_keys
from vlforge.extract.options import FEATURES, RAGGED, ExtractOptions
from vlforge.extract.plan import (
    ChunkStream,
    count_records,
    id_locations,
    shard_ranges,
)
from vlforge.extract.preflight import check_against_config, preflight
from vlforge.extract.shards import (
    receipt_path,
    remove_stale,
    sha256_file,
    shard_name,
    shard_problem,
    write_shard,
)
from vlforge.models.load import resolve_device
from vlforge.outputs import atomic_write_json
from vlforge.strict import build_options

logger = logging.getLogger(__name__)


@dataclass
class ExtractSummary:
    """What one process did (``manifest`` is the merged manifest on the process that merged it)."""

    out: str
    rank: int
    world_size: int
    shards_total: int
    shards_reused: int
    shards_written: int
    rows_written: int
    skipped: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    complete: bool = False
    manifest: dict[str, Any] | None = None
    skip_limit: str | None = None
    """The one line of a cache whose skipped share is over ``max_skip_fraction`` (the cache is complete)."""

    @property
    def samples_per_second(self) -> float:
        done = self.rows_written + sum(self.skipped.values())
        return done / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("manifest")
        out["samples_per_second"] = round(self.samples_per_second, 3)
        if self.manifest is not None:
            out["cache"] = {k: self.manifest[k] for k in ("num_rows", "num_skipped", "skipped")}
        return out


def _device(spec: str) -> torch.device:
    """``auto`` -> this rank's GPU (``LOCAL_RANK``) when CUDA is there; otherwise checked by ``resolve_device``."""
    if spec == "auto" and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return resolve_device(spec)


def _header(opts: ExtractOptions, root: Path, loaded: Any, processor: Any, cfg: Any, entries: list[Any], total: int,
            extractor: FeatureExtractor) -> dict[str, Any]:
    model = {"id": loaded.source, "family": loaded.family, **mf.hash_model(Path(loaded.path), opts.weights_hash)}
    data = {"entries": [{"file": e.path.name, "sha256": sha256_file(e.path), "data_type": e.data_type,
                         "weight": e.weight, "max_samples": e.max_samples} for e in entries],
            "seed": cfg.data_seed, "num_samples": total, "max_length": cfg.max_length,
            "allow_path_escape": cfg.allow_path_escape, "vision": processor.settings.model_dump(mode="json")}
    dtype = str(extractor.dtype).removeprefix("torch.")
    d, k, n_layers = extractor.hidden_size, None, len(opts.layers)
    if "deepstack" in opts.features:
        k = len(extractor.inner.visual.deepstack_visual_indexes)
    tails = {"vision_tokens": [d], "vision_pooled": [d], "deepstack": [k, d], "vision_items": [2],
             "hidden_mean": [n_layers, d], "hidden_last": [n_layers, d]}
    features = {key: {"dtype": "int64" if key == "vision_items" else dtype, "ragged": key in RAGGED,
                      "shape": ["n", *tails[key]] if key in RAGGED else tails[key],
                      "description": FEATURES.get(key, "per item: [kind (1 image, 2 video), tokens]")}
                for key in stored_keys(opts.features)}
    header = {"format_version": mf.FORMAT_VERSION, "model": model, "data": data,
              "options": opts.cache_options() if opts.overwrite else mf.as_cached(root, opts.cache_options()),
              "features": features, "num_shards": len(shard_ranges(total, opts.shard_size)),
              "data_paths": [str(e.path) for e in entries]}
    header["fingerprint"] = mf.fingerprint(header)
    return header


class _ShardBuffer:
    def __init__(self, first: int, count: int) -> None:
        self.first, self.count, self.accounted = first, count, 0
        self.rows: list[tuple[int, str, dict[str, torch.Tensor]]] = []
        self.errors: list[dict[str, Any]] = []


def _progress(enabled: bool, total: int):
    from contextlib import nullcontext

    if not enabled:
        return nullcontext(None)
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text("-- samples/s" if speed is None else f"{speed:.1f} samples/s")

    return Progress(TextColumn("extract"), BarColumn(), MofNCompleteColumn(), Rate(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True), transient=False)


def run_extract(options: ExtractOptions | None = None, *, progress: bool = False, loaded: Any = None,
                raise_on_limit: bool = True, **kwargs: Any) -> ExtractSummary:
    """Extract features into ``options.out`` (or build the options from ``kwargs``); see the module docstring.

    ``loaded``: an already loaded ``vlforge.models.LoadedModel`` of ``options.model`` to use (and patch)
    instead of loading it again; its dtype must be ``options.dtype``. ``raise_on_limit``: a skipped share over
    ``max_skip_fraction`` raises :class:`SkipLimitError` (else the summary's ``skip_limit`` holds its line).
    """
    if options is None:
        options = build_options(ExtractOptions, **kwargs)
    elif kwargs:
        options = options.model_copy(update=kwargs)
    start = time.perf_counter()
    ctx = init_distributed(backend="gloo", device=_device(options.device))
    try:
        summary = _run(options, ctx, progress, start, loaded)
    finally:
        ctx.close()
    if summary.skip_limit is not None and raise_on_limit:
        raise SkipLimitError(summary.skip_limit)
    return summary


def _run(opts: ExtractOptions, ctx: DistContext, progress: bool, start: float, loaded: Any) -> ExtractSummary:
    import vlforge
    from vlforge.data import build_processor
    from vlforge.diagnosis import guard
    from vlforge.models import load, parse_dtype
    from vlforge.models.load import resolve

    root, cfg, _, entries = preflight(opts)
    device = ctx.device
    if loaded is None:
        check_against_config(resolve(opts.model) / "config.json", opts)  # a preset's or hub id's, before loading
        loaded = load(opts.model, dtype=opts.dtype, device=device, attn_implementation=opts.attn_implementation)
    elif next(loaded.model.parameters()).dtype != parse_dtype(opts.dtype):
        raise ConfigError(f"extract: the loaded model is {next(loaded.model.parameters()).dtype}, --dtype is {opts.dtype}")
    else:
        device = next(loaded.model.parameters()).device
    if loaded.processor is None or not hasattr(loaded.processor, "image_processor"):
        raise ConfigError(f"{opts.model}: no image processor in the checkpoint; vlforge extract needs a VLM")
    if getattr(loaded.model, "_vlforge_guarded", None) != opts.dtype:  # once per loaded model and dtype
        guard(loaded.model, opts.dtype, tokens=opts.token_audit)
        logger.info("extract: %s", vlforge.patch(loaded.model).summary())
        loaded.model._vlforge_guarded = opts.dtype
    processor = build_processor(cfg, loaded.tokenizer, loaded.family, image_processor=loaded.processor.image_processor)
    extractor = FeatureExtractor(loaded.model, loaded.family, opts, device)

    plan: dict[str, Any] | None = None
    if ctx.rank == 0:
        try:
            total = count_records(entries)
            if not total:
                raise DataError(f"--data {opts.data}: the datasets hold no records")
            header = _header(opts, root, loaded, processor, cfg, entries, total, extractor)
            resumed = mf.prepare(root, header, overwrite=opts.overwrite)
            stale = remove_stale(root)
            ranges = shard_ranges(total, opts.shard_size)
            todo = []
            for k in range(len(ranges)):
                problem = shard_problem(root, k, header["fingerprint"])
                if problem is not None:
                    todo.append(k)
                    if resumed and problem != "not written":
                        logger.warning("extract: shard %d is recomputed: %s", k, problem)
            if resumed:
                logger.info("extract: resuming %s: %d of %d shards done, %d to do (%d stale temp files removed)",
                            root, len(ranges) - len(todo), len(ranges), len(todo), stale)
            plan = {"header": header, "todo": todo, "ranges": ranges}
        except Exception as exc:  # every rank must hear about it, or the others wait forever
            ctx.broadcast_object({"error": f"{type(exc).__name__}: {exc}"})
            raise
    plan = ctx.broadcast_object(plan)
    if "error" in plan:
        raise ConfigError(f"extract: rank 0 failed: {plan['error']}")
    header, todo, ranges = plan["header"], plan["todo"], plan["ranges"]
    mine = todo[ctx.rank::ctx.world_size]
    summary = ExtractSummary(out=str(root), rank=ctx.rank, world_size=ctx.world_size, shards_total=len(ranges),
                             shards_reused=len(ranges) - len(todo), shards_written=0, rows_written=0)
    if mine:
        _extract_shards(opts, cfg, processor, entries, extractor, header, mine, ranges, root, summary,
                        progress and ctx.rank == 0)
    ctx.barrier()
    verdict: dict[str, Any] | None = None
    if ctx.rank == 0:
        try:
            try:
                summary.manifest = mf.finalize(root, header, len(ranges))
            except mf.DuplicateIdError as duplicate:
                places = id_locations(entries, cfg.data_seed, opts.id_field, duplicate.sample_id)
                if len(places) < 2:  # the data changed since: the shards' line is all there is
                    raise
                raise mf.CacheError(f"duplicate sample id {duplicate.sample_id!r}: {' and '.join(places)}; ids come "
                                 f"from the {opts.id_field!r} field: make them unique or pass --id-field ''") from None
            summary.complete = True
            ledger = _cache_ledger(root, summary.manifest)
            if over_limit(ledger.seen, ledger.total, opts.max_skip_fraction, final=True):
                verdict = {"limit": str(limit_error(ledger, opts.max_skip_fraction, what=f"extract {root}",
                                                    key="--max-skip-fraction", report=root / mf.ERRORS))}
        except Exception as exc:  # the other ranks wait for the verdict: they must hear about it
            ctx.broadcast_object({"error": f"{type(exc).__name__}: {exc}"})
            raise
    verdict = ctx.broadcast_object(verdict)
    if verdict is not None and "error" in verdict:
        raise ConfigError(f"extract: rank 0 failed: {verdict['error']}")
    summary.seconds = time.perf_counter() - start
    _log_summary(summary)
    if verdict is not None:
        summary.skip_limit = verdict["limit"]
    return summary


def _cache_ledger(root: Path, manifest: dict[str, Any]) -> SkipLedger:
    """The whole cache's skips (every rank's, reused shards too): counts from the manifest, an example per reason."""
    import json

    ledger = SkipLedger(counts=dict(manifest["skipped"]), seen=manifest["num_rows"] + manifest["num_skipped"])
    if not ledger.counts:
        return ledger
    with (root / mf.ERRORS).open(encoding="utf-8") as lines:
        for line in lines:
            error = json.loads(line)
            if error["reason"] not in ledger.examples:
                ledger.examples[error["reason"]] = [error["message"]]
                if len(ledger.examples) == len(ledger.counts):
                    break
    return ledger


def _extract_shards(opts: ExtractOptions, cfg: Any, processor: Any, entries: list[Any], extractor: FeatureExtractor,
                    header: dict[str, Any], mine: list[int], ranges: list[tuple[int, int]], root: Path,
                    summary: ExtractSummary, show_progress: bool) -> None:
    stream = ChunkStream(cfg, processor, entries, shards=mine, shard_size=opts.shard_size,
                         batch_size=opts.batch_size, id_field=opts.id_field)
    loader = DataLoader(stream, batch_size=None, num_workers=opts.num_workers,
                        prefetch_factor=4 if opts.num_workers else None)
    buffers = {k: _ShardBuffer(*ranges[k]) for k in mine}
    ledger, warnings = SkipLedger(), SkipWarnings("extract")  # this rank's skips, as they happen
    with _progress(show_progress, sum(ranges[k][1] for k in mine)) as bar:
        task = bar.add_task("extract", total=sum(ranges[k][1] for k in mine)) if bar is not None else None
        for chunk in loader:
            if chunk.errors and opts.on_error == "raise":
                raise DataError(chunk.errors[0]["message"] + " (--on-error skip records it in errors.jsonl)")
            ledger.seen += chunk.accounted
            for error in chunk.errors:
                ledger.add(error["reason"], error["message"])
            warnings.update(ledger)
            buf = buffers[chunk.shard]
            rows = extractor(chunk.batch, chunk.items) if chunk.batch is not None else []
            buf.rows.extend(zip(chunk.indices, chunk.sample_ids, rows, strict=True))
            buf.errors.extend(chunk.errors)
            buf.accounted += chunk.accounted
            if buf.accounted == buf.count:
                _write(root, chunk.shard, buffers.pop(chunk.shard), opts.format, header["fingerprint"], summary)
            if bar is not None:
                bar.update(task, advance=chunk.accounted)
    if buffers:  # the data changed under us: fewer records than counted
        raise DataError(f"{opts.data}: shards {sorted(buffers)} ended early; did the dataset change during the run?")


def _write(root: Path, index: int, buf: _ShardBuffer, fmt: str, fp: str, summary: ExtractSummary) -> None:
    buf.rows.sort(key=lambda r: r[0])
    errors = sorted(buf.errors, key=lambda e: e["index"])
    file = shard_name(index, fmt)
    indices = [r[0] for r in buf.rows]
    ids = [r[1] for r in buf.rows]
    digest = write_shard(root / "shards" / file, [r[2] for r in buf.rows], ids, indices, fmt)
    atomic_write_json(receipt_path(root, index), {
        "index": index, "file": file, "rows": len(buf.rows), "sha256": digest, "sample_ids": ids,
        "first": buf.first, "count": buf.count, "skipped": len(errors), "errors": errors, "fingerprint": fp})
    summary.shards_written += 1
    summary.rows_written += len(buf.rows)
    for err in errors:
        summary.skipped[err["reason"]] = summary.skipped.get(err["reason"], 0) + 1
    logger.debug("extract: wrote %s (%d rows, %d skipped)", file, len(buf.rows), len(errors))


def _log_summary(s: ExtractSummary) -> None:
    skipped = ", ".join(f"{k}={v}" for k, v in sorted(s.skipped.items())) or "none"
    where = f" rank {s.rank}/{s.world_size}" if s.world_size > 1 else ""
    logger.info("extract%s: %d samples in %d new shard(s) (%d reused of %d), skipped: %s, %.1f s (%.1f samples/s)",
                where, s.rows_written, s.shards_written, s.shards_reused, s.shards_total, skipped, s.seconds,
                s.samples_per_second)
    if s.manifest is not None:
        rows, skipped = s.manifest["num_rows"], s.manifest["num_skipped"]
        if skipped:
            share = skipped / (rows + skipped)
            reasons = ", ".join(f"{k}={v}" for k, v in sorted(s.manifest["skipped"].items()))
            logger.warning("extract: cache %s complete: %d rows, %d of %d samples skipped (%.1f%%): %s; each is in "
                           "%s with its file and line", s.out, rows, skipped, rows + skipped, 100 * share, reasons,
                           Path(s.out) / mf.ERRORS)
        else:
            logger.info("extract: cache %s complete: %d rows, none skipped", s.out, rows)
