"""Running the real `attn-mt` in child processes, for the end-to-end error and fault tests:
the command, its environment (offline, the test cache), a check that a user error is one line
and exit 2, a snapshot of the files a case must not change, and the toy corpus and runs the
cases build on (the hostile cases' `world` too; `helpers/workspace.py` runs them in-process).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from attn_mt.checkpoint import load_checkpoint
from helpers.toy import (
    assert_identical,
    load_raw,
    resumable_state,
    toy_config_dict,
    toy_pairs,
    write_lines,
)
from helpers.workspace import World, build_world

CONSOLE_SCRIPT = Path(sys.executable).parent / "attn-mt"
CLI = [str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.is_file() else [sys.executable, "-m", "attn_mt"]
# The runs here: dropout on (so an exact resume needs the RNG state), a save at steps 8, 16, 24.
RUN_TRAIN = {"max_steps": 24, "eval_every": 8, "log_every": 1, "warmup": 10}
RUN_STEPS = RUN_TRAIN["max_steps"]


# ---------------------------------------------------------------------------------------------
# Running the command line


def child_env(**extra: str) -> dict[str, str]:
    """The environment of every child: this one (with the test cache), offline, plus `extra`."""
    return {**os.environ, "ATTN_MT_OFFLINE": "1", **extra}


def attn_mt(
    *args: Any, cwd: Path, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run `attn-mt ARGS` to the end, bytes in and out."""
    return subprocess.run(
        [*CLI, *map(str, args)],
        input=stdin,
        capture_output=True,
        cwd=cwd,
        env=env or child_env(),
        timeout=300,
    )


def start(*args: Any, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start `attn-mt ARGS` in the background, stderr to `log` (a pipe could fill and block)."""
    with open(log, "wb") as stderr:
        return subprocess.Popen(
            [*CLI, *map(str, args)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            cwd=cwd,
            env=child_env(),
        )


def train_args(config: Path, *extra: str) -> list[Any]:
    return ["train", "--config", config, "--device", "cpu", *extra]


def assert_user_error(result: subprocess.CompletedProcess[bytes], *fragments: str) -> str:
    """Exit 2, nothing on stdout, and one `attn-mt: error:` line (the last) holding `fragments`."""
    stderr = result.stderr.decode("utf-8", "replace")
    assert "Traceback" not in stderr, stderr
    assert result.returncode == 2, f"exit {result.returncode}\n{stderr}"
    assert result.stdout == b""
    errors = [line for line in stderr.splitlines() if line.startswith("attn-mt: error: ")]
    assert len(errors) == 1 and stderr.splitlines()[-1] == errors[0], stderr
    for fragment in fragments:
        assert fragment in errors[0], f"{fragment!r} not in {errors[0]!r}"
    return errors[0]


def snapshot(*roots: Path) -> dict[Path, tuple[str, int]]:
    """Every file (sha256) and folder under `roots`, with its mode: a user error must change
    none of them (a root that does not exist is left out, so creating it shows)."""
    found = {}
    for root in roots:
        if not root.exists():
            continue
        for path in [root, *root.rglob("*")] if root.is_dir() else [root]:
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "/"
            found[path] = (digest, path.lstat().st_mode)
    return found


# ---------------------------------------------------------------------------------------------
# Data, configs and runs


@pytest.fixture(scope="module")
def corpus(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Toy training files, a 10-pair validation split (validation stays fast), CRLF copies."""
    folder = tmp_path_factory.mktemp("bad-inputs-data")
    src, tgt = toy_pairs(10, seed=2)
    files = {
        "train.src": toy_data["train.src"],
        "train.tgt": toy_data["train.tgt"],
        "valid.src": write_lines(folder / "valid.src", src),
        "valid.tgt": write_lines(folder / "valid.tgt", tgt),
    }
    for name, path in list(files.items()):
        crlf = folder / f"crlf.{name}"
        crlf.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
        files[f"crlf.{name}"] = crlf
    return files


@pytest.fixture(scope="session")
def world() -> Iterator[World]:
    """The hostile-input cases' corpus, SentencePiece cache and tiny finished run."""
    built = build_world()
    yield built
    shutil.rmtree(built.root, ignore_errors=True)


def config_dict(corpus: dict[str, Path], out_dir: Path, crlf: bool = False, **train) -> dict:
    """The toy config of the runs here, writing to `out_dir`; `train` keys override."""
    prefix = "crlf." if crlf else ""
    files = {
        f"{split}.{side}": corpus[f"{prefix}{'valid' if split == 'test' else split}.{side}"]
        for split in ("train", "valid", "test")
        for side in ("src", "tgt")
    }
    raw = toy_config_dict(files, out_dir, **{**RUN_TRAIN, **train})
    raw["model"]["dropout"] = 0.1
    return raw


def write_yaml(path: Path, raw: Any) -> Path:
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def straight_run(corpus: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run through the CLI: the reference for every resume (read-only)."""
    folder = tmp_path_factory.mktemp("straight")
    config = write_yaml(folder / "run.yaml", config_dict(corpus, folder / "run"))
    result = attn_mt(*train_args(config), cwd=folder)
    assert result.returncode == 0, result.stderr.decode()
    return folder / "run"


def checkpoint_names(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def wait_for(
    condition: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, log: Path
) -> None:
    """Poll `condition` about every millisecond; fail if `proc` ends first or after 5 minutes."""
    deadline = time.monotonic() + 300
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"attn-mt exited ({proc.returncode}) before {what}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.001)


def assert_whole_checkpoints(out: Path) -> dict[str, Any]:
    """Every checkpoint file loads (checksums verified, weights only); returns last.pt."""
    names = checkpoint_names(out)
    stray = [n for n in names if not n.endswith(".pt") and not n.endswith(".tmp")]
    assert not stray, names
    for name in names:
        if not name.startswith("."):
            load_checkpoint(out / "checkpoints" / name)
    last = load_checkpoint(out / "checkpoints" / "last.pt")
    assert "train_state" in last
    return last


def assert_same_training_state(path: Path, reference: Path) -> None:
    """Two last.pt files hold the same step, weights, optimizer, RNG and data position."""
    assert_identical(resumable_state(load_raw(path)), resumable_state(load_raw(reference)))


def translate_args(model: Path, *extra: str) -> list[Any]:
    return ["translate", "--model", model, "--device", "cpu", *extra]
