"""The world the hostile-input cases build on, and running `attn-mt` inside this process.

`World`: a toy corpus, a SentencePiece cache and one finished tiny run, all readable by an
unprivileged user (NOBODY), built once per session. `Workspace`: one case's own folder and
what its run needs. `run_cli`: the real command line (`attn_mt.cli.main`) in this process, with
stdout and stderr captured: a fresh process would spend ~2 s importing torch.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import yaml

from helpers.toy import toy_pairs, write_lines

NOBODY = 65534  # the unprivileged uid and gid of the `user=True` cases


# ---------------------------------------------------------------------------------------------
# The world: a corpus, a SentencePiece cache and one finished tiny run


@dataclass
class World:
    """Files every case builds on (read-only by convention); all readable by NOBODY."""

    root: Path
    corpus: dict[str, Path]  # train.src, train.tgt (300 pairs), valid.* and test.* (8 pairs)
    cache: Path
    run: Path

    def env(self) -> dict[str, str]:
        """The environment of a case: this world's cache, offline."""
        return {"ATTN_MT_CACHE": str(self.cache), "ATTN_MT_OFFLINE": "1"}


def tiny_config(corpus: dict[str, Path], out: Path) -> dict[str, Any]:
    """A model small enough to train 3 steps and validate 8 sentences in about a second."""
    splits = {
        s: {"src": str(corpus[f"{s}.src"]), "tgt": str(corpus[f"{s}.tgt"])}
        for s in ("train", "valid", "test")
    }
    return {
        "data": {"src_lang": "xx", "tgt_lang": "yy", **splits, "max_len": 64},
        "tokenizer": {"vocab_size": 300, "model_type": "bpe", "byte_fallback": True},
        "model": {"d_model": 32, "heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 64},
        "train": {
            "out_dir": str(out),
            "max_steps": 3,
            "warmup": 2,
            "batch_tokens": 512,
            "eval_every": 1000,
            "log_every": 1000,
            "precision": "fp32",
            "samples": 0,
        },
        "decode": {"beam": 2, "max_len_a": 1.0, "max_len_b": 3},
    }


def build_world() -> World:
    """The world, in a new folder outside pytest's temporary folders (their mode 0700 would shut
    NOBODY out); the caller removes `world.root`."""
    from attn_mt.config.file import config_from_dict
    from attn_mt.train.setup import train

    root = Path(tempfile.mkdtemp(prefix="attn-mt-hostile-"))
    root.chmod(0o755)
    corpus = {}
    for split, count, seed in (("train", 300, 1), ("valid", 8, 2), ("test", 8, 3)):
        src, tgt = toy_pairs(count, seed)
        corpus[f"{split}.src"] = write_lines(root / f"{split}.src", src)
        corpus[f"{split}.tgt"] = write_lines(root / f"{split}.tgt", tgt)
    cache = root / "cache"
    cache.mkdir()
    cache.chmod(0o777)  # NOBODY cases may add SentencePiece models
    old_umask = os.umask(0o022)
    try:
        with mock.patch.dict(os.environ, {"ATTN_MT_CACHE": str(cache)}):
            train(config_from_dict(tiny_config(corpus, root / "run")), device="cpu")
    finally:
        os.umask(old_umask)
    return World(root, corpus, cache, root / "run")


# ---------------------------------------------------------------------------------------------
# A case's workspace


class Stdin:
    """A stand-in for sys.stdin whose `buffer` holds `data` (or raises `error` when read)."""

    def __init__(self, data: bytes = b"", error: OSError | None = None):
        self.data = data
        self.buffer = io.BytesIO(data) if error is None else self
        self.error = error

    def __iter__(self) -> Iterator[bytes]:
        raise self.error

    def close(self) -> None:
        """What multiprocessing's forked workers call on sys.stdin (a prepare pool's)."""


@dataclass
class Workspace:
    """One case's own folder (its working directory), the world it builds on, and what its run
    needs: stdin (None: closed), environment, contexts held while it runs, more watched paths."""

    dir: Path
    world: World
    stdin: Stdin | None = field(default_factory=Stdin)
    env: dict[str, str] = field(default_factory=dict)
    hold: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    watched: list[Path] = field(default_factory=list)
    fixture: Callable[[str], Any] | None = None  # pytest's `request.getfixturevalue`

    def trained_run(self) -> Path:
        """conftest's well-trained toy run (read-only: watched like the world)."""
        run = self.fixture("trained_run")
        self.watched.append(run)
        return run

    def file(self, name: str, content: bytes | str, mode: int | None = None) -> Path:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        if mode is not None:
            path.chmod(mode)
        return path

    def folder(self, name: str, mode: int = 0o755) -> Path:
        path = self.dir / name
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)
        return path

    def saved(self, name: str, obj: Any) -> Path:
        """`obj` written with torch.save."""
        torch.save(obj, self.dir / name)
        return self.dir / name

    def raw(self, out: Path | str | None = None, **sections: dict) -> dict[str, Any]:
        """The tiny config writing to OUT (default ./run), with `sections` merged in."""
        raw = tiny_config(self.world.corpus, self.dir / "run")
        raw["train"]["out_dir"] = str(self.dir / "run" if out is None else out)
        for section, values in sections.items():
            raw.setdefault(section, {}).update(values)
        return raw

    def config(self, out: Path | str | None = None, **sections: dict) -> Path:
        """./run.yaml: the tiny config with `sections` merged in, e.g. model={"heads": 3}."""
        return self.file("run.yaml", yaml.safe_dump(self.raw(out, **sections)))

    def yaml(self, text: str) -> Path:
        """A config file of the tiny run with `text` appended (later keys are what is tested)."""
        return self.file("run.yaml", yaml.safe_dump(self.raw()) + text)

    def train_files(self, src: Path, tgt: Path, split: str = "train") -> Path:
        return self.config(data={split: {"src": str(src), "tgt": str(tgt)}})

    def checkpoint(self, name: str = "model.pt", edit: Callable[[dict], Any] | None = None) -> Path:
        """A copy of the tiny run's best.pt, re-saved after `edit(state)` if given."""
        path = Path(shutil.copy(self.world.run / "checkpoints" / "best.pt", self.dir / name))
        if edit is not None:
            state = torch.load(path, map_location="cpu", weights_only=True)
            edit(state)
            torch.save(state, path)
        return path

    def prepared_copy(self) -> Path:
        """The world's cache copied to ./cache (ATTN_MT_CACHE for this case), and in it the tiny
        run's prepared folder (to damage; the world's own stays as it is)."""
        from attn_mt.config.file import config_from_dict
        from attn_mt.data.prepare import plan

        cache = Path(shutil.copytree(self.world.cache, self.dir / "cache"))
        self.env["ATTN_MT_CACHE"] = str(cache)
        with mock.patch.dict(os.environ, {"ATTN_MT_CACHE": str(cache)}):
            folder = plan(config_from_dict(self.raw())).folder
        assert (folder / "manifest.json").is_file(), f"{folder}: not the world's prepared folder"
        return folder

    def run_copy(self, edit_last: Callable[[dict], Any] | None = None) -> Path:
        """The finished tiny run copied to ./run, its last.pt re-saved after `edit_last`."""
        out = Path(shutil.copytree(self.world.run, self.dir / "run"))
        if edit_last is not None:
            last = out / "checkpoints" / "last.pt"
            state = torch.load(last, map_location="cpu", weights_only=True)
            edit_last(state)
            torch.save(state, last)
        return out


