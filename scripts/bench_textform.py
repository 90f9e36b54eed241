"""What decode.recase and decode.protect cost plain text, measured side by side.

    python scripts/bench_textform.py --model RUN [--lines 1000] [--rounds 3]

The code, what it measures and its options (`--help`): bench/textform.py.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `attn-mt` sets it, before torch loads
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.textform import main  # noqa: E402

if __name__ == "__main__":
    main()
