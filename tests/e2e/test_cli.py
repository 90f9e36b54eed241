"""The command-line skeleton: help texts, `python -m attn_mt`, user errors, `data` commands."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import typer.main
import yaml
from helpers import REPO
from helpers.clirun import CLI, child_env, translate_args
from helpers.workspace import World
from typer.testing import CliRunner

from attn_mt.cli import app
from attn_mt.config.schema import Config

COMMANDS = ["train", "translate", "evaluate", "average", "attention", "export", "data"]
CONSOLE_SCRIPT = Path(sys.executable).parent / "attn-mt"


def run_cli(*args: str, module: bool = False, **env: str) -> subprocess.CompletedProcess:
    """Run `attn-mt ARGS` (or `python -m attn_mt ARGS`) in a fresh process."""
    if module or not CONSOLE_SCRIPT.is_file():
        command = [sys.executable, "-m", "attn_mt", *args]
    else:
        command = [str(CONSOLE_SCRIPT), *args]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **env},
        timeout=120,
    )


@pytest.fixture
def multi30k_env(monkeypatch: pytest.MonkeyPatch) -> Path:
    root = Path(os.environ.get("ATTN_MT_DATA") or REPO.parent / "shared" / "data")
    if not (root / "multi30k" / "train.de.gz").is_file():
        pytest.skip("Multi30k not found; set ATTN_MT_DATA")
    monkeypatch.setenv("ATTN_MT_DATA", str(root))
    return root


@pytest.mark.parametrize("module", [False, True], ids=["attn-mt", "python -m attn_mt"])
def test_help_lists_every_command(module: bool):
    result = run_cli("--help", module=module)
    assert result.returncode == 0, result.stderr
    commands = result.stdout.split("Commands:", 1)[1].split()
    for name in COMMANDS:
        assert name in commands


def test_help_examples_name_the_run_folders_the_shipped_configs_make():
    """`runs/multi30k` in an example was no folder any config makes (`runs/multi30k_de_en`)."""
    made = {yaml.safe_load(p.read_text())["train"]["out_dir"] for p in REPO.glob("configs/*.yaml")}
    made.add(Config().train.out_dir)  # `attn-mt train` without a config
    root = typer.main.get_command(app)
    # and the folder `attn-mt import`'s own example writes (--out)
    made |= set(re.findall(r"--out (runs/[\w.-]+)", root.commands["import"].epilog or ""))
    epilogs = [
        c.epilog or "" for c in [*root.commands.values(), *root.commands["data"].commands.values()]
    ]
    named = {m for epilog in epilogs for m in re.findall(r"runs/[\w.-]+", epilog)}
    assert named and named <= made, named - made


def test_every_command_has_help_text():
    root = typer.main.get_command(app)
    assert set(COMMANDS) <= set(root.commands)
    groups = [root, root.commands["data"]]
    assert {"fetch", "info"} <= set(groups[1].commands)
    for group in groups:
        for name, command in group.commands.items():
            assert command.help and command.help.strip(), f"{name} has no help text"
            if name == "data":
                continue
            for param in command.params:
                if param.name != "help":
                    assert getattr(param, "help", None), f"{name} {param.name}: no help text"


@pytest.mark.parametrize(
    "args", [[name, "--help"] for name in COMMANDS] + [["data", "fetch", "--help"]]
)
def test_subcommand_help(args: list[str]):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_user_error_is_one_line_and_exit_2(tmp_path: Path):
    config = tmp_path / "typo.yaml"
    config.write_text(yaml.safe_dump({"data": {"dataset": "multi30k", "tran": {"src": "x"}}}))
    result = run_cli("train", "--config", str(config))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "attn-mt: error: data.tran: unknown key; did you mean data.train?"
    ]
    assert "Traceback" not in result.stderr


def test_bad_set_is_a_user_error():
    result = run_cli("train", "--config", str(REPO / "configs" / "tiny.yaml"), "--set", "train.lr")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "attn-mt: error: --set train.lr: expected KEY=VALUE, e.g. --set train.lr=0.0005"
    ]


def test_data_info(multi30k_env: Path):
    result = CliRunner().invoke(app, ["data", "info"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert str(multi30k_env) in lines[0]
    assert "multi30k/train.de.gz: 29000 lines, sha256 ok" in result.output
    assert "multi30k/val.en.gz: 1014 lines, sha256 ok" in result.output
    assert len(lines) == 13 and "MISMATCH" not in result.output


def test_data_info_reports_missing_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ATTN_MT_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("ATTN_MT_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(app, ["data", "info"])
    assert result.exit_code == 0, result.output
    assert "multi30k/train.de.gz: missing (attn-mt data fetch multi30k)" in result.output


def test_data_fetch(multi30k_env: Path):
    result = CliRunner().invoke(app, ["data", "fetch", "multi30k"])
    assert result.exit_code == 0, result.output
    paths = [Path(line) for line in result.output.splitlines()]
    assert len(paths) == 12
    assert all(p.is_file() and p.parent == multi30k_env / "multi30k" for p in paths)


# ---------------------------------------------------------------------------------------------
# Fast help, --version, choices


def test_help_does_not_import_torch():
    """Every help screen in one fresh process: no torch, no ctranslate2 (help is instant)."""
    script = f"""
