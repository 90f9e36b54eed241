"""Hostile inputs, round two: one table of cases a hostile user would try, run in-process.

Every case runs the real command line (`attn_mt.cli.main`) inside this process (a fresh process
would spend ~2 s importing torch) and must exit 2 with exactly one stderr line, `attn-mt: error:`
and the words that name the problem, print nothing on stdout, and leave every watched file and
folder as it was (content and mode). Cases marked `user=True` run as an unprivileged user
(uid/gid 65534, switched with seteuid while the case runs), because root reads and writes
anything. The few checks that need a second process (a lock held by another process that then
dies by SIGKILL) come after the table.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import io
import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import yaml
from helpers.toy import toy_pairs, write_lines

from attn_mt import cli, load
from attn_mt.checkpoint import save_checkpoint
from attn_mt.config import config_from_dict
from attn_mt.data.tokenizer import train_tokenizer
from attn_mt.decode.search import Hypothesis
from attn_mt.decode.translator import Translator
from attn_mt.fileio import write_output
from attn_mt.train.loop import train
from attn_mt.train.runfolder import lock_run_folder

NOBODY = 65534


# ---------------------------------------------------------------------------------------------
# A world-readable place: a corpus, a SentencePiece cache and one finished tiny run


@dataclass
class World:
    """Files every case builds on (read-only by convention); all readable by NOBODY."""

    root: Path
    corpus: dict[str, Path]
    cache: Path
    run: Path
    raw: dict[str, Any]  # the tiny run's config as plain dicts


def tiny_config(corpus: dict[str, Path], out: Path) -> dict[str, Any]:
    """A model small enough to train 3 steps and validate 8 sentences in about a second."""
    split = {
        s: {"src": str(corpus[f"{s}.src"]), "tgt": str(corpus[f"{s}.tgt"])} for s in corpus_splits()
    }
    return {
        "data": {"src_lang": "xx", "tgt_lang": "yy", **split, "max_len": 64},
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


def corpus_splits() -> tuple[str, ...]:
    return ("train", "valid", "test")


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    root = Path(tempfile.mkdtemp(prefix="attn-mt-hostile-"))
    root.chmod(0o755)
    corpus = {}
    for split, count, seed in (("train", 300, 1), ("valid", 8, 2), ("test", 8, 3)):
        src, tgt = toy_pairs(count, seed)
        corpus[f"{split}.src"] = write_lines(root / f"{split}.src", src)
        corpus[f"{split}.tgt"] = write_lines(root / f"{split}.tgt", tgt)
    cache = root / "cache"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)  # NOBODY cases may add SentencePiece models
    raw = tiny_config(corpus, root / "run")
    old_umask = os.umask(0o022)
    try:
        with mock.patch.dict(os.environ, {"ATTN_MT_CACHE": str(cache)}):
            train(config_from_dict(raw), device="cpu")
    finally:
        os.umask(old_umask)
    yield World(root, corpus, cache, root / "run", raw)
    shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Running the command line in this process


class Stdin:
    """A stand-in for sys.stdin whose `buffer` holds `data` (or raises `error` when read)."""

    def __init__(self, data: bytes = b"", error: OSError | None = None):
        self.buffer = io.BytesIO(data) if error is None else self
        self.error = error

    def __iter__(self) -> Iterator[bytes]:
        raise self.error


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


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


def run_cli(args: list[Any], stdin: Any, env: dict[str, str], user: bool = False) -> Result:
    """`attn-mt ARGS` through `cli.main`, with stdout, stderr, logging and warnings captured."""
    out, err = io.StringIO(), io.StringIO()
    logger = logging.getLogger("attn_mt")
    saved = logger.handlers[:], logger.level, warnings.showwarning
    logger.handlers.clear()  # cli._setup_logging attaches a handler to this call's stderr
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
    return Result(code if isinstance(code, int) else 1, out.getvalue(), err.getvalue())


def snapshot(*roots: Path) -> dict[Path, tuple[str, int]]:
    """Every file (sha256) and folder under `roots`, with its mode."""
    found = {}
    for root in roots:
        if not root.exists():
            continue
        for path in [root, *root.rglob("*")] if root.is_dir() else [root]:
            mode = path.lstat().st_mode
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "/"
            found[path] = (digest, mode)
    return found


# ---------------------------------------------------------------------------------------------
# A case's workspace


@dataclass
class Workspace:
    """One case's own folder, the world it builds on, and what its run needs."""

    dir: Path
    world: World
    stdin: Any = field(default_factory=Stdin)
    env: dict[str, str] = field(default_factory=dict)
    hold: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

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

    def raw(self, out: Path | str | None = None, **sections: dict) -> dict[str, Any]:
        """The tiny config writing to OUT (default ./run), with `sections` merged in."""
        raw = tiny_config(self.world.corpus, self.dir / "run")
        raw["train"]["out_dir"] = str(self.dir / "run" if out is None else out)
        for section, values in sections.items():
            raw.setdefault(section, {}).update(values)
        return raw

    def config(self, out: Path | str | None = None, **sections: dict) -> Path:
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

    def run_copy(self, edit_last: Callable[[dict], Any] | None = None) -> Path:
        """The finished tiny run copied to ./run, its last.pt re-saved after `edit_last`."""
        out = Path(shutil.copytree(self.world.run, self.dir / "run"))
        if edit_last is not None:
            last = out / "checkpoints" / "last.pt"
            state = torch.load(last, map_location="cpu", weights_only=True)
            edit_last(state)
            torch.save(state, last)
        return out


