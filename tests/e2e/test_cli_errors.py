"""User errors end to end: every case runs the real `attn-mt` in a fresh process.

A user error must exit 2 with one `attn-mt: error:` line on stderr naming the problem, print no
traceback, and leave every file that existed before exactly as it was (hashed before and
after). Children run with ATTN_MT_OFFLINE=1: no case touches the network.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.clirun import (
    assert_user_error,
    attn_mt,
    child_env,
    config_dict,
    snapshot,
    train_args,
    translate_args,
    write_yaml,
)

from attn_mt.checkpoint import FORMAT

# ---------------------------------------------------------------------------------------------
# The table: user errors and odd input, one process each


@dataclass
class Workspace:
    """One case's own folder (the child's working directory) and what cases build on."""

    dir: Path
    corpus: dict[str, Path]
    straight_run: Path
    trained_run: Path
    stdin: bytes = b""
    env: dict[str, str] = field(default_factory=child_env)

    def file(self, name: str, content: bytes | str) -> Path:
        path = self.dir / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return path

    def config(self, name: str = "run.yaml", **sections: dict) -> Path:
        """The run config (out_dir = ./run) with `sections` merged in, e.g. model={"heads": 3}."""
        raw = config_dict(self.corpus, self.dir / "run")
        for section, values in sections.items():
            raw.setdefault(section, {}).update(values)
        return write_yaml(self.dir / name, raw)

    def config_with_train_files(self, src: Path, tgt: Path) -> Path:
        return self.config(data={"train": {"src": str(src), "tgt": str(tgt)}})

    def saved(self, name: str, obj: Any) -> Path:
        """`obj` written with torch.save."""
        torch.save(obj, self.dir / name)
        return self.dir / name

    def run_copy(self) -> Path:
        """A copy of the finished reference run at ./run (what `config()` points at)."""
        return shutil.copytree(self.straight_run, self.dir / "run")

    def checkpoint(self, name: str = "model.pt") -> Path:
        """A copy of the reference run's best.pt."""
        return Path(shutil.copy(self.straight_run / "checkpoints" / "best.pt", self.dir / name))

    def edited_checkpoint(self, name: str, edit: Callable[[dict], Any]) -> Path:
        """A checkpoint re-saved after `edit(state)`: well-formed, but with wrong content."""
        state = torch.load(self.checkpoint(), map_location="cpu", weights_only=True)
        edit(state)
        return self.saved(name, state)


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


@dataclass
class Case:
    """`make(ws)` prepares files and returns the CLI arguments. A user error is expected
    (naming every one of `error`), or, with `error=None`, a success that `check` examines."""

    id: str
    make: Callable[[Workspace], list[Any]]
    error: list[str] | None
    check: Callable[[subprocess.CompletedProcess[bytes]], None] | None = None


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
    """A `translate` case over the well-trained toy model (beam search, the default); `warning`
    is a pattern that stderr must match."""

    def make(ws: Workspace) -> list[Any]:
        ws.stdin = stdin
        return translate_args(ws.trained_run)

    return Case(name, make, None, lambda result: assert_translations(result, expected, warning))


def existing_run(ws: Workspace) -> list[Any]:
    ws.run_copy()
    return train_args(ws.config())


def resume_with_changed_model(ws: Workspace) -> list[Any]:
    ws.run_copy()
    return train_args(ws.config(model={"d_ff": 256, "heads": 2}), "--resume")


def resume_from_corrupt_last(ws: Workspace) -> list[Any]:
    flip_tensor_bytes(ws.run_copy() / "checkpoints" / "last.pt")
    return train_args(ws.config(), "--resume")


def offline_corpus(ws: Workspace) -> list[Any]:
    for folder in ("data", "cache"):
        (ws.dir / folder).mkdir()
    ws.env = child_env(ATTN_MT_DATA=str(ws.dir / "data"), ATTN_MT_CACHE=str(ws.dir / "cache"))
    config = config_dict(ws.corpus, ws.dir / "run")
    config["data"] = {"dataset": "multi30k", "src_lang": "de", "tgt_lang": "en"}
    return train_args(write_yaml(ws.dir / "multi30k.yaml", config))


CONFIG_CASES = [
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
        ["model.heads: 3 is invalid; must divide model.d_model (64)"],
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
        "set-without-equals",
        lambda ws: train_args(ws.config(), "--set", "train.lr"),
        ["--set train.lr: expected KEY=VALUE"],
    ),
    Case(
        "set-unknown-key",
        lambda ws: train_args(ws.config(), "--set", "train.lrr=0.1"),
        ["train.lrr: unknown key; did you mean train.lr?"],
    ),
]

