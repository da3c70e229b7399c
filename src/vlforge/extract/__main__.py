"""``python -m vlforge.extract [OPTIONS]`` = ``vlforge extract [OPTIONS]`` (handy under torchrun).

Example (2 CPU processes):
    torchrun --nproc_per_node=2 -m vlforge.extract --model tiny:qwen3_vl --data examples/data/dataset.yaml --out /tmp/f
"""

import sys

from vlforge.cli import main

if __name__ == "__main__":
    sys.argv = ["vlforge", "extract", *sys.argv[1:]]
    main()
