"""What a training step's milliseconds are made of: the WMT workload under torch.profiler, one
`--mode` (eager, compiled, cudagraphs) per process.

    python scripts/profile_step.py --device cuda --size base --vocab 32000 --mode compiled

The code, what it measures and its options (`--help`): bench/step_profile.py.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `attn-mt` sets it, before torch loads
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.step_profile import main  # noqa: E402

if __name__ == "__main__":
    main()
