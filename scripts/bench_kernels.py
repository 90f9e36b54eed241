"""The kernels behind a slow compiled step on CUDA, one at a time: attention, layer norm.

    python scripts/bench_kernels.py --only attention

The code, what it measures and its options (`--help`): bench/kernels.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.kernels import main  # noqa: E402

if __name__ == "__main__":
    main()
