"""`attn-mt import` as a user runs it: a MarianMT folder (built with transformers' own classes,
`bench/marian.py`) becomes a run folder that `translate`, `info` and `export` (CTranslate2
int8, checked against attn-mt) take unchanged; a mistake is one line
and exit 2, with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.clirun import assert_user_error, attn_mt, snapshot

from bench.marian import build_folder
from bench.marian_data import read_lines

pytest.importorskip("transformers")  # the [hf] extra, installed by `make test`
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A tiny MarianMT folder of opus-mt-de-en's layout whose outputs end at varied lengths."""
    out = build_folder(tmp_path_factory.mktemp("hub") / "opus-mt-de-en", small=True, eos_bias=4)
    config = json.loads((out / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps({**config, "max_length": 24}))
    return out


def test_an_imported_folder_is_a_run_every_command_takes(folder: Path, tmp_path: Path):
    run = tmp_path / "run"
    done = attn_mt("import", folder, "--out", run, cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    assert "de -> en" in done.stderr.decode() and (run / "checkpoints" / "best.pt").is_file()
    lines = read_lines("de", "test_2016_flickr", 6)
    (tmp_path / "in.de").write_text("\n".join(lines) + "\n")
    translated = attn_mt("translate", "-m", run, "-i", tmp_path / "in.de", cwd=tmp_path)
    assert translated.returncode == 0 and len(translated.stdout.decode().splitlines()) == 6
    info = attn_mt("info", run, cwd=tmp_path).stdout.decode()
    assert f"imported: from {folder}" in info and "--init-from" in info
    exported = attn_mt(
        "export", "-m", run, "-o", tmp_path / "ct2", "--quantization", "int8", cwd=tmp_path
    )
    assert exported.returncode == 0, exported.stderr.decode()
    assert (tmp_path / "ct2" / "model.bin").is_file()


def test_mistakes_are_one_line_and_write_nothing(folder: Path, tmp_path: Path):
    before = snapshot(tmp_path)
    result = attn_mt("import", tmp_path / "nowhere", "--out", tmp_path / "run", cwd=tmp_path)
    assert_user_error(result, "not a folder")
    result = attn_mt("import", tmp_path, "--out", tmp_path / "run", cwd=tmp_path)
    assert_user_error(result, "no config.json")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep me")
    result = attn_mt("import", folder, "--out", tmp_path / "taken", cwd=tmp_path)
    assert_user_error(result, "not empty", "--force")
    assert (tmp_path / "taken" / "mine.txt").read_text() == "keep me"
    assert not (tmp_path / "run").exists()
    assert set(snapshot(tmp_path)) - set(before) <= {
        tmp_path / "taken",
        tmp_path / "taken" / "mine.txt",
    }
