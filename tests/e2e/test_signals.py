"""SIGTERM leaves nothing behind: the output's temp file of `translate --output` is removed
and the command exits 143 (128 + 15) with one line, no traceback."""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
from pathlib import Path

from helpers.clirun import CLI, child_env
from helpers.workspace import World


def test_sigterm_during_translate_output_leaves_no_temp_file(world: World) -> None:
    folder = Path(tempfile.mkdtemp(dir=world.root, prefix="signals."))
    source = folder / "in.txt"
    source.write_text("qb qc qd qb qc qd qb qc\n" * 20000)
    model = world.run / "checkpoints" / "best.pt"
    args = ["translate", "--model", model, "--device", "cpu", "--input", source]
    child = subprocess.Popen(
        [*CLI, *map(str, [*args, "--output", folder / "out.txt"])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    deadline = time.monotonic() + 120
    while not [p for p in folder.iterdir() if p.name.endswith(".tmp")]:
        assert child.poll() is None and time.monotonic() < deadline, "no temp file appeared"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    stderr = child.communicate(timeout=60)[1].decode()
    assert child.returncode == 143, stderr
    assert "Traceback" not in stderr and "attn-mt: terminated" in stderr
    assert sorted(p.name for p in folder.iterdir()) == ["in.txt"]
