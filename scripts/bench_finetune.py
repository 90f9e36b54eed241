"""Fine-tuning speed and memory: tokens/s and peak RSS of the imported opus-mt shape (74M
parameters) beside the default config's model (7.6M), bf16 and fp32, on Multi30k.

    python scripts/bench_finetune.py --quick
    python scripts/bench_finetune.py --steps 40 --threads 2

The code, what it measures and its options (`--help`): bench/finetune.py.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `attn-mt` sets it, before torch loads
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.finetune import main  # noqa: E402

if __name__ == "__main__":
    main()
