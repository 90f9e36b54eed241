"""Hostile inputs and user errors: one table of what a hostile or careless user would try.

Every error case runs the real command line (`attn_mt.cli.main`) inside this process (a fresh
process would spend ~2 s importing torch) and must exit 2 with exactly one `attn-mt: error:`
stderr line, the last, holding the words that name the problem, print nothing on stdout, start
no work, and leave every watched file and folder as it was (content and mode). Cases marked
`user=True` run as an unprivileged user (uid/gid 65534, switched with seteuid while the case
runs), because root reads and writes anything. Cases marked `process=True` run `attn-mt` in a
child process: they translate odd input and check the bytes the real stdout gets, or get as
far as encoding the corpus, in a pool of processes forked from the command's own (forked from
pytest's, which runs threads, a child can deadlock).
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import yaml
from helpers.clirun import (
    assert_user_error,
    attn_mt,
    child_env,
    snapshot,
    train_args,
    translate_args,
)
from helpers.workspace import Stdin, Workspace, World, run_cli

from attn_mt.checkpoint import FORMAT
from attn_mt.jobs.record import FORMAT as PARTIAL_FORMAT
from attn_mt.runfolder import lock_run_folder

# The private names this module patches, in one place to update when the package moves: the
# work that no user error may start (SentencePiece and model training, translating, averaging,
# converting). Any of them called while an error case runs fails the case.
WORK = (
    "attn_mt.data.tokenizer.spm.SentencePieceTrainer.train",
    "attn_mt.train.loop.Trainer.run",
    "attn_mt.decode.translator.Translator.translate_nbest",
    "attn_mt.checkpoint.average_checkpoints",
    "attn_mt.export.ct2.AttnMTConverter.convert",
)


@dataclass
class Case:
    """`make(ws)` prepares files and returns the CLI arguments. Expected: a user error whose
    line holds every one of `error`, or (`error=None`) a success that `check` examines.
    `user=True` runs the case as NOBODY; `process=True` in a child process."""

    id: str
    make: Callable[[Workspace], list[Any]]
    error: list[str] | None
    check: Callable[[subprocess.CompletedProcess[bytes]], None] | None = None
    user: bool = False
    process: bool = False
    marks: tuple[Any, ...] = ()


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


class CreatesFile:
    """Unpickling this calls open(path, "w"): a stand-in for any code a crafted file could run."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def malicious_checkpoint(ws: Workspace, name: str, plain_pickle: bool) -> Path:
    """A checkpoint-shaped file whose unpickling would create ./PWNED (checked to be live)."""
    probe = ws.dir / "probe"
    pickle.loads(pickle.dumps(CreatesFile(probe))).close()  # a plain unpickler runs it
    assert probe.exists()
    probe.unlink()
    payload = {
        "format": FORMAT,
        "model": CreatesFile(ws.dir / "PWNED"),
        "config": {},
        "step": 0,
        "tokenizers": {},
    }
    path = ws.dir / name
    if plain_pickle:
        path.write_bytes(pickle.dumps(payload))
    else:
        torch.save(payload, path)
    return path


