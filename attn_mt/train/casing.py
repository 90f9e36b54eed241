"""A run's casing table (`attn_mt.text.casing`): built from its config's training sources, one
table per source language, kept in the run folder (`casing.json`, to read) and in every
checkpoint (`casing`, plain data, what `attn_mt.load` reads); `add_casing_table` gives one to a
run or checkpoint trained or imported without (`attn-mt recase-table`).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attn_mt.checkpoint import checkpoint_config, load_checkpoint, save_checkpoint
from attn_mt.config.schema import Config
from attn_mt.data.corpora import train_corpora
from attn_mt.data.text import iter_lines
from attn_mt.errors import UserError
from attn_mt.fileio import atomic_write
from attn_mt.paths import resolve_checkpoint
from attn_mt.text.casing import CasingTable, tables_to_dict
from attn_mt.text.normalize import invisible

CASING_FILE = "casing.json"  # in the run folder, beside config.yaml (runfolder.RUN_ENTRIES)


def casing_table(cfg: Config) -> dict[str, Any]:
    """The casing tables of `cfg`'s training sources, per source language, as a checkpoint
    holds them: at most tokenizer.max_sentences lines of each language, read as `prepare`
    reads them (`invisible` removed); a file read once even where several corpora share it."""
    files: dict[str, list[str]] = {}
    for corpus in train_corpora(cfg.data):
        lang = str(corpus.src_lang or cfg.data.src_lang)
        paths = files.setdefault(lang, [])
        if str(corpus.src) not in paths:
            paths.append(str(corpus.src))
    tables = {}
    for lang, paths in files.items():
        lines = itertools.chain.from_iterable(iter_lines(path) for path in paths)
        capped = itertools.islice(lines, cfg.tokenizer.max_sentences)
        tables[lang] = CasingTable.build(invisible(line) for line in capped)
    return tables_to_dict(tables)


def write_casing_file(casing: dict[str, Any], out_dir: str | Path) -> Path:
    """`casing.json` in the run folder `out_dir`, written whole or not at all."""
    path = Path(out_dir) / CASING_FILE
    with atomic_write(path) as handle:
        handle.write(json.dumps(casing, ensure_ascii=False, sort_keys=True).encode("utf-8"))
    return path


@dataclass
class CasingAdded:
    """What `add_casing_table` wrote: each language's words, and the files."""

    words: dict[str, int]
    files: list[Path]


def add_casing_table(config: Config, model: str | Path) -> CasingAdded:
    """The casing table of `config`'s training sources put into `model`: a run folder's every
    checkpoint (best.pt, last.pt, step_N.pt) and its casing.json, or one .pt file. The
    config's source languages must be the model's."""
    given = Path(model)
    paths = sorted((given / "checkpoints").glob("*.pt")) if given.is_dir() else []
    paths = paths or [resolve_checkpoint(given)]
    states = [(path, load_checkpoint(path)) for path in paths]  # every one readable first
    theirs = {src for src, _ in checkpoint_config(states[0][1], paths[0]).data.directions()}
    ours = {src for src, _ in config.data.directions()}
    if not ours <= theirs:
        raise UserError(
            f"{model}: translates from {', '.join(sorted(theirs))}, and the config's training "
            f"sources are in {', '.join(sorted(ours))}; give the config of its own training "
            "(or fine-tuning) corpus"
        )
    casing = casing_table(config)
    written = []
    for path, state in states:
        save_checkpoint({**state, "casing": casing}, path)
        written.append(path)
    if given.is_dir():
        written.append(write_casing_file(casing, given))
    words = {lang: len(table["words"]) for lang, table in casing["languages"].items()}
    return CasingAdded(words, written)