@dataclass
class Case:
    """`make(ws)` prepares files and returns the CLI arguments; the error line must hold every
    one of `words`. `user=True` runs the case as NOBODY."""

    id: str
    make: Callable[[Workspace], list[Any]]
    words: list[str]
    user: bool = False


def train_args(config: Path, *extra: str) -> list[Any]:
    return ["train", "--config", config, "--device", "cpu", *extra]


def translate_args(model: Path) -> list[Any]:
    return ["translate", "--model", model, "--device", "cpu"]


def evaluate_args(model: Path, *extra: Any) -> list[Any]:
    return ["evaluate", "--model", model, "--split", "valid", "--device", "cpu", *extra]


def gz(lines: list[str]) -> bytes:
    return gzip.compress("".join(line + "\n" for line in lines).encode())


def damaged_gz(ws: Workspace, name: str, where: str) -> Path:
    """The training source compressed, then damaged: a flipped bit in the data or CRC."""
    data = bytearray(gz(ws.world.corpus["train.src"].read_text().splitlines()))
    if where == "deflate":
        data[10:14] = b"\xff\xff\xff\xff"  # the first block header: invalid deflate data
    else:
        data[-6] ^= 0xFF  # the stored CRC-32
    return ws.file(name, bytes(data))


def alias_bomb(levels: int) -> str:
    """A YAML flow list whose last item holds 10**levels ones, through nested aliases."""
    items = ["&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    items += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return f"[{', '.join(items)}]"


def nested(depth: int) -> str:
    """A YAML flow list nested `depth` deep."""
    return "[" * depth + "]" * depth


# -- config -----------------------------------------------------------------------------------

CONFIG_CASES = [
    Case(
        "config-duplicate-section",
        lambda ws: train_args(ws.yaml("model:\n  heads: 4\n")),
        ["run.yaml:", "duplicate key 'model' (first at line"],
    ),
    Case(
        "config-duplicate-nested-key",
        lambda ws: train_args(ws.file("dup.yaml", "train:\n  lr: 0.001\n  seed: 2\n  lr: 0.1\n")),
        ["dup.yaml:4: duplicate key 'lr' (first at line 2)"],
    ),
    Case(
        "config-duplicate-key-in-flow-mapping",
        lambda ws: train_args(ws.file("flow.yaml", "model: {heads: 2, d_ff: 64, heads: 4}\n")),
        ["flow.yaml:1: duplicate key 'heads'"],
    ),
    Case(
        "config-nested-10000-deep",
        lambda ws: train_args(ws.file("deep.yaml", f"train:\n  lr: {nested(10_000)}\n")),
        ["deep.yaml:2: nested more than 20 levels deep"],
    ),
    Case(
        "config-mappings-200-deep",
        lambda ws: train_args(
            ws.file("deep.yaml", "".join("  " * i + f"k{i}:\n" for i in range(200)))
        ),
        ["deep.yaml:", "nested more than 20 levels deep"],
    ),
    Case(
        "config-set-nested-value",
        lambda ws: train_args(ws.config(), "--set", f"train.lr={nested(30)}"),
        ["--set train.lr=", "cannot parse"],
    ),
    Case(
        "config-alias-bomb",  # a list of 10**9 items by aliases: its repr must not be built
        lambda ws: train_args(ws.file("bomb.yaml", f"train:\n  lr: {alias_bomb(9)}\n")),
        ["train.lr: [[1, 1, 1, ...], [[...], [...], [...], ...], ", "is a list, expected float"],
    ),
    Case(
        "config-nan-float",
        lambda ws: train_args(ws.config(train={"lr": float("nan")})),
        ["train.lr: nan is invalid; must be a finite number"],
    ),
    Case(
        "config-infinite-float",
        lambda ws: train_args(ws.config(train={"max_minutes": float("inf")})),
        ["train.max_minutes: inf is invalid; must be a finite number"],
    ),
    Case(
        "config-minus-infinity",
        lambda ws: train_args(ws.config(), "--set", "decode.length_penalty=-.inf"),
        ["decode.length_penalty: -inf is invalid; must be a finite number"],
    ),
    Case(
        "config-float-overflows-to-inf",
        lambda ws: train_args(ws.config(), "--set", "train.lr=1e400"),
        ["train.lr: '1e400' is invalid; must be a finite number"],
    ),
    Case(
        "config-set-nan",
        lambda ws: train_args(ws.config(), "--set", "train.clip_norm=.NaN"),
        ["train.clip_norm: nan is invalid; must be a finite number"],
    ),
    Case(
        "config-400-digit-float",
        lambda ws: train_args(ws.config(), "--set", "train.adam_eps=" + "9" * 400),
        ["train.adam_eps: a 1329-bit integer is invalid; must be a finite number"],
    ),
    Case(
        "config-int-too-big-for-torch",
        lambda ws: train_args(ws.config(train={"seed": 2**70})),
        ["train.seed: a 71-bit integer is invalid; must be below 2,147,483,648"],
    ),
    Case(
        "config-threads-too-big",
        lambda ws: train_args(ws.config(train={"threads": 10**12})),
        ["train.threads: 1000000000000 is invalid; must be below 2,147,483,648"],
    ),
    Case(
        "config-5000-digit-int",
        lambda ws: train_args(ws.file("long.yaml", "train:\n  max_steps: " + "9" * 5000 + "\n")),
        ["long.yaml:1: a value cannot be read", "5000 digits"],
    ),
    Case(
        "config-negative-seed",
        lambda ws: train_args(ws.config(train={"seed": -1})),
        ["train.seed: -1 is invalid; must be >= 0"],
    ),
    Case(
        "config-model-cannot-be-allocated",
        lambda ws: train_args(ws.config(model={"d_model": 1 << 20, "heads": 1})),
        ["model: about", "more than can be allocated", "model.d_model"],
    ),
    Case(
        "config-vocabulary-cannot-be-allocated",
        lambda ws: train_args(ws.config(tokenizer={"vocab_size": 2_000_000_000})),
        ["more than can be allocated", "tokenizer.vocab_size 2000000000"],
    ),
    Case(
        "config-position-table-cannot-be-allocated",
        lambda ws: train_args(
            ws.config(model={"positions": "learned", "max_positions": 2_000_000_000})
        ),
        ["more than can be allocated"],
    ),
    Case(
        "config-empty-out_dir",
        lambda ws: train_args(ws.config(out="")),
        ["train.out_dir: '' is invalid; must name a folder"],
    ),
    Case(
        "config-is-a-folder",
        lambda ws: train_args(ws.folder("configs")),
        ["configs: is a folder; give the YAML config file"],
    ),
    Case(
        "config-unreadable",
        lambda ws: train_args(ws.file("secret.yaml", "train: {}\n", mode=0o600)),
        ["secret.yaml: cannot read config (Permission denied)"],
        user=True,
    ),
]

# -- data -------------------------------------------------------------------------------------

DATA_CASES = [
    Case(
        "data-validation-all-blank",
        lambda ws: train_args(
            ws.train_files(ws.file("v.src", "\n \n\t\n"), ws.file("v.tgt", "Ba\n\nCa\n"), "valid")
        ),
        ["v.src: the validation corpus has no non-empty pairs"],
    ),
    Case(
        "data-validation-empty",
        lambda ws: train_args(ws.train_files(ws.file("v.src", ""), ws.file("v.tgt", ""), "valid")),
        ["v.src: the validation corpus has no non-empty pairs"],
    ),
    Case(
        "data-gzip-corrupt-deflate",
        lambda ws: train_args(
            ws.train_files(damaged_gz(ws, "bad.src.gz", "deflate"), ws.world.corpus["train.tgt"])
        ),
        ["bad.src.gz: cannot read, damaged gzip data"],
    ),
    Case(
        "data-gzip-crc-mismatch",
        lambda ws: train_args(
            ws.train_files(damaged_gz(ws, "crc.src.gz", "crc"), ws.world.corpus["train.tgt"])
        ),
        ["crc.src.gz: cannot read, damaged gzip data", "CRC check failed"],
    ),
    Case(
        "data-gzip-truncated",
        lambda ws: train_args(
            ws.train_files(
                ws.file("cut.src.gz", gz(["qb qc"] * 300)[:-12]), ws.world.corpus["train.tgt"]
            )
        ),
        ["cut.src.gz: cannot read, damaged gzip data", "end-of-stream"],
    ),
    Case(
        "data-file-is-a-folder",
        lambda ws: train_args(ws.train_files(ws.folder("src.d"), ws.world.corpus["train.tgt"])),
        ["src.d: is a folder, not a text file"],
    ),
    Case(
        "data-file-unreadable",
        lambda ws: train_args(
            ws.train_files(
                ws.file("private.src", ws.world.corpus["train.src"].read_bytes(), mode=0o600),
                ws.world.corpus["train.tgt"],
            )
        ),
        ["private.src: cannot read (Permission denied)"],
        user=True,
    ),
    Case(
        "data-cache-not-writable",
        lambda ws: (
            ws.env.update(ATTN_MT_CACHE=str(ws.folder("cache", mode=0o555))),
            train_args(ws.config()),
        )[1],
        ["cache/spm: cannot use the SentencePiece cache (Permission denied)", "ATTN_MT_CACHE"],
        user=True,
    ),
    Case(
        "data-cache-is-a-file",
        lambda ws: (
            ws.env.update(ATTN_MT_CACHE=str(ws.file("cachefile", "x"))),
            train_args(ws.config()),
        )[1],
        ["cachefile/spm: cannot use the SentencePiece cache (Not a directory)"],
    ),
]

# -- run folder -------------------------------------------------------------------------------


def held(ws: Workspace, *extra: str) -> list[Any]:
    """The run folder held by another `attn-mt train` (this process, through its own lock)."""
    ws.run_copy() if "--resume" in extra else None
    ws.hold.enter_context(lock_run_folder(ws.dir / "run"))
    return train_args(ws.config(), *extra)


def drop_key(key: str) -> Callable[[dict], Any]:
    return lambda state: state["train_state"].pop(key)


RUN_CASES = [
    Case(
        "run-out_dir-is-a-file",
        lambda ws: train_args(ws.config(out=ws.file("notadir", "x"))),
        ["notadir: train.out_dir exists and is not a folder"],
    ),
    Case(
        "run-out_dir-under-a-file",
        lambda ws: train_args(ws.config(out=ws.file("plain", "x") / "sub" / "run")),
        ["cannot create the run folder", "plain is a file, not a folder"],
    ),
    Case(
        "run-out_dir-not-writable",
        lambda ws: train_args(ws.config(out=ws.folder("locked", mode=0o555))),
        ["locked: cannot write in the run folder (Permission denied)"],
        user=True,
    ),
    Case(
        "run-out_dir-parent-not-writable",
        lambda ws: train_args(ws.config(out=ws.folder("ro", mode=0o555) / "new" / "run")),
        ["cannot create the run folder (permission denied in", "ro)"],
        user=True,
    ),
    Case(
        "run-held-by-another-process",
        held,
        ["run: another attn-mt train (pid", "is running in this folder", "train.out_dir"],
    ),
    Case(
        "run-resume-held-by-another-process",
        lambda ws: held(ws, "--resume"),
        ["run: another attn-mt train (pid", "is running in this folder"],
    ),
    Case(
        "run-stopped-before-its-first-checkpoint",
        lambda ws: (
            ws.file("run/config.yaml", "{}\n"),
            ws.folder("run/checkpoints"),
            train_args(ws.config()),
        )[2],
        ["stopped before its first checkpoint", "delete that folder"],
    ),
    Case(
        "run-resume-last-without-optimizer",
        lambda ws: (ws.run_copy(drop_key("optimizer")), train_args(ws.config(), "--resume"))[1],
        ["last.pt: its training state is damaged", "optimizer"],
    ),
    Case(
        "run-resume-last-without-rng",
        lambda ws: (ws.run_copy(drop_key("rng")), train_args(ws.config(), "--resume"))[1],
        ["last.pt: its training state is damaged", "rng"],
    ),
    Case(
        "run-resume-train-state-not-a-dict",
        lambda ws: (
            ws.run_copy(lambda s: s.update(train_state="oops")),
            train_args(ws.config(), "--resume"),
        )[1],
        ["last.pt: holds no training state"],
    ),
    Case(
        "run-resume-optimizer-of-another-model",
        lambda ws: (
            ws.run_copy(lambda s: s["train_state"]["optimizer"].update(param_groups=[])),
            train_args(ws.config(), "--resume"),
        )[1],
        ["last.pt: its training state is damaged", "ValueError"],
    ),
    Case(
        "run-resume-rng-state-of-wrong-type",
        lambda ws: (
            ws.run_copy(lambda s: s["train_state"].update(rng=[1, 2, 3])),
            train_args(ws.config(), "--resume"),
        )[1],
        ["last.pt: its training state is damaged"],
    ),
    Case(
        "run-resume-weights-of-wrong-shape",
        lambda ws: (
            ws.run_copy(lambda s: s["model"].update({k: v[:1] for k, v in s["model"].items()})),
            train_args(ws.config(), "--resume"),
        )[1],
        ["last.pt: its training state is damaged", "size mismatch"],
    ),
    Case(
        "run-resume-stored-config-nan",
        lambda ws: (
            ws.run_copy(lambda s: s["config"]["train"].update(lr=float("nan"))),
            train_args(ws.config(), "--resume"),
        )[1],
        ["last.pt: its stored config is invalid", "train.lr: nan", "finite"],
    ),
    Case(
        "run-resume-stored-config-empty",
        lambda ws: (
            ws.run_copy(lambda s: s.update(config={})),
            train_args(ws.config(), "--resume"),
        )[1],
        ["last.pt: its stored config is invalid", "data.train.src: missing"],
    ),
    Case(
        "run-resume-last-is-text",
        lambda ws: (
            ws.run_copy(),
            ws.file("run/checkpoints/last.pt", "not a checkpoint\n"),
            train_args(ws.config(), "--resume"),
        )[2],
        ["last.pt: not a checkpoint; it is a text file"],
    ),
    Case(
        "run-resume-last-unreadable",
        lambda ws: (
            ws.run_copy().chmod(0o777),
            (ws.dir / "run" / "checkpoints" / "last.pt").chmod(0o600),
            train_args(ws.config(), "--resume"),
        )[2],
        ["last.pt: cannot read the checkpoint (Permission denied)"],
        user=True,
    ),
]

# -- checkpoints ------------------------------------------------------------------------------


def zip_archive(ws: Workspace, name: str) -> Path:
    with zipfile.ZipFile(ws.dir / name, "w") as archive:
        archive.writestr("weights.txt", "1 2 3\n")
    return ws.dir / name


CHECKPOINT_CASES = [
    Case(
        "checkpoint-gzip-file",
        lambda ws: translate_args(ws.file("model.pt.gz", gz(["qb qc"]))),
        ["model.pt.gz: not a checkpoint; it holds gzip-compressed data"],
    ),
    Case(
        "checkpoint-empty-file",
        lambda ws: translate_args(ws.file("empty.pt", b"")),
        ["empty.pt: not a checkpoint; the file is empty"],
    ),
    Case(
        "checkpoint-plain-pickle-of-data",
        lambda ws: translate_args(ws.file("dict.pt", pickle.dumps({"model": {}, "step": 1}))),
        ["dict.pt: not a checkpoint; it is a plain pickle"],
    ),
    Case(
        "checkpoint-foreign-zip",
        lambda ws: translate_args(zip_archive(ws, "weights.zip")),
        ["weights.zip: not a checkpoint; it is a zip archive that torch.save did not write"],
    ),
    Case(
        "checkpoint-random-bytes",
        lambda ws: translate_args(ws.file("noise.pt", bytes(range(7, 256)) * 20)),
        ["noise.pt: not a checkpoint", "not a PyTorch file"],
    ),
    Case(
        "checkpoint-python-source",
        lambda ws: translate_args(ws.file("script.pt", "import os\nprint(os.getcwd())\n")),
        ["script.pt: not a checkpoint; it is a text file"],
    ),
    Case(
        "checkpoint-config-is-a-list",
        lambda ws: translate_args(ws.checkpoint(edit=lambda s: s.update(config=[1, 2]))),
        ["model.pt: its stored config is invalid", "expected a mapping"],
    ),
    Case(
        "checkpoint-config-nan-dropout",
        lambda ws: translate_args(
            ws.checkpoint(edit=lambda s: s["config"]["model"].update(dropout=float("nan")))
        ),
        ["model.pt: its stored config is invalid", "model.dropout: nan"],
    ),
    Case(
        "checkpoint-config-huge-model",
        lambda ws: translate_args(
            ws.checkpoint(edit=lambda s: s["config"]["model"].update(d_ff=2**30))
        ),
        ["model.pt: its stored config is invalid", "more than can be allocated"],
    ),
    Case(
        "checkpoint-config-unknown-key",
        lambda ws: translate_args(
            ws.checkpoint(edit=lambda s: s["config"]["model"].update(layers=7))
        ),
        ["model.pt: its stored config is invalid", "model.layers: unknown key"],
    ),
    Case(
        "checkpoint-tokenizers-a-string",
        lambda ws: translate_args(ws.checkpoint(edit=lambda s: s.update(tokenizers="spm"))),
        ["model.pt: its SentencePiece models are missing or corrupt"],
    ),
    Case(
        "checkpoint-weights-a-list",
        lambda ws: translate_args(ws.checkpoint(edit=lambda s: s.update(model=[1, 2]))),
        ["model.pt: its tensors do not fit its config"],
    ),
    Case(
        "checkpoint-unknown-format",
        lambda ws: translate_args(ws.checkpoint(edit=lambda s: s.update(format="attn-mt/9"))),
        ["model.pt: checkpoint format 'attn-mt/9', expected 'attn-mt/1'"],
    ),
    Case(
        "checkpoint-unreadable",
        lambda ws: translate_args(ws.checkpoint().chmod(0o600) or ws.dir / "model.pt"),
        ["model.pt: cannot read the checkpoint (Permission denied)"],
        user=True,
    ),
]

# -- output paths: refused before any translating or averaging --------------------------------


def best(ws: Workspace) -> Path:
    return ws.checkpoint()


OUTPUT_CASES = [
    Case(
        "evaluate-out-is-a-folder",
        lambda ws: evaluate_args(best(ws), "--out", ws.folder("hyps")),
        ["--out", "hyps: is a folder; give a file name"],
    ),
    Case(
        "evaluate-out-under-a-file",
        lambda ws: evaluate_args(best(ws), "--out", ws.file("plain", "x") / "hyp.txt"),
        ["--out", "plain is a file, not a folder"],
    ),
    Case(
        "evaluate-out-in-read-only-folder",
        lambda ws: evaluate_args(best(ws), "--out", ws.folder("ro", mode=0o555) / "h.txt"),
        ["--out", "permission denied; cannot write in", "ro"],
        user=True,
    ),
    Case(
        "evaluate-out-read-only-file",
        lambda ws: evaluate_args(best(ws), "--out", ws.file("h.txt", "old\n", mode=0o444)),
        ["--out", "h.txt: permission denied; the file is not writable"],
        user=True,
    ),
    Case(
        "evaluate-default-out-beside-read-only-checkpoint",
        lambda ws: (best(ws), ws.dir.chmod(0o555), evaluate_args(ws.dir / "model.pt"))[2],
        ["model.valid.beam2.hyp.txt: permission denied; cannot write in"],
        user=True,
    ),
    Case(
        "average-out-is-a-folder",
        lambda ws: ["average", "--out", ws.folder("avg"), best(ws), ws.checkpoint("b.pt")],
        ["--out", "avg: is a folder"],
    ),
    Case(
        "average-out-under-a-file",
        lambda ws: ["average", "--out", ws.file("f", "x") / "a.pt", best(ws), best(ws)],
        ["--out", "f is a file, not a folder"],
    ),
    Case(
        "average-out-in-read-only-folder",
        lambda ws: [
            "average",
            "--out",
            ws.folder("ro", mode=0o555) / "a.pt",
            best(ws),
            ws.checkpoint("b.pt"),
        ],
        ["--out", "permission denied; cannot write in"],
        user=True,
    ),
    Case(
        "export-out-under-a-file",
        lambda ws: ["export", "--model", best(ws), "--out", ws.file("f", "x") / "ct2"],
        ["--out", "f is a file, not a folder"],
    ),
    Case(
        "export-out-in-read-only-folder",
        lambda ws: ["export", "--model", best(ws), "--out", ws.folder("ro", mode=0o555) / "ct2"],
        ["--out", "permission denied; cannot write in"],
        user=True,
    ),
    Case(
        "attention-out-is-a-folder",
        lambda ws: ["attention", "--pe", "--d-model", "16", "--out", ws.folder("png")],
        ["--out", "png: is a folder"],
    ),
]

# -- stdin ------------------------------------------------------------------------------------


def with_stdin(ws: Workspace, stdin: Any) -> list[Any]:
    ws.stdin = stdin
    return translate_args(best(ws))


STDIN_CASES = [
    Case(
        "stdin-gzip-data",
        lambda ws: with_stdin(ws, Stdin(gz(["qb qc", "qd"]))),
        ["stdin: gzip-compressed data; decompress it"],
    ),
    Case(
        "stdin-closed",
        lambda ws: with_stdin(ws, None),
        ["stdin: cannot read text"],
    ),
    Case(
        "stdin-not-readable",
        lambda ws: with_stdin(ws, Stdin(error=OSError(errno.EBADF, "Bad file descriptor"))),
        ["stdin: cannot read text (Bad file descriptor)"],
    ),
    Case(
        "stdin-is-a-folder",
        lambda ws: with_stdin(ws, Stdin(error=IsADirectoryError(errno.EISDIR, "Is a directory"))),
        ["stdin: cannot read text (Is a directory)"],
    ),
]

CASES = CONFIG_CASES + DATA_CASES + RUN_CASES + CHECKPOINT_CASES + OUTPUT_CASES + STDIN_CASES


@contextlib.contextmanager
def no_work_may_start() -> Iterator[None]:
    """Every check comes before the work: training SentencePiece or the model, translating,
    averaging, converting. Any of them called here fails the case (not as a UserError)."""

    def work(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the work started before the mistake was found")

    with contextlib.ExitStack() as stack:
        for target in (
            "attn_mt.data.tokenizer.spm.SentencePieceTrainer.train",
            "attn_mt.train.loop.Trainer.run",
            "attn_mt.decode.translator.Translator.translate_nbest",
            "attn_mt.checkpoint.average_checkpoints",
            "attn_mt.decode.export.AttnMTConverter.convert",
        ):
            stack.enter_context(mock.patch(target, work))
        yield


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_hostile_case(case: Case, world: World, tmp_path_factory: pytest.TempPathFactory) -> None:
    ws = Workspace(Path(tempfile.mkdtemp(dir=world.root, prefix=case.id + ".")), world)
    ws.dir.chmod(0o777)  # NOBODY may create files here unless a case says otherwise
    ws.env.update(ATTN_MT_CACHE=str(world.cache), ATTN_MT_OFFLINE="1")
    with ws.hold:
        args = case.make(ws)
        watched = [ws.dir, world.run, *world.corpus.values()]
        before = snapshot(*watched)
        with no_work_may_start():
            result = run_cli(args, ws.stdin, ws.env, user=case.user)
        after = snapshot(*watched)
    assert result.code == 2, f"exit {result.code}\n{result.stderr}"
    assert result.stdout == ""
    # One error line, the last; what came before it can only be start-up progress lines.
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("attn-mt: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for words in case.words:
        assert words in errors[0], f"{words!r} not in {errors[0]!r}"
    assert after == before  # no file changed, created or removed


def test_the_table_is_large_and_covers_every_class() -> None:
    assert len(CASES) >= 60
    prefixes = {case.id.split("-")[0] for case in CASES}
    assert {"config", "data", "run", "checkpoint", "evaluate", "average", "export", "stdin"} <= (
        prefixes
    )
    assert len({case.id for case in CASES}) == len(CASES)
    assert sum(case.user for case in CASES) >= 10


# ---------------------------------------------------------------------------------------------
# Beyond the table: a lock that dies with its process, repairs, file modes, output alignment


# The holder imports attn_mt.train.runfolder without the package's __init__ (which imports torch):
# the real locking code, started in milliseconds instead of seconds.
HOLD_LOCK = (
    "import sys, time, types\n"
    "package = types.ModuleType('attn_mt')\n"
    "package.__path__ = [sys.argv[2]]\n"
    "sys.modules['attn_mt'] = package\n"
    "from attn_mt.train.runfolder import lock_run_folder\n"
    "with lock_run_folder(sys.argv[1]):\n"
    "    print('locked', flush=True)\n"
    "    time.sleep(120)\n"
)


def test_a_lock_held_by_another_process_dies_with_it(world: World, tmp_path: Path) -> None:
    """Another process holds the folder: refused with its pid; SIGKILLed, its lock is gone."""
    out = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_config(world.corpus, out)))
    env = {"ATTN_MT_CACHE": str(world.cache), "ATTN_MT_OFFLINE": "1"}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out), str(Path(cli.__file__).parents[1])],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == b"locked\n"
        for extra in ([], ["--resume"]):
            result = run_cli(train_args(config, *extra), Stdin(), env)
            assert result.code == 2
            assert f"another attn-mt train (pid {holder.pid}) is running" in result.stderr
            assert sorted(p.name for p in out.iterdir()) == [".lock"]  # the holder's alone
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with lock_run_folder(out):  # no stale lock: the kernel dropped it with the process
        assert (out / ".lock").read_text() == f"{os.getpid()}\n"
    assert list(out.iterdir()) == []  # and a folder holding only a lock file counts as new