def flip_tensor_bytes(path: Path) -> Path:
    """Flip 16 bytes inside the largest tensor record of a zip checkpoint (in place)."""
    with zipfile.ZipFile(path) as archive:
        record = max(
            (i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size
        )
    data = bytearray(path.read_bytes())
    header = record.header_offset
    name_len = int.from_bytes(data[header + 26 : header + 28], "little")
    extra_len = int.from_bytes(data[header + 28 : header + 30], "little")
    middle = header + 30 + name_len + extra_len + record.file_size // 2
    data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
    path.write_bytes(data)
    return path


def tagged(ws: Workspace, tag: str) -> dict[str, str]:
    """The tiny run's training files as one corpus of a list, with `tag`."""
    corpus = ws.world.corpus
    return {"src": str(corpus["train.src"]), "tgt": str(corpus["train.tgt"]), "tag": tag}


# -- config -----------------------------------------------------------------------------------

CONFIG_CASES = [
    Case(  # as JoeyNMT users type it: told to use --config, not --resume
        "config-positional",
        lambda ws: ["train", ws.config(), "--device", "cpu"],
        ["run.yaml is a config file; give it as `attn-mt train --config", "run.yaml`"],
    ),
    Case(
        "config-positional-with-resume",
        lambda ws: ["train", ws.config(), "--resume", "--device", "cpu"],
        ["run.yaml is a config file; give it as `attn-mt train --config"],
    ),
    Case("prepare-no-config", lambda ws: ["prepare"], ["prepare: give --config FILE"]),
    Case(  # SentencePiece has these pieces already: a tag must be a piece of its own
        "config-tag-is-a-special-piece",
        lambda ws: train_args(ws.config(data={"train": [tagged(ws, "<s>")]})),
        ["data.train[0].tag", "not a piece SentencePiece has"],
    ),
    Case(
        "config-tag-is-the-unknown-piece",
        lambda ws: train_args(ws.config(data={"train": [tagged(ws, "<unk>")]})),
        ["data.train[0].tag", "not a piece SentencePiece has"],
    ),
    Case(
        "config-tag-is-the-padding-piece",
        lambda ws: train_args(ws.config(data={"train": [tagged(ws, "<pad>")]})),
        ["data.train[0].tag", "not a piece SentencePiece has"],
    ),
    Case(
        "config-tag-is-a-byte-piece",
        lambda ws: train_args(ws.config(data={"train": [tagged(ws, "<0x0A>")]})),
        ["data.train[0].tag", "not a piece SentencePiece has"],
    ),
    Case(
        "prepare-workers-beyond-the-machine",
        lambda ws: ["prepare", "--config", ws.config(), "--workers", str(2**40)],
        ["--workers 1099511627776: this process may run on", "give at most"],
    ),
    Case(
        "data-info-set-without-config",
        lambda ws: ["data", "info", "--set", "data.max_len=8"],
        ["data info: --set needs --config FILE"],
    ),
    Case(
        "prepare-set-unknown-key",
        lambda ws: ["prepare", "--config", ws.config(), "--set", "data.max_lenn=8"],
        ["data.max_lenn: unknown key; did you mean data.max_len?"],
    ),
    Case(
        "config-missing",
        lambda ws: train_args(ws.dir / "missing.yaml"),
        ["missing.yaml: config file not found"],
    ),
    Case(
        "config-binary-garbage",
        lambda ws: train_args(ws.file("garbage.yaml", bytes(range(256)) * 4)),
        ["garbage.yaml: cannot read config", "can't decode byte"],
    ),
    Case(
        "config-control-characters",
        lambda ws: train_args(ws.file("nul.yaml", b"data:\x00\x01\x02\n")),
        ["nul.yaml: YAML syntax error: special characters are not allowed"],
    ),
    Case(
        "config-yaml-syntax-error",
        lambda ws: train_args(ws.file("broken.yaml", "data:\n  max_len: [1, 2\nmodel: {}\n")),
        ["broken.yaml:3: YAML syntax error"],
    ),
    Case(
        "config-not-a-mapping",
        lambda ws: train_args(ws.file("list.yaml", "- data\n- model\n")),
        ["list.yaml: the top level must be a mapping of sections, not a list"],
    ),
    Case(
        "config-unknown-key",
        lambda ws: train_args(ws.config(model={"d_modle": 64})),
        ["model.d_modle: unknown key; did you mean model.d_model?"],
    ),
    Case(
        "config-wrong-type",
        lambda ws: train_args(ws.config(model={"heads": "four"})),
        ["model.heads: 'four' is a string, expected int"],
    ),
    Case(
        "config-heads-not-dividing-d_model",
        lambda ws: train_args(ws.config(model={"heads": 3})),
        ["model.heads: 3 is invalid; must divide model.d_model (32)"],
    ),
    Case(
        "config-negative-dropout",
        lambda ws: train_args(ws.config(model={"dropout": -0.1})),
        ["model.dropout: -0.1 is invalid; must be in [0, 1)"],
    ),
    Case(
        "config-beam-0",
        lambda ws: train_args(ws.config(decode={"beam": 0})),
        ["decode.beam: 0 is invalid; must be >= 1"],
    ),
    Case(
        "config-vocab-too-small",
        lambda ws: train_args(ws.config(tokenizer={"vocab_size": 3})),
        ["tokenizer.vocab_size: 3 is invalid", "special symbols"],
    ),
    Case(
        "config-set-without-equals",
        lambda ws: train_args(ws.config(), "--set", "train.lr"),
        ["--set train.lr: expected KEY=VALUE"],
    ),
    Case(
        "config-set-unknown-key",
        lambda ws: train_args(ws.config(), "--set", "train.lrr=0.1"),
        ["train.lrr: unknown key; did you mean train.lr?"],
    ),
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


def offline_corpus(ws: Workspace) -> list[Any]:
    """A named corpus that is nowhere here, with downloads off."""
    ws.env.update(ATTN_MT_DATA=str(ws.folder("data")), ATTN_MT_CACHE=str(ws.folder("cache")))
    raw = ws.raw()
    raw["data"] = {"dataset": "multi30k", "src_lang": "de", "tgt_lang": "en"}
    return train_args(ws.file("multi30k.yaml", yaml.safe_dump(raw)))


def damaged_manifest(ws: Workspace, edit: Callable[[dict[str, Any]], Any]) -> list[Any]:
    """The tiny run's training command over a copy of its prepared folder whose manifest.json
    (still valid JSON) was edited by `edit`."""
    manifest = ws.prepared_copy() / "manifest.json"
    fields = json.loads(manifest.read_text())
    edit(fields)
    manifest.write_text(json.dumps(fields))
    return train_args(ws.config())


def prepared_file(ws: Workspace) -> list[Any]:
    """A file where the tiny run's prepared folder belongs."""
    folder = ws.prepared_copy()
    shutil.rmtree(folder)
    folder.write_text("not a folder\n")
    return train_args(ws.config())


DATA_CASES = [
    Case(
        "data-file-missing",
        lambda ws: train_args(ws.train_files(ws.dir / "no.src", ws.dir / "no.tgt")),
        ["no.src: file not found"],
    ),
    Case(
        "data-line-counts-differ",
        lambda ws: train_args(
            ws.train_files(ws.world.corpus["train.src"], ws.file("short.tgt", "Ba\nCa\n"))
        ),
        ["has 300 lines but", "short.tgt has 2", "one target line per source line"],
    ),
    Case(
        "data-empty-corpus",
        lambda ws: train_args(ws.train_files(ws.file("e.src", ""), ws.file("e.tgt", ""))),
        ["e.src: the training corpus has no non-empty pairs"],
    ),
    Case(
        "data-every-pair-too-long",
        lambda ws: train_args(ws.config(data={"max_len": 1})),
        ["every training pair was filtered out", "data.max_len is 1"],
        process=True,  # found while encoding, in a pool forked from the process
    ),
    Case(
        "data-invalid-utf8",
        lambda ws: train_args(
            ws.train_files(
                ws.file("latin1.src", b"qb qc\nq\xe9b\n"), ws.file("latin1.tgt", "Ba Ca\nBa\n")
            )
        ),
        ["latin1.src:2: invalid UTF-8", "convert the file to UTF-8"],
    ),
    Case(
        "data-named-corpus-offline",
        offline_corpus,
        ["multi30k: val.de.gz not found", "data/multi30k", "no download: ATTN_MT_OFFLINE is set"],
    ),
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
        ["cache/prepared: cannot use the prepared-data cache (Permission denied)", "ATTN_MT_CACHE"],
        user=True,
    ),
    Case(  # train never trains on a prepared folder it cannot vouch for; `prepare` rebuilds it
        "data-prepared-manifest-field-missing",
        lambda ws: damaged_manifest(ws, lambda m: m.pop("tokens")),
        ["manifest.json: unreadable manifest (tokens: missing or not a list)", "attn-mt prepare"],
    ),
    Case(
        "data-prepared-manifest-field-wrong-type",
        lambda ws: damaged_manifest(ws, lambda m: m.update(pairs="300")),
        ["manifest.json: unreadable manifest (pairs: missing or not a", "attn-mt prepare"],
    ),
    Case(
        "data-prepared-manifest-count-wrong-type",
        lambda ws: damaged_manifest(ws, lambda m: m["corpora"][0].update(kept=300.0)),
        ["manifest.json: unreadable manifest (corpora: an entry without", "attn-mt prepare"],
    ),
    Case(  # the files still hold uint16 tokens: read as int32 they would be other ids
        "data-prepared-dtype-changed",
        lambda ws: damaged_manifest(ws, lambda m: m.update(dtype="int32")),
        ["manifest.json: src.bin does not hold", "int32 tokens", "attn-mt prepare"],
    ),
    Case(
        "data-prepared-dtype-unknown",
        lambda ws: damaged_manifest(ws, lambda m: m.update(dtype="float64")),
        ["manifest.json: unreadable manifest (dtype: 'float64', expected uint16 or int32)"],
    ),
    Case(
        "data-prepared-folder-is-a-file",
        prepared_file,
        ["a file, not a prepared folder", "attn-mt prepare"],
    ),
    Case(
        "data-cache-is-a-file",
        lambda ws: (
            ws.env.update(ATTN_MT_CACHE=str(ws.file("cachefile", "x"))),
            train_args(ws.config()),
        )[1],
        ["cachefile/prepared: cannot use the prepared-data cache (Not a directory)"],
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


def shared_run(ws: Workspace) -> Path:
    """The finished tiny run, copied, every file and folder writable by NOBODY."""
    run = ws.run_copy()
    for path in [run, *run.rglob("*")]:
        path.chmod(0o777 if path.is_dir() else 0o666)
    return run


def read_only_run(ws: Workspace, name: str) -> list[Any]:
    """The shared run with `name` made read-only, to resume."""
    (shared_run(ws) / name).chmod(0o444)
    return train_args(ws.config(), "--resume")


def torchrun_env(ws: Workspace, **variables: str) -> list[Any]:
    """The tiny run with torchrun's variables as a user might set them by hand."""
    ws.env.update(variables)
    return train_args(ws.config())


RUN_CASES = [
    Case(
        "run-torchrun-rank-not-a-number",
        lambda ws: torchrun_env(ws, WORLD_SIZE="2", RANK="abc", MASTER_ADDR="x", MASTER_PORT="1"),
        ["RANK='abc': not a number; torchrun sets it"],
    ),
    Case(
        "run-torchrun-world-size-without-rank",
        lambda ws: torchrun_env(ws, WORLD_SIZE="2"),
        ["WORLD_SIZE is set but RANK is not; start the run with torchrun"],
    ),
    Case(
        "run-torchrun-without-master-addr",
        lambda ws: torchrun_env(ws, WORLD_SIZE="2", RANK="1"),
        ["WORLD_SIZE=2 but MASTER_ADDR is not set"],
    ),
    Case(
        "run-resume-read-only-train-log",
        lambda ws: read_only_run(ws, "train.log"),
        ["train.log: permission denied; the run writes it"],
        user=True,
    ),
    Case(
        "run-resume-read-only-metrics",
        lambda ws: read_only_run(ws, "metrics.jsonl"),
        ["metrics.jsonl: permission denied; the run writes it"],
        user=True,
    ),
    Case(
        "run-out_dir-holds-a-run",
        lambda ws: (ws.run_copy(), train_args(ws.config()))[1],
        ["already holds a run", "--resume", "choose another train.out_dir"],
    ),
    Case(
        "run-resume-nothing",
        lambda ws: train_args(ws.config(), "--resume"),
        ["nothing to resume", "start without --resume"],
    ),
    Case(
        "run-resume-changed-model",
        lambda ws: (
            ws.run_copy(),
            train_args(ws.config(model={"d_ff": 128, "heads": 4}), "--resume"),
        )[1],
        ["cannot resume with a changed config", "model.heads", "model.d_ff"],
    ),
    Case(
        "run-resume-corrupt-last",
        lambda ws: (
            flip_tensor_bytes(ws.run_copy() / "checkpoints" / "last.pt"),
            train_args(ws.config(), "--resume"),
        )[1],
        ["last.pt: corrupt", "fails its checksum"],
    ),
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
    Case(  # a running train has written its folder: still named as running, not as a run to resume
        "run-held-by-a-train-that-wrote-its-folder",
        lambda ws: (ws.run_copy(), held(ws))[1],
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
            (shared_run(ws) / "checkpoints" / "last.pt").chmod(0o600),
            train_args(ws.config(), "--resume"),
        )[1],
        ["last.pt: cannot read the checkpoint (Permission denied)"],
        user=True,
    ),
]

# -- checkpoints ------------------------------------------------------------------------------


def zip_archive(ws: Workspace, name: str) -> Path:
    with zipfile.ZipFile(ws.dir / name, "w") as archive:
        archive.writestr("weights.txt", "1 2 3\n")
    return ws.dir / name


def truncated(ws: Workspace, name: str) -> Path:
    """The first half of a checkpoint."""
    whole = ws.checkpoint().read_bytes()
    return ws.file(name, whole[: len(whole) // 2])


CHECKPOINT_CASES = [
    Case(
        "checkpoint-missing",
        lambda ws: translate_args(ws.dir / "nothere.pt"),
        ["nothere.pt: checkpoint not found"],
    ),
    Case(
        "checkpoint-folder-without-best",
        lambda ws: translate_args(ws.dir),
        ["no checkpoints/best.pt in this folder"],
    ),
    Case(
        "checkpoint-truncated",
        lambda ws: translate_args(truncated(ws, "truncated.pt")),
        ["truncated.pt: not a readable checkpoint, truncated or corrupt"],
    ),
    Case(
        "checkpoint-corrupted-bytes",
        lambda ws: translate_args(flip_tensor_bytes(ws.checkpoint("flipped.pt"))),
        ["flipped.pt: corrupt", "fails its checksum"],
    ),
    Case(
        "checkpoint-text-file",
        lambda ws: translate_args(ws.file("notes.pt", "hello, not a checkpoint\n")),
        ["notes.pt: not a checkpoint; it is a text file"],
    ),
    Case(
        "checkpoint-plain-tensor",
        lambda ws: translate_args(ws.saved("tensor.pt", torch.zeros(3))),
        ["tensor.pt: not an attn-mt checkpoint"],
    ),
    Case(
        "checkpoint-tensors-do-not-fit-config",
        lambda ws: translate_args(
            ws.checkpoint("misfit.pt", lambda s: s["config"]["model"].update(d_ff=256))
        ),
        ["misfit.pt: its tensors do not fit its config"],
    ),
    Case(
        "checkpoint-tokenizer-garbage",
        lambda ws: translate_args(
            ws.checkpoint("spm.pt", lambda s: s["tokenizers"].update(src=b"junk", tgt=b"junk"))
        ),
        ["spm.pt: its SentencePiece models are missing or corrupt"],
    ),
    Case(
        "checkpoint-malicious-torch-save",
        lambda ws: translate_args(malicious_checkpoint(ws, "evil.pt", plain_pickle=False)),
        ["evil.pt: refused to load", "could run code"],
    ),
    Case(
        "checkpoint-malicious-plain-pickle",
        lambda ws: translate_args(malicious_checkpoint(ws, "evil.pkl", plain_pickle=True)),
        ["evil.pkl: refused to load", "could run code"],
    ),
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
    Case(  # a search allocates per output step: an absurd limit is refused, not overflowed
        "checkpoint-config-absurd-output-limit",
        lambda ws: translate_args(
            ws.checkpoint(edit=lambda s: s["config"]["decode"].update(max_len_a=1e300))
        ),
        ["model.pt: its stored config is invalid", "decode.max_len_a: 1e+300 is invalid"],
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

# -- evaluate inputs, devices, output paths: refused before any translating or averaging ------


def best(ws: Workspace) -> Path:
    return ws.checkpoint()


OUTPUT_CASES = [
    Case(
        "evaluate-line-counts-differ",
        lambda ws: (
            ["evaluate", "--model", best(ws), "--src", ws.world.corpus["valid.src"]]
            + ["--ref", ws.file("one.ref", "Ba\n"), "--device", "cpu"]
        ),
        ["has 8 lines but", "one.ref has 1"],
    ),
    Case(
        "device-cuda-without-gpu",
        lambda ws: ["translate", "--model", best(ws), "--device", "cuda"],
        ["--device cuda: no CUDA GPU is available here; use --device cpu"],
        marks=(pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present"),),
    ),
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
    Case(
        "attention-pe-impossible-d-model",
        lambda ws: ["attention", "--pe", "--d-model", str(2**40), "--out", ws.dir / "pe.png"],
        ["--d-model 1099511627776", "too many to draw; at most 10,000,000"],
    ),
    Case(
        "evaluate-empty-src-and-ref",
        lambda ws: (
            ["evaluate", "--model", best(ws), "--device", "cpu"]
            + ["--src", ws.file("empty.src", ""), "--ref", ws.file("empty.ref", "")]
        ),
        ["empty.src: no lines; there is nothing to evaluate"],
    ),
    Case(  # as export does: an existing file is replaced only with --force
        "average-out-exists-without-force",
        lambda ws: ["average", "--out", ws.file("avg.pt", "old"), best(ws), ws.checkpoint("b.pt")],
        ["--out", "avg.pt: file exists; add --force to replace it"],
    ),
    Case(
        "translate-input-missing",
        lambda ws: translate_args(best(ws), "--input", ws.dir / "missing.txt"),
        ["--input", "missing.txt: file not found"],
    ),
    Case(
        "translate-input-is-a-folder",
        lambda ws: translate_args(best(ws), "--input", ws.folder("texts")),
        ["--input", "texts: is a folder; give a text file"],
    ),
    Case(
        "translate-input-damaged-gzip",
        lambda ws: translate_args(best(ws), "--input", damaged_gz(ws, "in.gz", "crc")),
        ["--input", "in.gz: cannot read", "CRC check failed"],
    ),
    Case(  # a beam keeps at most one hypothesis per piece: the first step could not fill it
        "translate-beam-wider-than-vocabulary",
        lambda ws: translate_args(best(ws), "--beam", "1000"),
        ["decode.beam: 1000 is wider than tokenizer.vocab_size (300)"],
    ),
    Case(
        "translate-beam-past-2-to-the-31",
        lambda ws: translate_args(best(ws), "--beam", str(2**31 + 1)),
        ["decode.beam", "2,147,483,648"],
    ),
    Case(
        "train-eval-beam-wider-than-vocabulary",
        lambda ws: train_args(ws.config(train={"eval_beam": 301})),
        ["train.eval_beam: 301 is wider than tokenizer.vocab_size (300)"],
    ),
    Case(
        "translate-temperature-infinite",
        lambda ws: translate_args(best(ws), "--sample", "--temperature", "inf"),
        ["temperature inf: must be a finite number > 0"],
    ),
    Case(  # silently ignored before: greedy or beam output where samples were wanted
        "translate-top-k-without-sample",
        lambda ws: translate_args(best(ws), "--top-k", "5"),
        ["--top-k, --top-p and --temperature shape sampling; add --sample"],
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
    Case(  # a read that fails part-way (a terminal that hung up). A stdin that is a folder never
        # gets this far: Python stops at start-up, before attn-mt runs (docs/guarantees.md).
        "stdin-read-fails-with-eio",
        lambda ws: with_stdin(ws, Stdin(error=OSError(errno.EIO, "Input/output error"))),
        ["stdin: cannot read text (Input/output error)"],
    ),
]

# -- translate: odd input that must translate, in a child process (the real stdout's bytes) ---

ANY_TEXT = ...  # an expected output line: any non-blank text (None: anything, "": blank)


def assert_translations(
    result: subprocess.CompletedProcess[bytes], expected: list[Any], warning: str | None
) -> None:
    """Exit 0; stdout is UTF-8 without \\r, one line per input line, blank exactly where due."""
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 0, stderr
    assert "Traceback" not in stderr and "attn-mt: error" not in stderr, stderr
    text = result.stdout.decode("utf-8")  # strict: invalid input never makes invalid output
    assert "\r" not in text and text.endswith("\n") == bool(expected)
    lines = text.split("\n")[:-1]
    assert len(lines) == len(expected), lines
    for number, (line, want) in enumerate(zip(lines, expected, strict=True), start=1):
        if want is ANY_TEXT:
            assert line.strip(), f"output line {number} is blank"
        elif want is not None:
            assert line == want, f"output line {number}: {line!r}"
    if warning is not None:
        assert re.search(warning, stderr), stderr


def translation(name: str, stdin: bytes, expected: list[Any], warning: str | None = None) -> Case:
    """A `translate` case over conftest's well-trained toy model (beam search, the default);
    `warning` is a pattern that stderr must match."""

    def make(ws: Workspace) -> list[Any]:
        ws.stdin = Stdin(stdin)
        return translate_args(ws.trained_run())

    def check(result: subprocess.CompletedProcess[bytes]) -> None:
        assert_translations(result, expected, warning)

    return Case(name, make, None, check, process=True)


def streams(ws: Workspace, *extra: Any) -> list[Any]:
    """The tiny run's checkpoints/ folder as --model, three lines on stdin."""
    ws.stdin = Stdin(b"qb qc\nqd\nqf\n")
    return translate_args(ws.world.run / "checkpoints", *extra)


def assert_nothing_written(result: subprocess.CompletedProcess[bytes]) -> None:
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 0 and result.stdout == b"" and "error" not in stderr, stderr
    assert Path("/dev/null").is_char_device()  # written in place, never replaced


TRANSLATE_CASES = [
    translation("translate-empty-input", b"", []),
    Case(  # configs read .gz; so does --input. And RUN/checkpoints means its best.pt
        "translate-gzip-input-from-checkpoints-folder",
        lambda ws: translate_args(
            ws.trained_run() / "checkpoints", "--input", ws.file("in.gz", gz(["qb qc", "", "qd"]))
        ),
        None,
        lambda result: assert_translations(result, [ANY_TEXT, "", ANY_TEXT], None),
        process=True,
    ),
    Case(  # streams are streams: read once as they come, devices written in place
        "translate-dev-stdin-to-dev-null",
        lambda ws: streams(ws, "--input", "/dev/stdin", "--output", "/dev/null"),
        None,
        assert_nothing_written,
        process=True,
    ),
    Case(  # checked by the search itself (rows per line), so in a process of its own
        "translate-nbest-in-millions",
        lambda ws: streams(ws, "--nbest", "3000000"),
        ["--beam 3000000 --nbest 3000000", "no wider than the target vocabulary (300 pieces)"],
        process=True,
    ),
    Case(
        "translate-output-dev-full",
        lambda ws: streams(ws, "--output", "/dev/full"),
        ["--output /dev/full: cannot write (No space left on device)"],
        process=True,
        marks=(pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full"),),
    ),
    translation(
        "translate-blank-whitespace-crlf-lines",
        b"qb qc\r\n\n   \n\t\r\n\r\nqd",  # and no final newline
        [ANY_TEXT, "", "", "", "", ANY_TEXT],
    ),
    translation(  # translated whole, in pieces of the model's limit (sentences.py): never cut
        "translate-10000-character-line",
        b"qb " * 3333 + b"q\nqd\n",
        [ANY_TEXT, ANY_TEXT],
        r"\A(?![\s\S]*truncated)",
    ),
    translation(
        "translate-invalid-utf8-and-control-characters",
        b"qb\nq\xff\xfec\nqd\x00\x07\x1b[2J\nqf\n",
        [ANY_TEXT, None, None, ANY_TEXT],
        r"line 2: invalid UTF-8, replaced with U\+FFFD",
    ),
]

CASES = (
    CONFIG_CASES
    + DATA_CASES
    + RUN_CASES
    + CHECKPOINT_CASES
    + OUTPUT_CASES
    + STDIN_CASES
    + TRANSLATE_CASES
)


@contextlib.contextmanager
def no_work_may_start() -> Iterator[None]:
    """Every check comes before the work: any of `WORK` called here fails the case (not as a
    user error)."""

    def work(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the work started before the mistake was found")

    with contextlib.ExitStack() as stack:
        for target in WORK:
            stack.enter_context(mock.patch(target, work))
        yield


@pytest.mark.parametrize("case", [pytest.param(c, marks=c.marks, id=c.id) for c in CASES])
def test_case(case: Case, world: World, request: pytest.FixtureRequest) -> None:
    ws = Workspace(
        Path(tempfile.mkdtemp(dir=world.root, prefix=case.id + ".")),
        world,
        env=world.env(),
        fixture=request.getfixturevalue,
    )
    ws.dir.chmod(0o777)  # NOBODY may create files here unless a case says otherwise
    with ws.hold:
        args = case.make(ws)
        watched = [ws.dir, world.run, *world.corpus.values(), *ws.watched]
        before = snapshot(*watched)
        if case.process:
            result = attn_mt(*args, cwd=ws.dir, env=child_env(**ws.env), stdin=ws.stdin.data)
        else:
            with no_work_may_start():
                result = run_cli(args, ws.stdin, ws.env, user=case.user)
        after = snapshot(*watched)
    if case.error is None:
        case.check(result)
    else:
        assert_user_error(result, *case.error)
    assert after == before  # no file changed, created or removed
    assert not (ws.dir / "PWNED").exists()


def test_the_table_is_large_and_covers_every_class() -> None:
    assert len(CASES) >= 117
    prefixes = {case.id.split("-")[0] for case in CASES}
    assert {
        "config",
        "data",
        "run",
        "checkpoint",
        "evaluate",
        "average",
        "export",
        "attention",
        "device",
        "stdin",
        "translate",
    } <= prefixes
    assert len({case.id for case in CASES}) == len(CASES)
    assert sum(case.user for case in CASES) >= 10


# -- an output that is one of the command's inputs: refused before any work (round four) -------


def linked(ws: Workspace, name: str, target: Path) -> Path:
    """./NAME, a symbolic link to `target`."""
    (ws.dir / name).symlink_to(target)
    return ws.dir / name


def own_valid(ws: Workspace) -> tuple[Path, Path]:
    """Copies of the world's valid split in the case's folder (watched with it)."""
    return (
        Path(shutil.copy(ws.world.corpus["valid.src"], ws.dir / "v.src")),
        Path(shutil.copy(ws.world.corpus["valid.tgt"], ws.dir / "v.ref")),
    )


OUTPUT_PATH_CASES = [
    Case(
        "evaluate-out-is-the-model",
        lambda ws: evaluate_args(best(ws), "--out", ws.dir / "model.pt"),
        ["--out", "model.pt: is the --model file being read; give another file"],
    ),
    Case(
        "evaluate-out-links-to-the-model",
        lambda ws: evaluate_args(best(ws), "--out", linked(ws, "hyp.txt", ws.dir / "model.pt")),
        ["--out", "hyp.txt: is the --model file being read"],
    ),
    Case(
        "evaluate-out-is-the-ref",
        lambda ws: (
            (files := own_valid(ws)),
            ["evaluate", "--model", best(ws), "--device", "cpu", "--src", files[0]]
            + ["--ref", files[1], "--out", files[1]],
        )[1],
        ["--out", "v.ref: is the --ref file being read"],
    ),
    Case(
        "translate-output-is-the-input",
        lambda ws: translate_args(
            best(ws), "--input", ws.file("in.txt", "qb\n"), "--output", ws.dir / "in.txt"
        ),
        ["--output", "in.txt: is the --input file being read"],
    ),
    Case(
        "translate-output-links-to-the-input",
        lambda ws: translate_args(
            best(ws),
            "--input",
            ws.file("in.txt", "qb\n"),
            "--output",
            linked(ws, "out.txt", ws.dir / "in.txt"),
        ),
        ["--output", "out.txt: is the --input file being read"],
    ),
]


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=c.marks, id=c.id) for c in OUTPUT_PATH_CASES]
)
def test_output_path_case(case: Case, world: World, request: pytest.FixtureRequest) -> None:
    test_case(case, world, request)


# The command line's own mistakes (an unknown option or command, a bad choice, a missing value
# or argument): Click's multi-line usage box becomes the one line, with the closest name.
CLI_CASES = [
    Case(
        "cli-unknown-option",
        lambda ws: ["translate", "--model", best(ws), "--bem", "4"],
        ["translate: unknown option --bem; did you mean --beam?"],
    ),
    Case(
        "cli-unknown-option-far-from-any",
        lambda ws: ["evaluate", "--model", best(ws), "--zzzzzz"],
        ["evaluate: unknown option --zzzzzz", "attn-mt evaluate --help"],
    ),
    Case(
        "cli-bad-choice",
        lambda ws: ["translate", "--model", best(ws), "--precision", "bf61"],
        [
            "translate: --precision bf61: must be one of fp32, bf16, fp16, auto",
            "did you mean bf16?",
        ],
    ),
    Case(
        "cli-bad-choice-with-equals",
        lambda ws: ["export", "--model", best(ws), "--out", ws.dir / "x", "--format=ct3"],
        ["export: --format ct3: must be one of ct2, hf; did you mean ct2?"],
    ),
    Case(
        "cli-missing-value",
        lambda ws: ["translate", "--model"],
        ["--model", "requires an argument"],
    ),
    Case(
        "cli-not-a-number",
        lambda ws: ["translate", "--model", best(ws), "--beam", "five"],
        ["translate: invalid value for '--beam'", "integer"],
    ),
    Case(
        "cli-missing-argument",
        lambda ws: ["average", "--out", ws.dir / "avg.pt"],
        ["average: missing argument", "attn-mt average --help"],
    ),
    Case(
        "cli-unknown-command",
        lambda ws: ["transalte", "--model", best(ws)],
        ["unknown command transalte; did you mean translate?"],
    ),
    Case(
        "cli-unknown-subcommand",
        lambda ws: ["data", "fecth", "multi30k"],
        ["data: unknown command fecth; did you mean fetch?"],
    ),
    Case(  # every typo in one go, the file's and --set's, not one a run
        "config-every-unknown-key-at-once",
        lambda ws: train_args(
            ws.config(model={"d_modle": 32}, train={"lrr": 0.1}), "--set", "train.batch_tokns=8"
        ),
        [
            "3 unknown keys: ",
            "model.d_modle: unknown key; did you mean model.d_model?",
            "train.lrr: unknown key; did you mean train.lr?",
            "train.batch_tokns: unknown key; did you mean train.batch_tokens?",
        ],
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, marks=c.marks, id=c.id) for c in CLI_CASES])
def test_cli_case(case: Case, world: World, request: pytest.FixtureRequest) -> None:
    test_case(case, world, request)


# -- round four: decode options, messages and bounds that a hostile user still hit ------------

DECODE_MESSAGE_CASES = [
    Case(  # 0 once meant "the default width" and drew 256 columns
        "attention-pe-d-model-zero",
        lambda ws: ["attention", "--pe", "--d-model", "0", "--out", ws.dir / "pe.png"],
        ["--d-model 0: must be an even number of at least 2"],
    ),
    Case(  # a second --model was silently the only one exported
        "export-two-models",
        lambda ws: ["export", "--model", best(ws), "--model", best(ws), "--out", ws.dir / "ct2"],
        ["export: --model given 2 times", "attn-mt average"],
    ),
    Case(
        "config-min-lr-above-lr",
        lambda ws: train_args(ws.config(train={"lr": 1e-4, "min_lr": 1e-3})),
        ["train.min_lr: 0.001 is invalid; must not exceed train.lr (0.0001)"],
    ),
    Case(  # 1e308 minutes are inf seconds: the ETA clock raised OverflowError mid-run
        "config-max-minutes-beyond-the-clock",
        lambda ws: train_args(ws.config(), "--set", "train.max_minutes=1e308"),
        ["train.max_minutes: 1e+308 is invalid; must be at most 1e+09"],
    ),
]


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=c.marks, id=c.id) for c in DECODE_MESSAGE_CASES]
)
def test_decode_message_case(case: Case, world: World, request: pytest.FixtureRequest) -> None:
    test_case(case, world, request)


def warned_once(words: str) -> Callable[[subprocess.CompletedProcess[bytes]], None]:
    """A check: exit 0, and exactly one stderr line holding `words`."""

    def check(result: subprocess.CompletedProcess[bytes]) -> None:
        stderr = result.stderr.decode("utf-8", "replace")
        assert result.returncode == 0, stderr
        assert sum(words in line for line in stderr.splitlines()) == 1, stderr

    return check


DECODE_PROCESS_CASES: list[Case] = [
    Case(  # three lines without terms: most likely terms separated by spaces, not TABs
        "translate-constraints-without-tab-warns-once",
        lambda ws: streams(ws, "--constraints"),
        None,
        warned_once("--constraints: a line without a TAB is a source alone"),
        process=True,
    ),
]


def steered(ws: Workspace, stdin: bytes) -> list[Any]:
    """The tiny run with a prefix and terms on every line, no room beyond what they need, and
    'qb qd' avoided."""
    ws.stdin = Stdin(stdin)
    return translate_args(
        ws.world.run / "checkpoints",
        *["--prefix", "--constraints", "--avoid", ws.file("avoid.txt", "qb qd\n")],
        *["--set", "decode.max_len_a=0", "--set", "decode.max_len_b=1"],
    )


DECODE_PROCESS_CASES += [
    Case(  # the prefix must be followed at once by the term, which the avoided words forbid
        "translate-prefix-term-avoid-unsatisfiable",
        lambda ws: steered(ws, b"qb qc\tqb\tqd\n"),
        ["line 1: no output of at most", "starts with its prefix, holds every term"],
        process=True,
    ),
    Case(  # was a silent blank output line
        "translate-blank-source-with-prefix",
        lambda ws: steered(ws, b"qb\tqc\tqd\n\tqc\tqd\n"),
        ["line 2: the source is blank but has a prefix or terms"],
        process=True,
    ),
]


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=c.marks, id=c.id) for c in DECODE_PROCESS_CASES]
)
def test_decode_process_case(case: Case, world: World, request: pytest.FixtureRequest) -> None:
    test_case(case, world, request)


