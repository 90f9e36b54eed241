"""A pretrained model's shape (opus-mt-de-en: 74M parameters, 58,101 pieces): `attn-mt import`'s
time and memory, parity with `MarianMTModel.generate`, and decoding speed against CTranslate2
converting the same folder, with and without a lexical shortlist.

    python scripts/bench_marian.py --quick
    python scripts/bench_marian.py --lines 1000 --parity 500 --threads 2

The code, what it measures and its options (`--help`): bench/marian_decode.py.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `attn-mt` sets it, before torch loads
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.marian_decode import main  # noqa: E402

if __name__ == "__main__":
    main()
