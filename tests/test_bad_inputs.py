"""Bad inputs and faults, end to end: every case runs the real `attn-mt` in a fresh process.

A user error must exit 2 with one `attn-mt: error:` line on stderr naming the problem, print no
traceback, and leave every file that existed before exactly as it was (hashed before and
after). Faults during training (a NaN loss, SIGINT/SIGTERM, SIGKILL at random moments, a failed
write) must leave whole checkpoints behind, and a run resumed after them must end bit for bit
where an uninterrupted run ends. Children run with ATTN_MT_OFFLINE=1: no case touches the
network.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import toy_config_dict, toy_pairs, write_lines

from attn_mt.checkpoint import FORMAT, load_checkpoint

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


def snapshot(*roots: Path) -> dict[Path, str]:
    """Every file (sha256) and folder under `roots`: a user error must change none of them."""
    found = {}
    for root in roots:
        for path in [root, *root.rglob("*")] if root.is_dir() else [root]:
            found[path] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "/"
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
    """Two last.pt files hold the same step, parameters, optimizer state and RNG state."""
    a = torch.load(path, map_location="cpu", weights_only=True)
    b = torch.load(reference, map_location="cpu", weights_only=True)
    assert a["step"] == b["step"]
    assert a["model"].keys() == b["model"].keys()
    for key, tensor in b["model"].items():
        assert torch.equal(a["model"][key], tensor), f"model.{key} differs"
    opt_a, opt_b = a["train_state"]["optimizer"]["state"], b["train_state"]["optimizer"]["state"]
    assert opt_a.keys() == opt_b.keys()
    for param, state in opt_b.items():
        for name, value in state.items():
            assert torch.equal(opt_a[param][name], value), f"optimizer {param}.{name} differs"
    assert torch.equal(a["train_state"]["rng_cpu"], b["train_state"]["rng_cpu"])


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


def translate_args(model: Path, *extra: str) -> list[Any]:
    return ["translate", "--model", model, "--device", "cpu", *extra]


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
        ["multi30k: train.de.gz not found", "data/multi30k", "no download: ATTN_MT_OFFLINE is set"],
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


# ---------------------------------------------------------------------------------------------
# Translate: a long stream, a reader that goes away


# Run a command (argv[2:]) and write its peak RSS to the file argv[1]. It is measured from this
# small process because a child's peak RSS counts the process it was forked from: measured
# from pytest (torch loaded), the figure would be pytest's.
WITH_PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "code = subprocess.call(sys.argv[2:])\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "open(sys.argv[1], 'w').write(str(peak))\n"
    "sys.exit(code)\n"
)


def run_measured(
    args: list[Any], stdin: Path, cwd: Path
) -> tuple[subprocess.CompletedProcess[bytes], int]:
    """Run `attn-mt ARGS` with stdin from a file; also return its peak RSS in bytes."""
    peak = cwd / "peak-rss"
    with open(stdin, "rb") as source:
        result = subprocess.run(
            [sys.executable, "-c", WITH_PEAK_RSS, peak, *CLI, *map(str, args)],
            stdin=source,
            capture_output=True,
            cwd=cwd,
            env=child_env(),
            timeout=600,
        )
    return result, int(peak.read_text()) * 1024  # Linux reports KiB


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB, as Linux reports it")
def test_translate_streams_100k_lines_in_bounded_memory(trained_run: Path, tmp_path: Path) -> None:
    rng = random.Random(0)
    words = [f"q{c}" for c in "bcdfghjklmnprstvwz"]
    # Every other line blank: the blank lines must come out blank in the same places.
    lines = [
        " ".join(rng.choices(words, k=rng.randint(1, 3))) if i % 2 == 0 else ""
        for i in range(100_000)
    ]
    small, big = (
        write_lines(tmp_path / "2k.txt", lines[:2000]),
        write_lines(tmp_path / "100k.txt", lines),
    )
    args = translate_args(trained_run, "--beam", "1")
    baseline, baseline_rss = run_measured(args, small, tmp_path)
    assert baseline.returncode == 0, baseline.stderr.decode()
    result, rss = run_measured(args, big, tmp_path)
    assert result.returncode == 0 and b"Traceback" not in result.stderr, result.stderr.decode()
    output = result.stdout.decode("utf-8").split("\n")
    assert output.pop() == "" and len(output) == len(lines)
    assert [bool(line.strip()) for line in output] == [bool(line) for line in lines]
    growth = rss - baseline_rss
    # Streaming, it grows by about 1 MiB; holding all 100k lines and results would take 65 MiB.
    assert growth < 16 * 2**20, f"peak RSS grew by {growth / 2**20:.0f} MiB from 2k to 100k lines"


def test_translate_reader_closing_early_is_quiet(trained_run: Path, tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.txt", ["qb qc qd"] * 5000)
    log = tmp_path / "stderr.txt"
    with open(source, "rb") as stdin, open(log, "wb") as stderr:
        proc = subprocess.Popen(
            [*CLI, *map(str, translate_args(trained_run))],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=tmp_path,
            env=child_env(),
        )
        first = proc.stdout.readline()
        proc.stdout.close()  # like `attn-mt translate ... | head -1`
        returncode = proc.wait(timeout=300)
    assert first.strip()
    assert "Traceback" not in log.read_text() and "attn-mt: error" not in log.read_text()
    assert returncode == 0


# ---------------------------------------------------------------------------------------------
# Training faults


def logged(log: Path, text: str) -> Callable[[], bool]:
    """A condition: `text` appears in the log file."""
    return lambda: text in log.read_text(encoding="utf-8", errors="replace")


def test_nan_loss_stops_with_a_clear_error(corpus: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    raw = config_dict(corpus, out, lr=1e6, warmup=1, eval_every=1, max_nonfinite=2)
    result = attn_mt(*train_args(write_yaml(tmp_path / "nan.yaml", raw)), cwd=tmp_path)
    last = out / "checkpoints" / "last.pt"
    message = assert_user_error(
        result, "the loss was NaN/inf for 2 updates in a row", "lower train.lr", str(last)
    )
    step = assert_whole_checkpoints(out)["step"]  # saved at every step before the NaNs
    assert step >= 1 and f"in a row at step {step + 1};" in message


def test_crlf_corpus_trains_exactly_like_lf(
    corpus: dict[str, Path], straight_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = write_yaml(tmp_path / "crlf.yaml", config_dict(corpus, out, crlf=True))
    result = attn_mt(*train_args(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert_same_training_state(
        out / "checkpoints" / "last.pt", straight_run / "checkpoints" / "last.pt"
    )
    crlf, lf = (load_checkpoint(run / "checkpoints" / "last.pt") for run in (out, straight_run))
    assert crlf["tokenizers"] == lf["tokenizers"]  # no piece learned a \r
    assert b"\r" not in (out / "train.log").read_bytes()  # holds validation sources and refs


def test_sigint_then_sigterm_then_resume_equals_straight_run(
    corpus: dict[str, Path], straight_run: Path, tmp_path: Path
) -> None:
    """Each signal stops the run promptly with last.pt written; resuming twice ends where the
    straight run ends (the schedule does not depend on max_steps, so 100000 then 24 is fine)."""
    out = tmp_path / "run"
    config = write_yaml(tmp_path / "run.yaml", config_dict(corpus, out, max_steps=100_000))
    step = 0
    for signum in (signal.SIGINT, signal.SIGTERM):
        log = tmp_path / f"{signum.name}.log"
        proc = start(*train_args(config, *(["--resume"] if step else [])), cwd=tmp_path, log=log)
        wait_for(logged(log, "\nstep "), proc, "the first training step", log)
        sent = time.monotonic()
        proc.send_signal(signum)
        returncode = proc.wait(timeout=300)
        took = time.monotonic() - sent
        stderr = log.read_text()
        assert returncode == 128 + signum and "Traceback" not in stderr, stderr  # 130, 143
        assert f"stopped by {signum.name} at step" in stderr and took < 60
        state = assert_whole_checkpoints(out)
        assert step < state["step"] < RUN_STEPS
        step = state["step"]
    result = attn_mt(
        *train_args(config, "--resume", "--set", f"train.max_steps={RUN_STEPS}"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr.decode()
    assert_same_training_state(
        out / "checkpoints" / "last.pt", straight_run / "checkpoints" / "last.pt"
    )


def test_sigkill_at_random_moments_then_resume_equals_straight_run(
    corpus: dict[str, Path], straight_run: Path, tmp_path: Path
) -> None:
    """Three SIGKILLs, the first while last.pt is being replaced (the next one too, until a kill
    lands inside a write): each time every checkpoint on disk is whole, and the run resumed
    after the third ends bit for bit where the uninterrupted run ends."""
    out = tmp_path / "run"
    last = out / "checkpoints" / "last.pt"
    config = write_yaml(tmp_path / "run.yaml", config_dict(corpus, out))
    rng = random.Random(9)
    in_a_write, saved_step = False, 0

    def writing_last() -> bool:
        return last.exists() and any(n.startswith(".last.pt.") for n in checkpoint_names(out))

    for kill in range(3):
        log = tmp_path / f"kill-{kill}.log"
        proc = start(*train_args(config, *(["--resume"] if kill else [])), cwd=tmp_path, log=log)
        if in_a_write:
            wait_for(logged(log, "vocabulary:"), proc, "the start of training", log)
            time.sleep(rng.uniform(0.0, 0.6))
        else:
            wait_for(writing_last, proc, "a write of last.pt over an earlier one", log)
        proc.kill()
        assert proc.wait(timeout=60) == -signal.SIGKILL, log.read_text()
        in_a_write |= writing_last()  # the temp file of the cut write is still there
        state = assert_whole_checkpoints(out)
        assert state["step"] >= saved_step
        saved_step = state["step"]
    assert in_a_write, "no SIGKILL landed inside a checkpoint write"
    result = attn_mt(*train_args(config, "--resume"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert not [n for n in checkpoint_names(out) if n.startswith(".last.pt.")]  # cleaned up
    assert_same_training_state(last, straight_run / "checkpoints" / "last.pt")


# Run a command with files capped at argv[1] bytes: a write past the cap fails with EFBIG
# ("File too large"), a real write error like a full disk. SIGXFSZ is ignored: an error, not a kill.
WITH_FILE_SIZE_LIMIT = (
    "import os, resource, signal, sys\n"
    "limit = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def test_write_error_while_saving_keeps_the_previous_checkpoint(
    corpus: dict[str, Path], straight_run: Path, tmp_path: Path
) -> None:
    out = Path(shutil.copytree(straight_run, tmp_path / "run"))
    last = out / "checkpoints" / "last.pt"
    limit = 2**20
    assert (out / "checkpoints" / "best.pt").stat().st_size < limit < last.stat().st_size
    before = snapshot(last)
    config = write_yaml(tmp_path / "run.yaml", config_dict(corpus, out))
    resume = train_args(config, "--resume", "--set", f"train.max_steps={RUN_STEPS + 8}")
    result = subprocess.run(
        [sys.executable, "-c", WITH_FILE_SIZE_LIMIT, str(limit), *CLI, *map(str, resume)],
        capture_output=True,
        cwd=tmp_path,
        env=child_env(),
        timeout=300,
    )
    assert_user_error(
        result,
        f"{last}: could not write checkpoint (File too large)",
        "the previous checkpoint is intact",
    )
    assert snapshot(last) == before
    assert not [name for name in checkpoint_names(out) if name.endswith(".tmp")]
    assert load_checkpoint(last)["step"] == RUN_STEPS