# -- round four: unusual names and keys a newcomer meets -----------------------------------

ROUND_FOUR_CASES = [
    Case(  # SentencePiece stopped with an INTERNAL check naming its own input_sentence_size
        "config-tokenizer-max-sentences-below-sentencepiece-minimum",
        lambda ws: train_args(ws.config(tokenizer={"max_sentences": 50})),
        ["tokenizer.max_sentences: 50 is invalid; must be >= 101", "SentencePiece refuses"],
    ),
    Case(  # the newline split the one error line in two
        "translate-input-name-with-newline",
        lambda ws: translate_args(best(ws), "--input", ws.dir / "in\nput.txt"),
        ["--input '", "in\\nput.txt': file not found"],
    ),
    Case(
        "translate-output-under-a-file-named-with-newline",
        lambda ws: translate_args(best(ws), "--output", ws.file("a\u2028b", "x\n") / "out.txt"),
        ["--output '", "a\\u2028b/out.txt':"],
    ),
    Case(  # said "resume it with `attn-mt train --resume`", which needs the folder or config
        "model-run-folder-with-only-last-pt",
        lambda ws: translate_args(partial_run(ws, "last.pt")),
        ["run: no checkpoints/best.pt yet", "--model", "run/checkpoints/last.pt", "--resume"],
    ),
    Case(  # said "is it a run folder?" of a run folder
        "model-run-folder-with-no-checkpoint",
        lambda ws: translate_args(partial_run(ws)),
        ["run: a run folder with no checkpoint yet", "first validation or when it stops"],
    ),
    Case(
        "model-folder-that-is-no-run",
        lambda ws: translate_args(ws.folder("plain")),
        ["plain: no checkpoints/best.pt in this folder; give a run folder", "or a .pt file"],
    ),
    Case(
        "model-run-folder-with-only-best-pt",
        lambda ws: [*translate_args(partial_run(ws, "best.pt")), "--input", ws.file("in", "qb\n")],
        None,
        lambda result: assert_translations(result, [ANY_TEXT], None),
        process=True,
    ),
    Case(  # said "already holds a run; continue it with `attn-mt train --resume`"
        "train-config-is-a-run-folders-saved-config",
        lambda ws: train_args(ws.world.run / "config.yaml"),
        ["config.yaml: that is the saved config of the run in", "`attn-mt train --resume "],
    ),
]