DATA_CASES = [
    Case(
        "data-file-missing",
        lambda ws: train_args(ws.config_with_train_files(ws.dir / "no.src", ws.dir / "no.tgt")),
        ["no.src: file not found"],
    ),
    Case(
        "data-line-counts-differ",
        lambda ws: train_args(
            ws.config_with_train_files(ws.corpus["train.src"], ws.file("short.tgt", "Ba\nCa\n"))
        ),
        ["has 3000 lines but", "short.tgt has 2", "one target line per source line"],
    ),
    Case(
        "data-empty-corpus",
        lambda ws: train_args(
            ws.config_with_train_files(ws.file("e.src", ""), ws.file("e.tgt", ""))
        ),
        ["e.src: the training corpus has no non-empty pairs"],
    ),
    Case(
        "data-every-pair-too-long",
        lambda ws: train_args(ws.config(data={"max_len": 1})),
        ["every training pair was filtered out", "data.max_len=1"],
    ),
    Case(
        "data-invalid-utf8",
        lambda ws: train_args(
            ws.config_with_train_files(
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
]

RUN_CASES = [
    Case(
        "run-out_dir-holds-a-run",
        existing_run,
        ["already holds a run", "--resume", "choose another train.out_dir"],
    ),
    Case(
        "run-resume-nothing",
        lambda ws: train_args(ws.config(), "--resume"),
        ["nothing to resume", "start without --resume"],
    ),
    Case(
        "run-resume-changed-model",
        resume_with_changed_model,
        ["cannot resume with a changed config", "model.heads", "model.d_ff"],
    ),
    Case(
        "run-resume-corrupt-last",
        resume_from_corrupt_last,
        ["last.pt: corrupt", "fails its checksum"],
    ),
]

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
        lambda ws: translate_args(ws.file("truncated.pt", ws.checkpoint().read_bytes()[:300_000])),
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
            ws.edited_checkpoint("misfit.pt", lambda s: s["config"]["model"].update(d_ff=256))
        ),
        ["misfit.pt: its tensors do not fit its config"],
    ),
    Case(
        "checkpoint-tokenizer-garbage",
        lambda ws: translate_args(
            ws.edited_checkpoint(
                "spm.pt", lambda s: s["tokenizers"].update(src=b"junk", tgt=b"junk")
            )
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
        "evaluate-line-counts-differ",
        lambda ws: (
            ["evaluate", "--model", ws.checkpoint(), "--src", ws.corpus["valid.src"]]
            + ["--ref", ws.file("one.ref", "Ba\n"), "--device", "cpu"]
        ),
        ["has 10 lines but", "one.ref has 1"],
    ),
]

DEVICE_CASES = [
    pytest.param(
        Case(
            "device-cuda-without-gpu",
            lambda ws: ["translate", "--model", ws.checkpoint(), "--device", "cuda"],
            ["--device cuda: no CUDA GPU is available here; use --device cpu"],
        ),
        marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present"),
    ),
]

TRANSLATE_CASES = [
    translation("translate-empty-input", b"", []),
    translation(
        "translate-blank-whitespace-crlf-lines",
        b"qb qc\r\n\n   \n\t\r\n\r\nqd",  # and no final newline
        [ANY_TEXT, "", "", "", "", ANY_TEXT],
    ),
    translation(
        "translate-10000-character-line",
        b"qb " * 3333 + b"q\nqd\n",
        [ANY_TEXT, ANY_TEXT],
        r"line 1: \d+ source tokens, truncated to 256 \(decode.max_input_len\)",
    ),
    translation(
        "translate-invalid-utf8-and-control-characters",
        b"qb\nq\xff\xfec\nqd\x00\x07\x1b[2J\nqf\n",
        [ANY_TEXT, None, None, ANY_TEXT],
        r"line 2: invalid UTF-8, replaced with U\+FFFD",
    ),
]

CASES = CONFIG_CASES + DATA_CASES + RUN_CASES + CHECKPOINT_CASES + DEVICE_CASES + TRANSLATE_CASES
WORKERS = min(4, os.cpu_count() or 1)


@dataclass
class Outcome:
    """One case's process, and its workspace with the watched files before and after it ran."""

    result: subprocess.CompletedProcess[bytes]
    workspace: Workspace
    before: dict[Path, str]
    after: dict[Path, str]


def run_case(case: Case, ws: Workspace) -> Outcome:
    args = case.make(ws)
    watched = [ws.dir, ws.straight_run, ws.trained_run, *ws.corpus.values()]
    before = snapshot(*watched)
    result = attn_mt(*args, cwd=ws.dir, env=ws.env, stdin=ws.stdin)
    return Outcome(result, ws, before, snapshot(*watched))


@pytest.fixture(scope="module")
def outcomes(
    request: pytest.FixtureRequest,
    corpus: dict[str, Path],
    straight_run: Path,
    trained_run: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Outcome]:
    """Every selected case, run once, WORKERS at a time: the cases are independent and most of
    each is the start of a Python process that imports torch."""
    selected = [
        item.callspec.params["case"]
        for item in request.session.items
        if item.module is request.module
        and item.originalname == "test_case"
        and not any(mark.args[0] for mark in item.iter_markers("skipif"))
    ]
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {
            case.id: pool.submit(
                run_case,
                case,
                Workspace(tmp_path_factory.mktemp(case.id), corpus, straight_run, trained_run),
            )
            for case in selected
        }
        return {name: future.result() for name, future in futures.items()}


def case_id(case: Any) -> str:
    return case.id


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_case(case: Case, outcomes: dict[str, Outcome]) -> None:
    outcome = outcomes[case.id]
    if case.error is not None:
        assert_user_error(outcome.result, *case.error)
    else:
        case.check(outcome.result)
    assert outcome.after == outcome.before  # no file changed, created or removed
    assert not (outcome.workspace.dir / "PWNED").exists()
