"""Data at scale: `attn-mt prepare` and the start of `attn-mt train`, 29k to 4.5M pairs.

    python scripts/bench_data.py --sizes 29000

The code, what it measures and its options (`--help`): bench/data.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.data import main  # noqa: E402

if __name__ == "__main__":
    main()
