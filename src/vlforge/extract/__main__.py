"""``python -m vlforge.extract [OPTIONS]`` = ``vlforge extract [OPTIONS]`` (handy under torchrun).

Example (2 CPU processes):
    torchrun --nproc_per_node=2 -m vlforge.extract --model tiny:qwen3_vl --data examples/data/dataset.yaml --out /tmp/f
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    """Run ``vlforge extract`` with ``argv`` (default: this process's arguments)."""
    from vlforge.cli import main as cli_main  # the entry point is the CLI (an allowed upward import)

    cli_main(["extract", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
