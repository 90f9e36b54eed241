"""Hostile inputs beyond the case table (`test_hostile.py`): a lock that dies with its process,
repairs after a failure, file modes, one output line per input line, the API's argument checks.
They build on the same world as the table (`helpers/workspace.py`) and run the command line in
this process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import yaml
from helpers.clirun import train_args, translate_args
from helpers.workspace import Stdin, World, run_cli, tiny_config

import attn_mt
from attn_mt import load
from attn_mt.checkpoint import save_checkpoint
from attn_mt.config.file import config_from_dict
from attn_mt.data.tokenizer import train_tokenizer
from attn_mt.decode.generate import Hypothesis
from attn_mt.decode.translator import Translator
from attn_mt.fileio import write_output
from attn_mt.runfolder import lock_run_folder

# The private names this module patches, in one place to update when the package moves.
LOSS = "attn_mt.model.loss.projected_loss"  # the training loss, as the objective calls it
SEARCH = "attn_mt.decode.translator.generate"  # the one search loop, as the Translator calls it


# The holder imports attn_mt.runfolder without the package's __init__ (which imports torch):
# the real locking code, started in milliseconds instead of seconds.
HOLD_LOCK = (
    "import sys, time, types\n"
    "package = types.ModuleType('attn_mt')\n"
    "package.__path__ = [sys.argv[2]]\n"
    "sys.modules['attn_mt'] = package\n"
    "from attn_mt.runfolder import lock_run_folder\n"
    "with lock_run_folder(sys.argv[1]):\n"
    "    print('locked', flush=True)\n"
    "    time.sleep(120)\n"
)


def test_a_lock_held_by_another_process_dies_with_it(world: World, tmp_path: Path) -> None:
    """Another process holds the folder: refused with its pid; SIGKILLed, its lock is gone."""
    out = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_config(world.corpus, out)))
    env = world.env()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out), str(Path(attn_mt.__file__).parent)],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == b"locked\n"
        for extra in ([], ["--resume"]):
            result = run_cli(train_args(config, *extra), Stdin(), env)
            assert result.returncode == 2
            assert f"another attn-mt train (pid {holder.pid}) is running" in result.stderr.decode()
            assert sorted(p.name for p in out.iterdir()) == [".lock"]  # the holder's alone
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with lock_run_folder(out):  # no stale lock: the kernel dropped it with the process
        assert (out / ".lock").read_text() == f"{os.getpid()} train\n"
    assert list(out.iterdir()) == []  # and a folder holding only a lock file counts as new


def test_a_failure_before_the_first_checkpoint_leaves_nothing_behind(
    world: World, tmp_path: Path
) -> None:
    """A run that diverges at step 1 takes its folder (and the parent it made) away again, so
    the retry starts as the first attempt did."""
    out = tmp_path / "deep" / "run"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_config(world.corpus, out)))
    env = world.env()

    def nan_loss(hidden: torch.Tensor, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        loss = hidden.sum() * float("nan")
        return loss, loss.detach()

    with mock.patch(LOSS, nan_loss):
        result = run_cli(train_args(config, "--set", "train.max_nonfinite=1"), Stdin(), env)
    assert result.returncode == 2
    assert "no checkpoint had been written yet" in result.stderr.decode()
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
    env = world.env()
    whole = (world.run / "metrics.jsonl").read_text()
    result = run_cli(train_args(config, "--resume"), Stdin(), env)  # finished: no new step
    assert result.returncode == 0, result.stderr.decode()
    assert (out / "metrics.jsonl").read_text() == whole  # the whole lines, as they were
    lines = [json.loads(line) for line in whole.splitlines()]
    assert [(m["step"], m["split"]) for m in lines] == [(3, "train"), (3, "valid")]


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
    """Piece ids of a hypothesis that decodes to '\\nqb\\r\\nqc\\r\\x0bqd\\u2028' (byte pieces):
    breaks for a file's reader and for Python's `str.splitlines` alike."""
    sp = translator.tgt_tokenizer.sp
    pieces = [sp.piece_to_id(f"<0x{byte:02X}>") for byte in b"\n\r\x0b\xe2\x80\xa8"]
    assert sp.unk_id() not in pieces
    newline, carriage_return, vertical_tab, *separator = pieces
    qb, qc, qd = translator.tgt_tokenizer.encode(["qb", "qc", "qd"])
    return [
        newline,
        *qb,
        carriage_return,
        newline,
        *qc,
        carriage_return,
        vertical_tab,
        *qd,
        *separator,
    ]


def test_output_has_one_line_per_input_line_whatever_the_model_emits(world: World) -> None:
    translator = load(world.run / "checkpoints" / "best.pt", device="cpu")
    tokens = newline_pieces(translator)
    assert "\n" in translator.tgt_tokenizer.decode([tokens])[0]  # what the model could emit

    def search(model: Any, src: torch.Tensor, *args: Any) -> list[list[Hypothesis]]:
        return [[Hypothesis(tokens, -1.0, -1.0)] for _ in range(src.shape[0])]

    lines = ["qb qc", "", "qd qf qg", "qh"]
    stdin = Stdin("".join(line + "\n" for line in lines).encode())
    with mock.patch(SEARCH, search):
        beam = translator.translate(lines, beam=2)
        greedy = translator.translate(lines, beam=1)
        result = run_cli(translate_args(world.run), stdin, {"ATTN_MT_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr.decode()
    assert beam == greedy
    assert [bool(text) for text in beam] == [True, False, True, True]
    assert all("qb" in t and "qd" in t and len(t.splitlines()) == 1 for t in beam if t)
    assert result.stdout.decode().split("\n") == [*beam, ""]  # the CLI prints what load gives


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
