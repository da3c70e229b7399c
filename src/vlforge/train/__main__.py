"""``python -m vlforge.train CONFIG [key=value ...]``: the training entry point for torchrun.

Examples:
    python -m vlforge.train examples/qwen3_vl_tiny.yaml training.max_steps=10
    torchrun --nproc_per_node 2 -m vlforge.train examples/qwen3_vl_tiny.yaml
    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 8 --rdzv_endpoint HOST:29500 -m vlforge.train run.yaml

Every rank logs warnings; rank 0 also logs progress and writes metrics, checkpoints and the export.
A user error prints one line on stderr and exits 2.
"""

from __future__ import annotations

import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse ``CONFIG [key=value ...]``, train, return the exit code."""
    from vlforge.errors import VlforgeError

    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        sys.stderr.write((__doc__ or "") + "\n")
        return 0 if args else 2
    rank = int(os.environ.get("RANK", "0"))
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # vlforge logs what it loads instead
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
    from vlforge.train.trainer import run

    try:
        result = run(args[0], args[1:], progress=rank == 0 and sys.stderr.isatty())
    except VlforgeError as error:
        sys.stderr.write(f"error: {error}\n")
        return error.exit_code
    if rank == 0:
        logging.getLogger("vlforge.train").info(
            "done: %d steps, last loss %s, export %s", result.steps,
            f"{result.losses[-1]:.4f}" if result.losses else "-", result.export_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