def partial_run(ws: Workspace, *checkpoints: str) -> Path:
    """./run: the tiny run's config.yaml and only `checkpoints` of its checkpoints/."""
    run = ws.folder("run")
    shutil.copy(ws.world.run / "config.yaml", run)
    for name in checkpoints:
        shutil.copy(ws.world.run / "checkpoints" / name, ws.folder("run/checkpoints"))
    return run


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=c.marks, id=c.id) for c in ROUND_FOUR_CASES]
)
def test_round_four_case(case: Case, world: World, request: pytest.FixtureRequest) -> None:
    test_case(case, world, request)


# -- compare and evaluate's metrics: one line each, before any translating -------------------


def compare_args(ws: Workspace, *systems: Any, ref: Any = None, extra: tuple = ()) -> list[Any]:
    """`compare --ref REF SYSTEM...` (REF: the world's valid references)."""
    reference = ws.world.corpus["valid.tgt"] if ref is None else ref
    return ["compare", "--ref", reference, *systems, *extra]


def hyps(ws: Workspace, name: str, count: int = 8) -> Path:
    """A hypothesis file of `count` lines."""
    return ws.file(name, "".join(f"w{i}\n" for i in range(count)))


COMPARE_CASES = [
    Case(
        "compare-line-counts-differ",
        lambda ws: compare_args(ws, hyps(ws, "a.txt"), hyps(ws, "b.txt", 7)),
        ["b.txt has 7 lines; a system needs one line per reference line (8 in", "valid.tgt"],
    ),
    Case(
        "compare-empty-system",
        lambda ws: compare_args(ws, hyps(ws, "a.txt"), ws.file("empty.txt", "")),
        ["empty.txt: no lines; a system's output needs one line per reference line"],
    ),
    Case(
        "compare-empty-reference",
        lambda ws: compare_args(ws, hyps(ws, "a.txt"), ref=ws.file("ref.txt", "")),
        ["--ref", "ref.txt: no lines; there is nothing to compare against"],
    ),
    Case(
        "compare-missing-reference",
        lambda ws: compare_args(ws, hyps(ws, "a.txt"), ref=ws.dir / "nope.txt"),
        ["--ref", "nope.txt: file not found"],
    ),
    Case(
        "compare-missing-system",
        lambda ws: compare_args(ws, hyps(ws, "a.txt"), ws.dir / "gone.txt"),
        ["gone.txt: file not found"],
    ),
    Case(  # a beam for files alone was ignored, as if the files had been searched with it
        "compare-beam-without-a-model",
        lambda ws: compare_args(ws, hyps(ws, "a.txt"), hyps(ws, "b.txt"), extra=("--beam", "5")),
        ["--beam 5: every system is a hypothesis file; no model translates"],
    ),
    Case(  # nothing to translate: refused before the model loads
        "compare-model-without-src",
        lambda ws: compare_args(ws, hyps(ws, "a.txt"), best(ws)),
        ["model.pt is a model; give --src FILE, the sources it translates"],
    ),
    Case(
        "compare-src-line-count-differs",
        lambda ws: compare_args(ws, best(ws), extra=("--src", hyps(ws, "src.txt", 3))),
        ["--src", "src.txt has 3 lines; it needs one line per reference line"],
    ),
    Case(
        "compare-unknown-metric",
        lambda ws: compare_args(ws, hyps(ws, "a.txt"), extra=("--metrics", "bleu,meteor")),
        ["--metrics bleu,meteor: unknown metric 'meteor'; use bleu, chrf, chrf++, ter, comet"],
    ),
    Case(
        "compare-unknown-test",
        lambda ws: compare_args(ws, hyps(ws, "a.txt"), extra=("--paired", "t-test")),
        ["--paired", "t-test", "bs, ar"],
    ),
    Case(
        "evaluate-comet-without-a-model",
        lambda ws: evaluate_args(best(ws), "--metrics", "comet"),
        ["--metrics comet needs --comet-model PATH", "downloads nothing"],
    ),
    Case(
        "evaluate-comet-model-not-there",
        lambda ws: evaluate_args(
            best(ws), "--metrics", "bleu,comet", "--comet-model", ws.folder("comet")
        ),
        ["--comet-model", "comet: no COMET checkpoint there", "checkpoints/model.ckpt"],
    ),
    Case(  # unbabel-comet is an optional extra, not installed here
        "evaluate-comet-not-installed",
        lambda ws: evaluate_args(
            best(ws), "--metrics", "comet", "--comet-model", ws.file("model.ckpt", b"")
        ),
        ["--metrics comet needs unbabel-comet: pip install 'attn-mt[comet]'"],
    ),
    Case(
        "evaluate-unknown-metric",
        lambda ws: evaluate_args(best(ws), "--metrics", "bleu,,bluer"),
        ["--metrics bleu,,bluer: unknown metric 'bluer'"],
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, marks=c.marks, id=c.id) for c in COMPARE_CASES])
def test_compare_case(case: Case, world: World, request: pytest.FixtureRequest) -> None:
    test_case(case, world, request)


