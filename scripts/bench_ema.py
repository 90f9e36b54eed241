"""What the weight EMA (train.ema_decay) costs a training step, measured side by side.

    python scripts/bench_ema.py [--config FILE] [--rounds 5] [--steps 8]

The code, what it measures and its options (`--help`): bench/ema.py.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `attn-mt` sets it, before torch loads
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.ema import main  # noqa: E402

if __name__ == "__main__":
    main()
