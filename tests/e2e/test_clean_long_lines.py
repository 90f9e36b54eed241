"""`attn-mt clean` on a corpus with a crafted long line: langid judges a side over
`JUDGED_CHARS` characters on its first ones and says so once, naming the line; the markup rule
reads 40,000 word characters and an "@" at once (that side kept, the other's address dropped).
A device that does not exist is refused in one line before any work.
(`scripts/bench_clean_lines.py` times the long lines.)"""

from __future__ import annotations

from pathlib import Path

from helpers.clirun import assert_user_error, snapshot, write_yaml
from helpers.toy import write_lines
from helpers.workspace import run_cli

from attn_mt.langid import JUDGED_CHARS

GERMAN = "Ein Hund läuft im Schnee und ein Kind wirft einen roten Ball."
ENGLISH = "A dog runs in the snow and a child throws a red ball."
FRENCH = "Un chien court dans la neige et un enfant lance une balle rouge."


def corpus_config(folder: Path, src: list[str], tgt: list[str], filters: dict) -> Path:
    """A config of one corpus of `src` and `tgt` lines with `filters` on."""
    pair = {
        "src": str(write_lines(folder / "train.de", src)),
        "tgt": str(write_lines(folder / "train.en", tgt)),
    }
    data = {"src_lang": "de", "tgt_lang": "en", "train": pair, "valid": pair, "filters": filters}
    return write_yaml(folder / "clean.yaml", {"data": data})


def test_langid_judges_a_long_side_on_its_first_part_and_says_so(tmp_path: Path) -> None:
    long = (GERMAN + " ") * (3 * JUDGED_CHARS // len(GERMAN))
    src = [GERMAN, long, "a" * 40_000 + "@ " + GERMAN, long, GERMAN]
    tgt = [ENGLISH, (ENGLISH + " ") * 60, ENGLISH + " a@b.org", (FRENCH + " ") * 60, ENGLISH]
    config = corpus_config(tmp_path, src, tgt, {"langid": True, "markup": True})
    out = tmp_path / "out"
    result = run_cli(["clean", "-c", config, "--out", out, "--workers", "1"], None, {})
    assert result.returncode == 0, result.stderr.decode()
    said = [line for line in result.stderr.decode().splitlines() if "judges it" in line]
    assert len(said) == 1, result.stderr.decode()
    assert f"data.train[0] line 2: a side over {JUDGED_CHARS} characters" in said[0]
    dropped = [row.split("\t")[1:3] for row in (out / "dropped.tsv").read_text().splitlines()]
    assert dropped == [["3", "markup"], ["4", "langid"]]  # French judged on its first part


def test_clean_refuses_a_device_that_does_not_exist(tmp_path: Path) -> None:
    config = corpus_config(tmp_path, [GERMAN], [ENGLISH], {"markup": True})
    before = snapshot(tmp_path)
    result = run_cli(
        ["clean", "-c", config, "--out", tmp_path / "out", "--device", "tpu"], None, {}
    )
    assert_user_error(result, "--device tpu")
    assert snapshot(tmp_path) == before