# -- round five (issue 80 items 5 and 6): messages that tell the truth, no tracebacks ----------


def run_holding(ws: Workspace, *names: str) -> Path:
    """./run.yaml, the tiny config writing to ./run, which holds only `names` of the tiny run's
    files (config.yaml, checkpoints/best.pt, ...)."""
    for name in names:
        target = ws.dir / "run" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ws.world.run / name, target)
    return ws.config()


def score_args(ws: Workspace, *extra: Any, src: Any = None, ref: Any = None) -> list[Any]:
    """`score` of the tiny run's best.pt on the world's valid split (or `src`, `ref`)."""
    src = ws.world.corpus["valid.src"] if src is None else src
    ref = ws.world.corpus["valid.tgt"] if ref is None else ref
    return ["score", "--model", best(ws), "--src", src, "--ref", ref, "--device", "cpu", *extra]


def scored(count: int) -> Callable[[subprocess.CompletedProcess[bytes]], None]:
    """A check: exit 0 and `count` lines of scores (a negative total, a tab, one figure per
    reference piece and </s>)."""

    def check(result: subprocess.CompletedProcess[bytes]) -> None:
        assert result.returncode == 0, result.stderr.decode("utf-8", "replace")
        lines = result.stdout.decode().splitlines()
        assert len(lines) == count, lines
        for line in lines:
            total, tokens = line.split("\t")
            assert float(total) < 0 and len(tokens.split()) >= 2, line

    return check