# ---------------------------------------------------------------------------------------------
# Running the command line in this process


@contextlib.contextmanager
def as_user(unprivileged: bool) -> Iterator[None]:
    """Run the block as NOBODY (effective ids only, so root can switch back)."""
    if not unprivileged or os.geteuid() != 0:
        yield  # not root: permission bits already apply to this user
        return
    groups = os.getgroups()
    try:
        os.setgroups([])
        os.setegid(NOBODY)
        os.seteuid(NOBODY)
    except PermissionError:
        os.setegid(0)
        os.setgroups(groups)
        pytest.skip("cannot switch to an unprivileged user here (no CAP_SETUID/CAP_SETGID)")
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


def run_cli(
    args: list[Any], stdin: Stdin | None, env: dict[str, str], user: bool = False
) -> subprocess.CompletedProcess[bytes]:
    """`attn-mt ARGS` through `attn_mt.cli.main` in this process, with stdout, stderr, logging
    and warnings captured; the result reads as `clirun.attn_mt`'s does."""
    from attn_mt import cli

    out, err = io.StringIO(), io.StringIO()
    logger = logging.getLogger("attn_mt")
    saved = logger.handlers[:], logger.level, warnings.showwarning
    logger.handlers.clear()  # the CLI attaches a handler to this call's stderr
    code: Any = 0
    try:
        with (
            mock.patch.object(sys, "argv", ["attn-mt", *map(str, args)]),
            mock.patch.object(sys, "stdin", stdin),
            mock.patch.dict(os.environ, env),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            as_user(user),
        ):
            try:
                cli.main()
            except SystemExit as exit_:
                code = exit_.code
    finally:
        logger.handlers[:], logger.level, warnings.showwarning = saved[0], saved[1], saved[2]
    return subprocess.CompletedProcess(
        ["attn-mt", *map(str, args)],
        code if isinstance(code, int) else 1,
        out.getvalue().encode("utf-8", "backslashreplace"),
        err.getvalue().encode("utf-8", "backslashreplace"),
    )
