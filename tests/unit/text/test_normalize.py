"""Normalisation before the model: the invisible characters SentencePiece keeps are removed
(and only those; Multi30k holds none, so the shards `prepare` writes are unchanged), a
typographic character the vocabulary lacks is written as one it holds, and the final
punctuation of a line."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest
from helpers import REPO

from attn_mt.data.tokenizer import train_tokenizer
from attn_mt.text.normalize import (
    INVISIBLE,
    TYPOGRAPHIC,
    final_punct,
    invisible,
    typographic,
    without_final_punct,
)


def test_invisible_characters_go_and_the_rest_stays() -> None:
    line = "Ein\u00adMann \u202bmit\u202c Hut\u2060."
    assert invisible(line) == "EinMann mit Hut."
    kept = "Ein\u00a0Mann \u200d👩\u200d💻 „Hut“ – 3\u202f000"  # no-break spaces, joiners
    assert invisible(kept) is kept


def test_sentencepiece_keeps_exactly_these_as_bytes(toy_config, tmp_path: Path) -> None:
    """What the rule removes SentencePiece reads as byte pieces; what it leaves (spaces,
    zero-width spaces, marks) SentencePiece writes as a space or nothing itself."""
    cfg = toy_config()
    tokenizer = train_tokenizer(cfg.tokenizer, ["qb qc qd"] * 200, tmp_path / "spm")

    def unseen(text: str) -> bool:  # a byte piece, or <unk> without byte fallback
        return tokenizer.encode([text]) != tokenizer.encode(["qbqc"])

    for char in INVISIBLE:
        assert unseen(f"qb{char}qc"), repr(char)
    for char in "\u00a0\u2009\u202f\u3000\u200b\u200e\u200f\u061c\ufeff\t":
        assert tokenizer.encode([f"qb{char}qc"]) == tokenizer.encode(["qb qc"]), repr(char)


def test_multi30k_holds_no_invisible_character() -> None:
    """The shards of every Multi30k language are what they were: no line changes."""
    root = Path(os.environ.get("ATTN_MT_DATA") or REPO.parent / "shared" / "data") / "multi30k"
    files = sorted(root.glob("*.gz"))
    if not files:
        pytest.skip("Multi30k not found; set ATTN_MT_DATA")
    for path in files:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            assert all(invisible(line) is line for line in handle), path.name


def test_typographic_characters_the_vocabulary_lacks() -> None:
    known = set("„“–-\"'")
    table = typographic(known.__contains__)
    assert "„“–".translate(table) == "„“–"  # held: kept
    assert "«x» —y− ‘z’".translate(table) == "\"x\" –y- 'z'"
    assert set(map(chr, table)) == set(TYPOGRAPHIC) - known


def test_final_punctuation() -> None:
    assert final_punct("Ein Hund läuft.  ") == "."
    assert final_punct("Wirklich?!") == "?!"
    assert final_punct("Ein Hund") == ""
    assert without_final_punct("A dog runs.") == "A dog runs"
    assert without_final_punct('He said "go."') == 'He said "go"'
    assert without_final_punct("...") == "..."
