"""What the tests share: the toy task, running the command line, the torchrun workers."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository root