def test_a_failure_before_the_first_checkpoint_leaves_nothing_behind(
    world: World, tmp_path: Path
) -> None:
    """A run that diverges at step 1 takes its folder (and the parent it made) away again, so
    the retry starts as the first attempt did."""
    out = tmp_path / "deep" / "run"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_config(world.corpus, out)))
    env = {"ATTN_MT_CACHE": str(world.cache), "ATTN_MT_OFFLINE": "1"}

    def nan_loss(logits: torch.Tensor, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        loss = logits.sum() * float("nan")
        return loss, loss.detach()

    with mock.patch("attn_mt.train.loop.label_smoothed_loss", nan_loss):
        result = run_cli(train_args(config, "--set", "train.max_nonfinite=1"), Stdin(), env)
    assert result.code == 2 and "no checkpoint had been written yet" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]


def test_a_partly_written_metrics_line_is_dropped_on_resume(world: World, tmp_path: Path) -> None:
    out = Path(shutil.copytree(world.run, tmp_path / "run"))
    with open(out / "metrics.jsonl", "a") as metrics:
        metrics.write('{"step": 3, "split": "tra')  # a full disk cut the last line short
    with open(out / "train.log", "a") as log:
        log.write("2026-01-01 step 3  epo")
    raw = tiny_config(world.corpus, out)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    env = {"ATTN_MT_CACHE": str(world.cache), "ATTN_MT_OFFLINE": "1"}
    whole = (world.run / "metrics.jsonl").read_text()
    result = run_cli(train_args(config, "--resume"), Stdin(), env)  # finished: no new step
    assert result.code == 0, result.stderr
    assert (out / "metrics.jsonl").read_text() == whole  # the whole lines, as they were
    assert [json.loads(line)["step"] for line in whole.splitlines()] == [3]


