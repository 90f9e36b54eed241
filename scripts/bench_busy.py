"""Decoding beside competing CPU-bound processes: `translate` (and `serve`) against CTranslate2.

    python scripts/bench_busy.py --model runs/multi30k_de_en --loads 0,1,2 --rounds 2 --serve

The code, what it measures and its options (`--help`): bench/busy.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.busy import main  # noqa: E402

if __name__ == "__main__":
    main()