import sys
from attn_mt.cli import main
for args in {[["--help"], ["-h"], ["--version"], *([c, "--help"] for c in COMMANDS)]!r}:
    sys.argv = ["attn-mt", *args]
    try:
        main()
    except SystemExit as exit:
        assert exit.code in (0, None), (args, exit.code)
print("torch" in sys.modules or "ctranslate2" in sys.modules, file=sys.stderr)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "False"
    assert "attn-mt 0.1.0" in done.stdout


def test_train_mistakes_are_reported_before_torch_is_imported(tmp_path: Path):
    """`train` checks its arguments, the config and the run folder first: a mistake costs no
    torch import. The not-writable folder is tried as uid 65534 when this is root."""
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "configs" / "tiny.yaml").read_text() + "model: {heads: 3}\n")
    held = tmp_path / "held"  # holds a run: its config.yaml and last.pt
    (held / "checkpoints").mkdir(parents=True)
    (held / "config.yaml").write_text("{}\n")
    (held / "checkpoints" / "last.pt").write_bytes(b"")
    shared = Path(tempfile.mkdtemp(prefix="attn-mt-locked-"))  # pytest's tmp_path is 0700
    try:
        shared.chmod(0o755)
        (shared / "locked").mkdir(mode=0o555)
        (shared / "locked").chmod(0o555)  # the umask may have taken bits away
        tiny = ["--config", "configs/tiny.yaml", "--device", "cpu", "--set"]
        mistakes = [
            ([], "give --config FILE"),
            (["configs/tiny.yaml"], "is a config file"),
            (["--config", str(bad)], "duplicate key 'model'"),
            (["--config", "configs/tiny.yaml", "--set", "train.lr=-1"], "train.lr: -1"),
            ([*tiny, f"train.out_dir={tmp_path / 'none'}", "--resume"], "nothing to resume"),
            ([*tiny, f"train.out_dir={held}"], "already holds a run"),
            ([*tiny, f"train.out_dir={shared / 'locked'}"], "cannot write in the run folder"),
        ]
        script = f"""
import os, sys
from attn_mt.cli import main
for i, args in enumerate({[args for args, _ in mistakes]!r}):
    if i == {len(mistakes) - 1} and os.geteuid() == 0:  # root writes anywhere
        os.setegid(65534)
        os.seteuid(65534)
    sys.argv = ["attn-mt", "train", *args]
    try:
        main()
    except SystemExit as exit:
        assert exit.code == 2, (args, exit.code)
print("torch" in sys.modules, file=sys.stderr)
"""  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
        )
    finally:
        shutil.rmtree(shared)
    assert done.returncode == 0, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("attn-mt: error:")]
    assert len(errors) == len(mistakes), done.stderr
    for line, (_, words) in zip(errors, mistakes, strict=True):
        assert words in line, (words, line)
    assert done.stderr.splitlines()[-1] == "False"