def score_from_streams(ws: Workspace) -> list[Any]:
    """score with a gzip --src and --ref /dev/stdin (the references on stdin)."""
    corpus = ws.world.corpus
    ws.stdin = Stdin(corpus["valid.tgt"].read_bytes())
    src = ws.file("src.gz", gz(corpus["valid.src"].read_text().splitlines()))
    return score_args(ws, src=src, ref="/dev/stdin")


ROUND_FIVE_CASES = [
    Case(  # said "a run that stopped before its first checkpoint ... delete that folder"
        "run-out_dir-holds-best-pt-but-no-last-pt",
        lambda ws: train_args(run_holding(ws, "config.yaml", "checkpoints/best.pt")),
        ["run: holds checkpoints (best.pt) but no checkpoints/last.pt", "`--init-from", "best.pt`"],
    ),
    Case(
        "run-resume-best-pt-but-no-last-pt",
        lambda ws: train_args(run_holding(ws, "config.yaml", "checkpoints/best.pt"), "--resume"),
        ["run: holds checkpoints (best.pt) but no checkpoints/last.pt", "`--init-from"],
    ),
    Case(  # said "a run that stopped before its first checkpoint" of a config file
        "run-out_dir-holds-only-a-config",
        lambda ws: train_args(run_holding(ws, "config.yaml")),
        ["run: holds a config.yaml and nothing else of a run", "move that file elsewhere"],
    ),
    Case(  # said "[['de', 'en']] is a list, expected list"
        "config-pairs-item-is-a-list",
        lambda ws: train_args(ws.config(data={"dataset": "multi30k", "pairs": [["de", "en"]]})),
        ["data.pairs[0]: ['de', 'en'] is a list, expected str", "[de-en, ...]"],
    ),
    Case(  # the second was silently the only one scored
        "score-two-models",
        lambda ws: score_args(ws, "--model", best(ws)),
        ["score: --model given 2 times; score reads one model", "attn-mt average"],
    ),
    Case(
        "attention-two-models",
        lambda ws: (
            ["attention", "--model", best(ws), "--model", best(ws), "--text", "qb"]
            + ["--out", ws.dir / "attention.png"]
        ),
        ["attention: --model given 2 times"],
    ),
    Case(  # gzip was scored as text; /dev/stdin (a FIFO, `<(...)`) was "file not found"
        "score-gzip-src-and-ref-from-stdin",
        score_from_streams,
        None,
        scored(8),
        process=True,
    ),
]


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=c.marks, id=c.id) for c in ROUND_FIVE_CASES]
)
def test_round_five_case(case: Case, world: World, request: pytest.FixtureRequest) -> None:
    test_case(case, world, request)


# -- round five: no command replaces its own inputs; large translations' options ---------------


def hard_linked(ws: Workspace, name: str, target: Path) -> Path:
    """./NAME, a second hard link to `target`."""
    os.link(target, ws.dir / name)
    return ws.dir / name


def loop(ws: Workspace, name: str) -> Path:
    """./NAME, a symbolic link to ./NAME.2, which links back to ./NAME."""
    (ws.dir / name).symlink_to(ws.dir / f"{name}.2")
    (ws.dir / f"{name}.2").symlink_to(ws.dir / name)
    return ws.dir / name


def pair(ws: Workspace) -> tuple[Path, Path]:
    """./s.txt and ./r.txt: two lines of source and reference."""
    return ws.file("s.txt", "qb qc\nqd\n"), ws.file("r.txt", "Ba Ca\nDa\n")


def scoring(ws: Workspace, output: Any) -> list[Any]:
    """`score` of ./model.pt on `pair`, written to `output` (a callable of the three paths)."""
    model, (src, ref) = best(ws), pair(ws)
    out = output(model, src, ref)
    return ["score", "--model", model, "--src", src, "--ref", ref, "-o", out, "--device", "cpu"]


