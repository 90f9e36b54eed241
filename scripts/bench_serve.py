"""Throughput and latency of `attn-mt serve` under concurrent clients, batching on and off.

    python scripts/bench_serve.py --model runs/multi30k_de_en --clients 32 --seconds 20

The code, what it measures and its options (`--help`): bench/serve.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.serve import main  # noqa: E402

if __name__ == "__main__":
    main()
