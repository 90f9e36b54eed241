"""The toy task in three languages, for multilingual tests: de (the toy source words), en (the
toy targets) and fr (`toy_language`), line i of each the same sentence."""

from __future__ import annotations

from pathlib import Path

from helpers.toy import toy_config_dict, toy_pairs, write_lines


def toy_language(line: str) -> str:
    """The toy target sentence in a third language: `Ba Ca` -> `bo co`."""
    return " ".join(word[0].lower() + "o" for word in line.split())


def multilingual_files(folder: Path) -> dict[str, Path]:
    """de (the toy source words), en (the toy targets) and fr (`toy_language`) files of the
    train (3000 lines), valid (40) and test (40) splits, line i of each the same sentence."""
    files = {}
    for split, count, seed in (("train", 3000, 1), ("valid", 40, 2), ("test", 40, 3)):
        de, en = toy_pairs(count, seed)
        for lang, lines in (("de", de), ("en", en), ("fr", [toy_language(x) for x in en])):
            files[f"{split}.{lang}"] = write_lines(folder / f"{split}.{lang}", lines)
    return files


def multilingual_raw(files: dict[str, Path], out: Path, pairs=("de-en", "de-fr")) -> dict:
    """The toy config over `files` with one corpus per direction of `pairs` (files entries
    with src_lang/tgt_lang) and a validation set per direction."""
    raw = toy_raw(out)

    def entry(split: str, pair: str) -> dict:
        src, tgt = pair.split("-")
        return {
            "src": str(files[f"{split}.{src}"]),
            "tgt": str(files[f"{split}.{tgt}"]),
            "src_lang": src,
            "tgt_lang": tgt,
        }

    raw["data"]["train"] = [entry("train", p) for p in pairs]
    raw["data"]["valid"] = [entry("valid", p) for p in pairs]
    return raw


def toy_raw(out: Path) -> dict:
    """The toy config's model and training keys, its files placeholders (a test sets them)."""
    placeholder = {
        f"{s}.{side}": Path(f"/{s}.{side}")
        for s in ("train", "valid", "test")
        for side in ("src", "tgt")
    }
    raw = toy_config_dict(placeholder, out)
    raw["data"].pop("test")
    raw["tokenizer"]["vocab_size"] = 100
    return raw