def test_other_mistakes_are_reported_before_torch_is_imported(tmp_path: Path):
    """Every command checks its paths and options before it imports torch or matplotlib."""
    fake = tmp_path / "model.pt"  # a path that exists: the mistake is elsewhere
    fake.write_bytes(b"")
    folder, missing = tmp_path / "folder", tmp_path / "missing"
    folder.mkdir()
    mistakes = [
        ["translate", "--model", missing],
        ["translate", "--model", tmp_path],  # a folder that is no run
        ["translate", "--model", fake, "--input", missing],
        ["translate", "--model", fake, "--output", folder],
        ["translate", "--model", fake, "--top-k", "5"],
        ["evaluate", "--model", missing],
        ["evaluate", "--model", fake, "--src", fake],
        ["average", "--out", fake, fake, fake],
        ["attention", "--pe", "--out", folder],
        ["attention", "--model", missing, "--text", "x", "--out", tmp_path / "a.png"],
        ["export", "--model", fake, "--out", fake],
        ["prepare", "--config", missing],
        ["data", "info", "--config", missing],
    ]
    script = f"""
import sys
from attn_mt.cli import main
for args in {[[str(a) for a in m] for m in mistakes]!r}:
    sys.argv = ["attn-mt", *args]
    try:
        main()
    except SystemExit as exit:
        assert exit.code == 2, (args, exit.code)
print(sorted(m for m in ("torch", "matplotlib") if m in sys.modules), file=sys.stderr)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("attn-mt: error:")]
    assert len(errors) == len(mistakes), done.stderr
    assert done.stderr.splitlines()[-1] == "[]"


def test_home_folder_in_run_paths_is_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from attn_mt.config.file import load_config

    monkeypatch.setenv("HOME", str(tmp_path))
    overrides = ["train.out_dir=~/runs/a", "train.init_from=~/runs/b"]
    cfg = load_config(REPO / "configs" / "tiny.yaml", overrides)
    assert (cfg.train.out_dir, cfg.train.init_from) == (
        str(tmp_path / "runs" / "a"),
        str(tmp_path / "runs" / "b"),
    )


def test_version_and_short_help():
    import attn_mt

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output == f"attn-mt {attn_mt.__version__}\n"
    for args in (["-h"], ["translate", "-h"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0 and result.output.startswith("Usage: ")
        assert "-h, --help" in result.output


def test_python_api_still_loads_lazily():
    import attn_mt
    from attn_mt.decode.load import load
    from attn_mt.decode.translator import Translator

    assert attn_mt.load is load and attn_mt.Translator is Translator
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        attn_mt.nothing  # noqa: B018


def test_fixed_sets_are_listed_in_help():
    export_help = CliRunner().invoke(app, ["export", "--help"]).output
    assert "--quantization none|int8|float16|..." in export_help  # export_ctranslate2 checks it
    assert "--format ct2|hf" in export_help and "[default: ct2]" in export_help
    assert "--quantize int8" in CliRunner().invoke(app, ["translate", "-h"]).output
    assert "--kind cross|encoder|decoder" in CliRunner().invoke(app, ["attention", "-h"]).output
    translate_help = CliRunner().invoke(app, ["translate", "-h"]).output
    assert "--device auto|cpu|cuda|cuda:N" in translate_help
    assert "--nbest-format tsv|marian" in translate_help
    assert "--split valid|test" in CliRunner().invoke(app, ["evaluate", "-h"]).output


def test_a_value_outside_a_fixed_set_is_refused():
    result = CliRunner().invoke(app, ["attention", "--kind", "self", "--out", "x.png", "--pe"])
    assert result.exit_code == 2 and "'self' is not one of 'cross', 'encoder'" in result.output


# ---------------------------------------------------------------------------------------------
# train --resume RUN_DIR


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["runs/x"], "train: runs/x given without --resume; continue that run with"),
        (["--resume", "runs/x", "--config", "c.yaml"], "give --config FILE [--resume] or --resume"),
        (["--resume"], "train: give --config FILE (or --resume RUN_DIR to continue a run)"),
        ([], "train: give --config FILE (or --resume RUN_DIR to continue a run)"),
    ],
)
def test_train_misuse_is_one_clear_line(args: list[str], message: str):
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 1 and message in str(result.exception), result.output
    assert "\n" not in str(result.exception)


def test_resume_a_folder_that_is_not_a_run(tmp_path: Path):
    result = run_cli("train", "--resume", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"attn-mt: error: --resume {tmp_path}: not a run folder (no config.yaml); "
        "give the train.out_dir of an earlier run"
    ]


def test_resume_by_folder_continues_that_folder(trained_run: Path, tmp_path: Path):
    """A copied run folder resumes in place (its config.yaml still names the original)."""
    import torch

    copy = tmp_path / "moved"
    shutil.copytree(trained_run, copy)
    before = (trained_run / "checkpoints" / "last.pt").read_bytes()
    result = CliRunner().invoke(
        app,
        ["train", "--resume", str(copy), "--set", "train.max_steps=402", "--device", "cpu"],
    )
    assert result.exit_code == 0, result.output
    assert torch.load(copy / "checkpoints" / "last.pt", weights_only=True)["step"] == 402
    assert (trained_run / "checkpoints" / "last.pt").read_bytes() == before


# ---------------------------------------------------------------------------------------------
# Streams are streams: what translate reads and writes besides regular files


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_a_fifo_is_read_once_as_it_comes(tmp_path: Path, compressed: bool):
    """A FIFO (as `<(zcat ...)` or /dev/stdin give) has no line count and cannot be read twice:
    it is streamed, gzip data decompressed."""
    import gzip
    import threading

    from attn_mt.jobs.io import input_file, line_chunks

    fifo = tmp_path / "in"
    os.mkfifo(fifo)
    data = b"qb qc\n\nqd\n"
    payload = gzip.compress(data) if compressed else data

    def write() -> None:
        with open(fifo, "wb") as handle:
            handle.write(payload)

    writer = threading.Thread(target=write)
    writer.start()
    with input_file(fifo) as (stream, total):
        lines = [line for chunk in line_chunks(stream, str(fifo)) for line in chunk]
    writer.join()
    assert total is None and lines == ["qb qc", "", "qd"]


def test_process_substitution_is_read(world: World, tmp_path: Path):
    """`--input <(zcat x.gz)`: the shell gives the command /dev/fd/N, a pipe it inherits."""
    read, write = os.pipe()
    os.write(write, b"qb qc\n\nqd\n")
    os.close(write)
    try:
        done = subprocess.run(
            [*CLI, *map(str, translate_args(world.run, "--input", f"/dev/fd/{read}"))],
            pass_fds=(read,),
            capture_output=True,
            cwd=tmp_path,
            env=child_env(),
            timeout=300,
        )
    finally:
        os.close(read)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().split("\n")
    assert len(lines) == 4 and lines[0] and lines[1] == "" and lines[2] and lines[3] == ""


def test_output_symlink_to_stdout_is_written_through(world: World, tmp_path: Path):
    """`--output out` where out -> /dev/stdout: written in place, the symlink kept."""
    link = tmp_path / "out"
    link.symlink_to("/dev/stdout")
    done = subprocess.run(
        [*CLI, *map(str, translate_args(world.run, "--output", link))],
        input=b"qb qc\nqd\n",
        capture_output=True,
        cwd=tmp_path,
        env=child_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.decode().splitlines()) == 2
    assert link.is_symlink() and os.readlink(link) == "/dev/stdout"


def test_closed_standard_streams_are_one_line(monkeypatch: pytest.MonkeyPatch):
    from attn_mt.errors import UserError
    from attn_mt.jobs import io

    monkeypatch.setattr(sys, "stdout", None)
    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(UserError, match=r"stdout: cannot write \(it is closed\); give --output"):
        io.check_output(None)
    with pytest.raises(UserError, match=r"stdin: cannot read text \(it is closed\)"):
        io.check_input(None)
    io.check_output(Path("/dev/null"))  # a device: written in place, nothing to refuse


@pytest.mark.parametrize("command", ["translate", "evaluate"])
@pytest.mark.parametrize(("flag", "expected"), [(None, "auto"), ("on", True), ("off", False)])
def test_prepack_option_reaches_load(
    trained_run: Path, monkeypatch: pytest.MonkeyPatch, command: str, flag: str | None, expected
):
    """`--prepack auto|on|off` (default auto) is what `attn_mt.load` is asked to do."""
    import attn_mt

    asked = []

    def load(*args, **kwargs):
        asked.append(kwargs["prepack"])
        raise SystemExit(0)  # the option is all this checks: no translation needed

    monkeypatch.setattr(attn_mt, "load", load)
    option = ["--prepack", flag] if flag else []
    args = [command, "--model", str(trained_run), "--device", "cpu", *option]
    result = CliRunner().invoke(app, args, input="ein Test\n")
    assert result.exit_code == 0 and asked == [expected], result.output
    assert "--prepack auto|on|off" in CliRunner().invoke(app, [command, "-h"]).output