OUTPUT_ONTO_INPUT_CASES = [
    Case(
        "translate-output-is-the-model",
        lambda ws: translate_args(best(ws), "-i", ws.file("in", "qb\n"), "-o", ws.dir / "model.pt"),
        ["--output", "model.pt: is the --model file being read; give another file"],
    ),
    Case(  # a run folder is read through its checkpoints/best.pt
        "translate-output-is-the-run-folders-best",
        lambda ws: translate_args(
            ws.run_copy(), "-i", ws.file("in", "qb\n"), "-o", ws.dir / "run/checkpoints/best.pt"
        ),
        ["--output", "best.pt: is the --model file being read"],
    ),
    Case(
        "translate-output-is-the-second-model-of-an-ensemble",
        lambda ws: [
            *translate_args(best(ws), "--model", ws.checkpoint("b.pt"), "-i", ws.file("in", "x")),
            *["-o", ws.dir / "b.pt"],
        ],
        ["--output", "b.pt: is the --model file being read"],
    ),
    Case(
        "translate-output-links-to-the-model",
        lambda ws: translate_args(best(ws), "-o", linked(ws, "out.txt", ws.dir / "model.pt")),
        ["--output", "out.txt: is the --model file being read"],
    ),
    Case(
        "translate-output-is-a-hard-link-of-the-input",
        lambda ws: translate_args(
            best(ws), "-i", ws.file("in.txt", "qb\n"), "-o", hard_linked(ws, "o", ws.dir / "in.txt")
        ),
        ["--output", "o: is the --input file being read"],
    ),
    Case(
        "translate-output-is-the-avoid-file",
        lambda ws: translate_args(
            best(ws), "--avoid", ws.file("avoid.txt", "qb\n"), "-o", ws.dir / "avoid.txt"
        ),
        ["--output", "avoid.txt: is the --avoid file being read"],
    ),
    Case(  # `os.path.realpath` stops at the loop, and the rename replaced the link itself
        "translate-output-is-a-loop-of-links",
        lambda ws: translate_args(best(ws), "-o", loop(ws, "out.txt")),
        ["--output", "out.txt: its symbolic links form a loop; give another name"],
    ),
    Case(
        "attention-out-is-the-model",
        lambda ws: ["attention", "--model", best(ws), "--text", "qb", "--out", ws.dir / "model.pt"],
        ["--out", "model.pt: is the --model file being read"],
    ),
    Case(
        "score-output-is-the-ref",
        lambda ws: scoring(ws, lambda model, src, ref: ref),
        ["--output", "r.txt: is the --ref file being read"],
    ),
    Case(
        "score-output-is-the-model",
        lambda ws: scoring(ws, lambda model, src, ref: model),
        ["--output", "model.pt: is the --model file being read"],
    ),
    Case(
        "score-output-links-to-the-src",
        lambda ws: scoring(ws, lambda model, src, ref: linked(ws, "out", src)),
        ["--output", "out: is the --src file being read"],
    ),
    Case(  # --force replaced a.pt, one of the checkpoints averaged
        "average-out-is-a-checkpoint",
        lambda ws: [
            *["average", "--out", ws.checkpoint("a.pt"), "--force"],
            *[ws.dir / "a.pt", ws.checkpoint("b.pt")],
        ],
        ["--out", "a.pt: is the CHECKPOINT file being read"],
    ),
    Case(  # --force would replace the run folder that holds the model
        "export-out-holds-the-model",
        lambda ws: ["export", "--model", ws.run_copy(), "--out", ws.dir / "run", "--force"],
        ["--out", "run: holds the --model file being read", "give another folder"],
    ),
    Case(
        "evaluate-out-is-a-hard-link-of-the-ref",
        lambda ws: (
            (files := own_valid(ws)),
            ["evaluate", "--model", best(ws), "--device", "cpu", "--src", files[0]]
            + ["--ref", files[1], "--out", hard_linked(ws, "hyp.txt", files[1])],
        )[1],
        ["--out", "hyp.txt: is the --ref file being read"],
    ),
    Case(
        "evaluate-out-is-a-loop-of-links",
        lambda ws: evaluate_args(best(ws), "--out", loop(ws, "hyp.txt")),
        ["--out", "hyp.txt: its symbolic links form a loop"],
    ),
    Case(
        "translate-resume-without-output",
        lambda ws: translate_args(best(ws), "--resume"),
        ["--resume continues an --output FILE"],
    ),
    Case(
        "translate-resume-onto-a-stream",
        lambda ws: translate_args(best(ws), "--resume", "-o", "/dev/null"),
        ["--resume continues an --output FILE (a regular file)"],
    ),
    Case(
        "translate-shard-zero",
        lambda ws: translate_args(best(ws), "--shard", "0/3"),
        ["--shard 0/3: write it I/N", "1 <= I <= N"],
    ),
    Case(
        "translate-shard-beyond-its-count",
        lambda ws: translate_args(best(ws), "--shard", "4/3"),
        ["--shard 4/3: write it I/N"],
    ),
    Case(
        "translate-shard-not-a-fraction",
        lambda ws: translate_args(best(ws), "--shard", "half"),
        ["--shard half: write it I/N"],
    ),
    Case(  # every process would read the one stdin
        "translate-under-torchrun-from-stdin",
        lambda ws: (
            ws.env.update(WORLD_SIZE="2", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1"),
            translate_args(best(ws)),
        )[1],
        ["translate under torchrun reads --input FILE"],
    ),
]


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=c.marks, id=c.id) for c in OUTPUT_ONTO_INPUT_CASES]
)
def test_output_onto_input_case(case: Case, world: World, request: pytest.FixtureRequest) -> None:
    test_case(case, world, request)


# -- round five (issue 80 item 6): tracebacks become one line ----------------------------------


def two_corpora(ws: Workspace, temperature: float) -> list[Any]:
    """Training on the world's 300 training pairs and its 8 validation pairs as a second
    corpus, mixed at `temperature`."""
    corpora = [
        {"src": str(ws.world.corpus[f"{split}.src"]), "tgt": str(ws.world.corpus[f"{split}.tgt"])}
        for split in ("train", "valid")
    ]
    return train_args(ws.config(data={"train": corpora, "temperature": temperature}))


def behind_a_locked_folder(ws: Workspace, *names: str) -> list[Path]:
    """Paths `names` under ./locked, a folder only its owner (root) may enter."""
    locked = ws.folder("locked", mode=0o700)
    return [locked / name for name in names]


def metrics_rows_edited(ws: Workspace) -> list[Any]:
    """`info` of a copy of the tiny run whose metrics.jsonl gained a validation row without a
    step and one whose metric is not a number (a hand edit, another tool's rows)."""
    run = ws.run_copy()
    with open(run / "metrics.jsonl", "a") as rows:
        rows.write(
            '{"split": "valid", "bleu": 99.5}\n{"step": 2, "split": "valid", "bleu": "high"}\n'
        )
    return ["info", run]


def shows_the_run(result: subprocess.CompletedProcess[bytes]) -> None:
    """A check: `info` exits 0, its best line from the run's own records, not the edited rows."""
    assert result.returncode == 0, result.stderr.decode("utf-8", "replace")
    best_line = next(x for x in result.stdout.decode().splitlines() if x.startswith("best: "))
    assert "99.5" not in best_line and "high" not in best_line, best_line


NO_TRACEBACK_CASES = [
    Case(  # n^(1/T) overflowed: NaN weights, then "ValueError: cannot convert float NaN"
        "data-temperature-tiny",
        lambda ws: two_corpora(ws, 1e-3),
        ["data.temperature: 0.001 gives corpus 2 (8 pairs) no pair per epoch", "raise it"],
        process=True,  # found once the corpora are counted, after SentencePiece
    ),
    Case(
        "data-temperature-underflows",
        lambda ws: two_corpora(ws, 1e-300),
        ["data.temperature: 1e-300 gives corpus 2 (8 pairs) no pair per epoch"],
        process=True,
    ),
    Case(  # PermissionError on stat, as a traceback
        "run-info-in-a-folder-the-user-cannot-enter",
        lambda ws: ["info", *behind_a_locked_folder(ws, "run")],
        ["locked/run: permission denied; cannot enter the folder", "locked"],
        user=True,
    ),
    Case(
        "translate-model-in-a-folder-the-user-cannot-enter",
        lambda ws: translate_args(*behind_a_locked_folder(ws, "best.pt")),
        ["locked/best.pt: permission denied; cannot enter the folder"],
        user=True,
    ),
    Case(
        "score-src-in-a-folder-the-user-cannot-enter",
        lambda ws: score_args(ws, src=behind_a_locked_folder(ws, "v.src")[0]),
        ["locked/v.src: permission denied; cannot enter the folder"],
        user=True,
    ),
    Case(  # KeyError: 'step'; TypeError comparing str and float
        "run-info-metrics-rows-without-step-or-number",
        metrics_rows_edited,
        None,
        shows_the_run,
    ),
]


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=c.marks, id=c.id) for c in NO_TRACEBACK_CASES]
)
def test_no_traceback_case(case: Case, world: World, request: pytest.FixtureRequest) -> None:
    test_case(case, world, request)


def test_ctrl_c_while_sigterm_drains_the_server_is_one_line(world: World) -> None:
    """SIGTERM waits for a client that sent half a body; Ctrl-C then stops the server at once:
    exit 130 and one line, not uvicorn's chained tracebacks of every cancelled request."""
    from helpers.serving import start_server

    folder = Path(tempfile.mkdtemp(dir=world.root, prefix="serve-stop."))
    server = start_server(world.run, folder, env=child_env(**world.env()))
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as conn:
        head = f"POST /v1/translate HTTP/1.1\r\nHost: {host}\r\nContent-Length: 100\r\n\r\n"
        conn.sendall(head.encode() + b'{"text": ["qb')
        time.sleep(0.5)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the server gives up a stalled body 2 s after SIGTERM
        server.proc.send_signal(signal.SIGINT)
        code = server.proc.wait(60)
    log = server.log.read_text()
    assert code == 130, log
    assert "Traceback" not in log, log
    assert log.splitlines()[-1].startswith("attn-mt: interrupted while stopping"), log


