"""Training speed side by side: attn-mt's Transformer (the Trainer's own update) against
`torch.nn.Transformer`, on Multi30k batches or, with `--vocab N`, the WMT workload.

    python scripts/bench_train.py --quick
    python scripts/bench_train.py --size base --vocab 32000 --compile both

The code, what it measures and its options (`--help`): bench/train.py.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `attn-mt` sets it, before torch loads
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.train import main  # noqa: E402

if __name__ == "__main__":
    main()
