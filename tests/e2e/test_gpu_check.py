"""scripts/gpu_check.sh without a GPU: it runs the CPU-side checks, says the rest needs a GPU,
writes its report and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow

CPU_CHECKS = [
    "environment",
    "GPU presets load",
    "cached == full decoding",
    "mask-free decoder == masked",
]


def test_gpu_check_runs_its_cpu_part_and_exits_0(tmp_path: Path):
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--out", str(tmp_path), "--cpu-only"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the rest needs a GPU (--cpu-only)" in proc.stdout
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    status = {r["check"]: r["status"] for r in results}
    assert [name for name, s in status.items() if s == "pass"] == CPU_CHECKS, results
    assert set(status.values()) == {"pass", "skipped"}
    assert all(r["why"] == "needs a CUDA GPU" for r in results if r["status"] == "skipped")
    report = (tmp_path / "gpu_check.md").read_text()
    assert "| cached == full decoding | pass |" in report
    assert "| deterministic exact resume | skipped |" in report