# -- round six (issue 88): files never given, damaged records, finished outputs, distill ------


def into_out(ws: Workspace, *extra: Any, source: Any = None) -> list[Any]:
    """`translate -i ./in.txt -o ./out.txt` (or `source` as the input) of the tiny run."""
    given = ws.file("in.txt", "qb qc\nqd\n") if source is None else source
    return translate_args(best(ws), "-i", given, "-o", ws.dir / "out.txt", *extra)


def beside_out(ws: Workspace, kind: str) -> None:
    """Something not attn-mt's where out.txt's partial translation goes (./precious.txt, the
    file a link names, must stay as it is)."""
    precious = ws.file("precious.txt", "mine\n")
    data = ws.dir / "out.txt.partial"
    if kind == "link":
        data.symlink_to(precious)
    elif kind == "fifo":
        os.mkfifo(data)
    elif kind == "own-file":
        ws.file("out.txt.partial", "my own notes\n")
    elif kind == "record-link":
        ws.file("out.txt.partial", "A\n")
        (ws.dir / "out.txt.partial.json").symlink_to(precious)


def damaged_record(ws: Workspace, edit: Callable[[dict[str, Any]], Any], *extra: Any) -> list:
    """out.txt's partial translation (one line) beside a record that `edit` damaged."""
    record: Any = {
        "format": PARTIAL_FORMAT,
        "settings": {},
        "part": {"start": 0, "stop": 2, "shard": None, "rank": 0, "ranks": 1},
        "done": {"lines": 1, "bytes": 2, "input_sha256": None},
    }
    record = edit(record) or record
    ws.file("out.txt.partial", "A\n")
    ws.file("out.txt.partial.json", json.dumps(record))
    return into_out(ws, *extra)


def finished_run(ws: Workspace, how: str, minutes: float) -> list[Any]:
    """`info` of a copy of the tiny run whose log says it ended `how` at its step, its config
    given a `minutes` budget."""
    run = ws.run_copy(lambda state: state["config"]["train"].update(max_minutes=minutes))
    with open(run / "train.log", "a", encoding="utf-8") as log:
        log.write(f"2026-01-01 00:00:00,000 finished at step 3 ({how}); best valid bleu 0.00\n")
    return ["info", run]


def says(*words: str) -> Callable[[subprocess.CompletedProcess[bytes]], None]:
    """A check: exit 0, no error, and stdout and stderr together holding every one of `words`."""

    def check(result: subprocess.CompletedProcess[bytes]) -> None:
        text = (result.stdout + result.stderr).decode("utf-8", "replace")
        assert result.returncode == 0 and "error" not in text, text
        for word in words:
            assert word in text, f"{word!r} not in {text!r}"

    return check


def student(ws: Workspace, *extra: Any, config: Any = None) -> list[Any]:
    """`distill` of the tiny run as the teacher into a student config (./run.yaml)."""
    given = ws.config() if config is None else config
    return ["distill", "--teacher", ws.world.run, "--config", given, "--device", "cpu", *extra]


def one_target_short(ws: Workspace) -> Path:
    """./run.yaml training on the world's 300 sources and ./short.tgt, their first 299 targets."""
    targets = ws.world.corpus["train.tgt"].read_text().splitlines()[:299]
    return ws.train_files(ws.world.corpus["train.src"], ws.file("short.tgt", "\n".join(targets)))


ROUND_SIX_CASES = [
    Case(  # the input was wiped before it was read, and out.txt held 0 lines
        "translate-input-is-the-outputs-partial",
        lambda ws: into_out(ws, source=ws.file("out.txt.partial", "qb qc\n")),
        ["--output", "out.txt: its partial translation", "out.txt.partial is the --input file"],
    ),
    Case(  # emptied, filled and renamed without a word
        "translate-partial-is-the-users-own-file",
        lambda ws: (beside_out(ws, "own-file"), into_out(ws))[1],
        ["out.txt.partial: not attn-mt's partial translation", "no record", "move it away"],
    ),
    Case(
        "translate-resume-onto-the-users-own-partial",
        lambda ws: (beside_out(ws, "own-file"), into_out(ws, "--resume"))[1],
        ["out.txt.partial: not attn-mt's partial translation", "no record"],
    ),
    Case(  # the file the link named was overwritten, and out.txt left a link
        "translate-partial-is-a-link",
        lambda ws: (beside_out(ws, "link"), into_out(ws))[1],
        ["out.txt.partial: not attn-mt's partial translation", "a symbolic link"],
    ),
    Case(  # a traceback
        "translate-partial-is-a-fifo",
        lambda ws: (beside_out(ws, "fifo"), into_out(ws, "--resume"))[1],
        ["out.txt.partial: not attn-mt's partial translation", "not a regular file"],
    ),
    Case(
        "translate-record-is-a-link",
        lambda ws: (beside_out(ws, "record-link"), into_out(ws))[1],
        ["out.txt.partial.json: not attn-mt's partial translation", "a symbolic link"],
    ),
    Case(  # KeyError
        "translate-record-without-done",
        lambda ws: damaged_record(ws, lambda r: r.__delitem__("done")),
        ["out.txt.partial.json: damaged", '"done" is not a mapping', "delete it and", "partial"],
    ),
    Case(  # TypeError
        "translate-record-count-a-string",
        lambda ws: damaged_record(ws, lambda r: r["done"].update(lines="1"), "--resume"),
        ["out.txt.partial.json: damaged", '"done.lines" is "1", not a count', "delete it"],
    ),
    Case(  # ValueError
        "translate-record-count-negative",
        lambda ws: damaged_record(ws, lambda r: r["done"].update(bytes=-2), "--resume"),
        ['"done.bytes" is -2, not a count', "delete it"],
    ),
    Case(  # AttributeError
        "translate-record-settings-null",
        lambda ws: damaged_record(ws, lambda r: r.update(settings=None)),
        ['"settings" is not a mapping', "delete it"],
    ),
    Case(
        "translate-record-not-a-mapping",
        lambda ws: damaged_record(ws, lambda r: ["a", "list"]),
        ["out.txt.partial.json: not a record of attn-mt's", "delete it"],
    ),
    Case(  # everything translated again, "no partial translation ... from the start"
        "translate-resume-of-a-finished-output",
        lambda ws: (ws.file("out.txt", "A\nB\n"), into_out(ws, "--resume"))[1],
        None,
        says("--resume:", "out.txt is complete", "leave out --resume to translate it again"),
    ),
    Case(  # accepted, as if 0 meant the model's own beam
        "compare-beam-zero",
        lambda ws: compare_args(ws, best(ws), extra=("--src", hyps(ws, "src.txt"), "--beam", "0")),
        ["--beam 0: must be 1 or more"],
    ),
    Case(  # the student trained among the teacher's checkpoints
        "distill-out-dir-inside-the-teachers-run",
        lambda ws: student(ws, "--set", f"train.out_dir={ws.world.run / 'checkpoints'}"),
        ["train.out_dir", "checkpoints: lies inside the run folder of the teacher", "outside it"],
    ),
    Case(
        "distill-out-dir-is-the-teachers-run",
        lambda ws: student(ws, "--set", f"train.out_dir={ws.world.run}"),
        ["train.out_dir", ": is the run folder of the teacher"],
    ),
    Case(  # found only once the teacher had translated all of it; the advice repeated the error
        "distill-corpus-line-counts-differ",
        lambda ws: student(ws, config=one_target_short(ws)),
        ["data.train:", "train.src has 300 lines but", "short.tgt has 299", "one target line"],
    ),
    Case(  # named "another attn-mt translate"
        "distill-into-a-folder-another-distill-holds",
        lambda ws: (
            ws.hold.enter_context(lock_run_folder(ws.dir / "run", "distill")),
            student(ws),
        )[1],
        ["run: another attn-mt distill (pid", "is running in this folder", "run/.lock"],
    ),
    Case(  # suggested `--resume RUN` alone, which would end at once
        "info-run-ended-on-its-time-budget",
        lambda ws: finished_run(ws, "max_minutes", 3),
        None,
        says("--set train.max_minutes=6` (it had 3; give more)"),
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, marks=c.marks, id=c.id) for c in ROUND_SIX_CASES])
def test_round_six_case(case: Case, world: World, request: pytest.FixtureRequest) -> None:
    test_case(case, world, request)
