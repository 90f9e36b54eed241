"""A real `attn-mt serve` process for the serving tests: started on a free port of 127.0.0.1
(the server picks it: `--port 0`, then names it on stderr), talked to over HTTP, stopped
with SIGTERM.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.clirun import child_env
from helpers.workspace import World

# `python -m attn_mt`, not the console script: the package under test, in this process's path.
CLI = [sys.executable, "-m", "attn_mt"]
STARTUP_S = 120  # importing torch and loading on a busy 2-core machine


@dataclass
class Server:
    """A started server: its process, base URL and stderr log."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def start_server(
    run: Path | Sequence[Path], folder: Path, *args: str, env: dict[str, str] | None = None
) -> Server:
    """Start `attn-mt serve --model RUN ARGS` (a --model for each of several runs) on a free
    port and wait until it listens."""
    log = folder / f"serve-{time.monotonic_ns()}.log"
    models = [f"--model={path}" for path in ([run] if isinstance(run, Path) else run)]
    command = [*CLI, "serve", *models, "--port", "0", "--device", "cpu", *args]
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env or child_env(),
        )
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if found := re.search(r"serving on (http://\S+) ", log.read_text()):
            return Server(proc, found.group(1), log)
        if proc.poll() is not None:
            raise AssertionError(f"serve exited {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"serve did not start in {STARTUP_S} s:\n{log.read_text()}")


def relabeled(checkpoint: Path, out: Path, src_lang: str, tgt_lang: str) -> Path:
    """A copy of a bilingual checkpoint whose config names another pair (the same weights):
    a model of another pair for the routing tests."""
    import torch

    from attn_mt.checkpoint import save_checkpoint

    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    state["config"]["data"].update(src_lang=src_lang, tgt_lang=tgt_lang)
    save_checkpoint(state, out)
    return out


def translate_cli(run: Path, lines: list[str], *args: str, env: dict[str, str]) -> str:
    """What `attn-mt translate --model RUN ARGS` writes for `lines`."""
    result = subprocess.run(
        [*CLI, "translate", "--model", str(run), "--device", "cpu", *args],
        input="".join(f"{line}\n" for line in lines).encode(),
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


@pytest.fixture(scope="session")
def served(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The tiny run served with float32 products unpacked (as `translate_cli` is run), a
    beam limit past the vocabulary (300 pieces) so that the library's own check shows."""
    folder = tmp_path_factory.mktemp("serve")
    server = start_server(
        world.run, folder, "--prepack", "off", "--max-beam", "400", env=child_env(**world.env())
    )
    yield server
    assert server.stop() == 0, server.log.read_text()
