"""The CUDA kernels of a torch.profiler trace, a row each, by device time.

    python scripts/read_trace.py runs/profile_step/compiled_bucketed_trace.json.gz --top 20

The code, what it measures and its options (`--help`): bench/trace.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.trace import main  # noqa: E402

if __name__ == "__main__":
    main()