def test_run_folder_and_cache_files_follow_the_umask(world: World, tmp_path: Path) -> None:
    """Written under umask 022 (the fixture), every file is 0644, as `open` would make it."""
    files = [p for p in world.run.rglob("*") if p.is_file()] + list(world.cache.rglob("*.model"))
    assert len(files) >= 6
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o644"}
    old = os.umask(0o027)
    try:
        save_checkpoint({"x": torch.zeros(1)}, tmp_path / "a.pt")
        write_output(tmp_path / "hyp.txt", "a\n")
    finally:
        os.umask(old)
    assert {oct((tmp_path / n).stat().st_mode & 0o777) for n in ("a.pt", "hyp.txt")} == {"0o640"}


def test_a_damaged_sentencepiece_cache_entry_is_trained_again(world: World, tmp_path: Path) -> None:
    cache = Path(shutil.copytree(world.cache, tmp_path / "cache"))
    (entry,) = (cache / "spm").rglob("*.model")  # the SentencePiece cache, not the shards
    entry.write_bytes(b"half a model")
    cfg = config_from_dict(tiny_config(world.corpus, tmp_path / "run"))
    lines = world.corpus["train.src"].read_text().splitlines()
    lines += world.corpus["train.tgt"].read_text().splitlines()
    tokenizer = train_tokenizer(cfg.tokenizer, lines, entry.parent)
    assert (
        entry.read_bytes()
        == tokenizer.model_bytes
        == (world.cache / entry.relative_to(cache)).read_bytes()
    )


