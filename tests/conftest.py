"""Shared fixtures: the toy task's files, a tiny config, and one trained toy run
(`tests/helpers/toy.py` holds the task and the shared checks).

The toy task maps each source word to a fixed target word, keeping the order, so a tiny model
learns it in seconds and reaches a high BLEU on held-out sentences: enough to test training,
search, translate, evaluate, averaging, plots and export end to end inside the CI budget.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml
from helpers.toy import script_validation, toy_config_dict, toy_pairs, write_lines

from attn_mt.config.file import config_from_dict
from attn_mt.config.schema import Config

# The fixtures of the end-to-end command-line tests (a toy corpus and a finished run).
pytest_plugins = ("helpers.clirun", "helpers.serving")


# The attn-mt variables the suite reads from the user's environment: where Multi30k is.
# Every other ATTN_MT_* a user exported (the README's ATTN_MT_OFFLINE=1) is cleared, so a test
# sees only what it sets itself; the suite sets ATTN_MT_CACHE and ATTN_MT_FP32_PRODUCTS below.
KEPT_VARIABLES = ("ATTN_MT_DATA",)


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep SentencePiece models and downloads out of the user's real cache, and the user's
    other attn-mt variables out of every test (and the processes it starts)."""
    for name in [n for n in os.environ if n.startswith("ATTN_MT_")]:
        if name not in KEPT_VARIABLES:
            del os.environ[name]
    os.environ["ATTN_MT_CACHE"] = str(tmp_path_factory.mktemp("attn-mt-cache"))
    # float32 training multiplies through nn.Linear unless a test asks for oneDNN: a choice
    # timed in each process could differ between a run and its resumed half on a noisy machine.
    os.environ["ATTN_MT_FP32_PRODUCTS"] = "mkl"
    # Searches keep their thread count whatever the other workers do (cpuenv.ThreadSizer): a
    # straight translation and a resumed one must not meet different float sums at a near-tie.
    os.environ["ATTN_MT_FIXED_THREADS"] = "1"
    threads = _threads_per_process()
    os.environ["OMP_NUM_THREADS"] = str(threads)  # the children this process starts, too
    torch.set_num_threads(threads)


def _threads_per_process() -> int:
    """Two torch threads, or the cores' fair share when pytest-xdist runs several workers
    (`make test`): two workers of two threads each would oversubscribe two cores."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, len(os.sched_getaffinity(0)) // workers))


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """A test that trains in this process (`train.threads`) leaves torch's thread count as it
    found it: a later test's float sums, and so a near-tie in a search, depend on it."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Files of the toy task: train (3000 pairs), valid (100) and test (100)."""
    folder = tmp_path_factory.mktemp("toy-data")
    files = {}
    for split, count, seed in (("train", 3000, 1), ("valid", 100, 2), ("test", 100, 3)):
        src, tgt = toy_pairs(count, seed)
        files[f"{split}.src"] = write_lines(folder / f"{split}.src", src)
        files[f"{split}.tgt"] = write_lines(folder / f"{split}.tgt", tgt)
    return files


@pytest.fixture
def toy_config(toy_data: dict[str, Path], tmp_path: Path):
    """A factory: toy_config(**train_overrides) -> validated Config writing under tmp_path."""

    def make(**train) -> Config:
        return config_from_dict(toy_config_dict(toy_data, tmp_path / "run", **train))

    return make


@pytest.fixture
def scripted_validation(monkeypatch: pytest.MonkeyPatch):
    """scripted_validation(bleus) installs `script_validation` for one test."""

    def install(bleus: tuple[float, ...] = ()) -> None:
        script_validation(monkeypatch, bleus)

    return install


@pytest.fixture(scope="session")
def trained_run(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder with a toy model trained to a high BLEU (shared by many tests; read-only)."""
    from attn_mt.train.setup import train

    out = tmp_path_factory.mktemp("trained") / "run"
    raw = toy_config_dict(toy_data, out, max_steps=400, eval_every=200, keep_checkpoints=2)
    config_file = out.parent / "toy.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    result = train(config_from_dict(raw))
    assert result.best_score > 80, (
        f"the toy model should learn the task, got BLEU {result.best_score}"
    )
    return out
