"""The alignment error rate of each layer, head and shift of a model's cross-attention.

    python scripts/bench_align.py --model RUN [--gold tests/data/align_de_en.tsv]

The code, what it measures and its options (`--help`): bench/align.py.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `attn-mt` sets it, before torch loads
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.align import main  # noqa: E402

if __name__ == "__main__":
    main()
