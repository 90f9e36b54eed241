"""The first-GPU-run checklist (docs/gpu.md); `bash scripts/gpu_check.sh` installs the project,
then runs this.

    python scripts/gpu_check.py --out DIR [--minutes M] [--cpu-only] [--only WORD ...]

The code, what it measures and its options (`--help`): bench/gpu_check.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

from bench.gpu_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
