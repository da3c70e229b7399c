"""``python -m vlforge.train CONFIG [key=value ...]``: the training entry point for torchrun.

It is ``vlforge train`` itself (the same checks, error handling, report and exit codes); under torchrun every
rank logs warnings, rank 0 also progress, and rank 0 writes metrics, checkpoints and the export.

Examples:
    python -m vlforge.train examples/qwen3_vl_tiny.yaml training.max_steps=10
    torchrun --nproc_per_node 2 -m vlforge.train examples/qwen3_vl_tiny.yaml
    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 8 --rdzv_endpoint HOST:29500 -m vlforge.train run.yaml
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    """Run ``vlforge train`` with ``argv`` (default: this process's arguments)."""
    from vlforge.cli import main as cli_main  # the entry point is the CLI (an allowed upward import)

    cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
