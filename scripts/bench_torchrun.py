"""`translate` under torchrun against one process, two plain processes and the start-up alone.

    python scripts/bench_torchrun.py --model runs/multi30k_de_en --lines 20000 --rounds 2

The code, what it measures and its options (`--help`): bench/torchrun.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.torchrun import main  # noqa: E402

if __name__ == "__main__":
    main()
