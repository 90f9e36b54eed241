"""What one crafted long line costs `attn-mt clean`: time and peak memory against its length.

    python scripts/bench_clean_lines.py [--lengths 10000,20000,40000,80000] [--shapes ...]

The code, what it measures and its options (`--help`): bench/clean_lines.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.clean_lines import main  # noqa: E402

if __name__ == "__main__":
    main()
