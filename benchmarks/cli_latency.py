"""Seconds from the command line to the one-line error (and to ``--help``), per command; JSON on stdout.

Each case runs the installed ``vlforge`` entry point in a fresh process ``--repeats`` times in a scratch
directory holding the bad inputs; the median wall time is reported next to the time of ``python -c pass``
(the interpreter's own floor) and of ``python -c "import torch, transformers"`` (what checking late costs).
The issue-17 target is under 1 s from command to error. Run alone: other load on the cores inflates it.

    .venv/bin/python benchmarks/cli_latency.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VLFORGE = str(Path(sys.executable).with_name("vlforge"))
CASES = {
    "--help": [VLFORGE, "--help"],
    "profile --help": [VLFORGE, "profile", "--help"],
    "profile: missing image": [VLFORGE, "profile", "--model", "tiny:qwen3_vl", "--image", "gone.png"],
    "verify: unknown preset": [VLFORGE, "verify", "--model", "tiny:nope"],
    "extract: missing data": [VLFORGE, "extract", "--model", "tiny:qwen3_vl", "--data", "gone.jsonl", "--out", "c"],
    "tokens audit: missing model": [VLFORGE, "tokens", "audit", "--model", "./gone"],
    "train: missing dataset": [VLFORGE, "train", "missing_data.yaml"],
    "validate: missing dataset": [VLFORGE, "validate", "missing_data.yaml"],
    "doctor: unknown --assume": [VLFORGE, "doctor", "--assume", "device=tpu"],
}
FLOORS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import torch, transformers": [sys.executable, "-c", "import torch, transformers"],
}


def median_seconds(argv: list[str], cwd: Path, repeats: int) -> tuple[float, int]:
    times, code = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        code = subprocess.run(argv, cwd=cwd, capture_output=True).returncode
        times.append(time.perf_counter() - start)
    return statistics.median(times), code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        cwd = Path(scratch)
        (cwd / "missing_data.yaml").write_text(
            "data: {dataset_path: gone.jsonl}\nmodel: {load_from_pretrained_path: tiny:qwen3_vl}\n"
            "training: {max_steps: 1}\n")
        floors = {name: round(median_seconds(argv, cwd, args.repeats)[0], 3) for name, argv in FLOORS.items()}
        cases = {}
        for name, argv in CASES.items():
            seconds, code = median_seconds(argv, cwd, args.repeats)
            cases[name] = {"seconds": round(seconds, 3), "exit_code": code, "under_1s": seconds < 1.0}
    print(json.dumps({"benchmark": "cli_latency", "repeats": args.repeats, "floors": floors, "cases": cases,
                      "all_under_1s": all(c["under_1s"] for c in cases.values())}, indent=2))


if __name__ == "__main__":
    main()
