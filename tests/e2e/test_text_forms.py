"""Text as people write it on the command line and the server: `attn-mt recase-table` gives a
checkpoint without one its casing table, `evaluate --variants` scores the test set as people
type it, and the server answers lines in capitals and with spans as `translate` writes them."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch
from helpers.clirun import assert_user_error, attn_mt, child_env, snapshot
from helpers.serving import Server, translate_cli
from helpers.toy import invoke
from helpers.workspace import World

from attn_mt.data.augment import title_case
from attn_mt.evaluate_variants import TEST_SPANS, VARIANTS

LINES = [
    "QB QC QD QF",
    "Qb Qc Qd",
    "qb QC QD qf",
    "qb https://x.de qc info@x.de qd",
    "@jo qb #t qc 🙂 qd 🙂",
    "qb (https://x.de), qc `ls -la`",
    "https://x.de",
    "",
    "qb qc qd",
]


@pytest.fixture
def bare_run(trained_run: Path, tmp_path: Path) -> Path:
    """A copy of the trained run whose checkpoints hold no casing table (as an older run's)."""
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    for path in (trained_run / "checkpoints").glob("*.pt"):
        state = torch.load(path, weights_only=True)
        state.pop("casing")
        torch.save(state, folder / path.name)
    return tmp_path / "run"


def test_recase_table_gives_every_checkpoint_the_table(trained_run, bare_run) -> None:
    done = invoke("recase-table", "--config", trained_run / "config.yaml", "--model", bare_run)
    assert done.exit_code == 0, done.output
    assert "casing table (xx " in done.output and "casing.json" in done.output
    trained = torch.load(trained_run / "checkpoints" / "best.pt", weights_only=True)["casing"]
    names = sorted(p.name for p in (bare_run / "checkpoints").glob("*.pt"))
    assert "best.pt" in names and "last.pt" in names
    for name in names:
        state = torch.load(bare_run / "checkpoints" / name, weights_only=True)
        assert state["casing"] == trained, name
    assert json.loads((bare_run / "casing.json").read_text()) == trained
    assert json.loads((trained_run / "casing.json").read_text()) == trained  # training wrote it


def test_recase_table_refuses_another_language(trained_run, bare_run, tmp_path) -> None:
    config = tmp_path / "other.yaml"
    config.write_text(
        (trained_run / "config.yaml").read_text().replace("src_lang: xx", "src_lang: de")
    )
    before = snapshot(bare_run)
    done = attn_mt("recase-table", "--config", config, "--model", bare_run, cwd=tmp_path)
    assert_user_error(done, "translates from xx", "sources are in de")
    assert snapshot(bare_run) == before


def test_variants_score_the_test_set_as_people_type_it(trained_run, tmp_path) -> None:
    out = tmp_path / "variants"
    done = invoke(
        "evaluate", "--model", trained_run, "--split", "test", "--device", "cpu",
        "--variants", "upper,title,nopunct,typos,spans", "--out", out, "--json",
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    found = json.loads(done.output.splitlines()[0])
    rows = {row["name"]: row for row in found["variants"]}
    assert list(rows) == list(VARIANTS) and found["folder"] == str(out)

    def lines(name: str) -> list[str]:
        return (out / name).read_text(encoding="utf-8").splitlines()

    plain = lines("plain.hyp")
    # Recased and cased back: the plain output in capitals, in Title Case.
    assert lines("upper.hyp") == [line.upper() for line in plain] == lines("upper.alike")
    assert lines("title.hyp") == [title_case(line) for line in plain]
    assert rows["upper"]["bleu"] == rows["upper"]["plain_alike"]["bleu"]
    verbatim = rows["spans"]["spans_verbatim"]
    kinds = {kind for kind, _ in TEST_SPANS} - {"number"}  # the toy vocabulary has no digits
    assert all(verbatim[kind] == 100.0 for kind in kinds), verbatim
    # Without their spans (numbers are no spans), the outputs are those of the plain test.
    spanned = [n for n in range(len(plain)) if TEST_SPANS[n % len(TEST_SPANS)][0] != "number"]
    assert [lines("spans.rest")[n] for n in spanned] == [plain[n] for n in spanned]
    assert lines("typos.ref") == lines("plain.ref") != lines("typos.src")


def test_the_server_answers_as_translate_writes(served: Server, world: World) -> None:
    expected = translate_cli(world.run, LINES, "--prepack", "off", env=child_env(**world.env()))
    reply = httpx.post(served.url + "/v1/translate", json={"text": LINES}, timeout=60)
    assert reply.status_code == 200, reply.text
    assert "".join(f"{t}\n" for t in reply.json()["translations"]) == expected
    assert "https://x.de" in expected and "🙂" in expected