def newline_pieces(translator: Translator) -> list[int]:
    """Piece ids of a hypothesis that decodes to '\\nqb\\r\\nqc\\r' (byte pieces)."""
    sp = translator.tgt_tokenizer.sp
    newline, carriage_return = sp.piece_to_id("<0x0A>"), sp.piece_to_id("<0x0D>")
    assert sp.unk_id() not in (newline, carriage_return)
    qb, qc = translator.tgt_tokenizer.encode(["qb", "qc"])
    return [newline, *qb, carriage_return, newline, *qc, carriage_return]


def test_output_has_one_line_per_input_line_whatever_the_model_emits(world: World) -> None:
    translator = load(world.run / "checkpoints" / "best.pt", device="cpu")
    tokens = newline_pieces(translator)
    assert "\n" in translator.tgt_tokenizer.decode([tokens])[0]  # what the model could emit

    def search(model: Any, src: torch.Tensor, *args: Any) -> list[list[Hypothesis]]:
        return [[Hypothesis(tokens, -1.0, -1.0)] for _ in range(src.shape[0])]

    lines = ["qb qc", "", "qd qf qg", "qh"]
    stdin = Stdin("".join(line + "\n" for line in lines).encode())
    with (
        mock.patch("attn_mt.decode.translator.beam_search", search),
        mock.patch(
            "attn_mt.decode.translator.greedy_search", lambda *a: [h[0] for h in search(*a)]
        ),
    ):
        beam = translator.translate(lines, beam=2)
        greedy = translator.translate(lines, beam=1)
        result = run_cli(translate_args(world.run), stdin, {"ATTN_MT_OFFLINE": "1"})
    assert result.code == 0, result.stderr
    assert beam == greedy
    assert [bool(text) for text in beam] == [True, False, True, True]
    assert all("qb" in t and "qc" in t and "\n" not in t and "\r" not in t for t in beam if t)
    assert result.stdout.split("\n") == [*beam, ""]  # the CLI prints what the API returns


@pytest.mark.parametrize(
    ("lines", "words"),
    [("qb qc", "not one str"), (b"qb qc", "not one str"), (["qb", None], "must be a str")],
    ids=["str", "bytes", "list-with-None"],
)
def test_the_api_refuses_what_is_not_a_list_of_lines(world: World, lines: Any, words: str) -> None:
    translator = load(world.run, device="cpu")
    for method in (translator.translate, translator.translate_nbest):
        with pytest.raises(TypeError, match=words) as err:
            method(lines)
        assert "\n" not in str(err.value)
