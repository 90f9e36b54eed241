"""A long run's throughput and memory, minute by minute: attn-mt's own training loop beside a
plain `torch.nn.Transformer` loop.

    python scripts/bench_soak.py --minutes 10 --profile-at 1,8

The code, what it measures and its options (`--help`): bench/soak.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from attn_mt.cpuenv import set_cpu_environment  # noqa: E402

set_cpu_environment()  # as the `attn-mt` command sets it, before torch loads
from bench.soak import main  # noqa: E402

if __name__ == "__main__":
    main()
