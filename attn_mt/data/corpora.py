"""Named corpora (`multi30k`) and the files of a config's splits: where they are looked for,
the download (sha256-checked, written atomically) and what `attn-mt data info` shows.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from pathlib import Path

from attn_mt.config.data import CORPUS_LANGUAGES, DataConfig, TrainCorpus, language_tag
from attn_mt.data.text import read_lines
from attn_mt.errors import DataError, named
from attn_mt.fileio import atomic_write, cache_dir

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"


MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


MULTI30K_LANGS = CORPUS_LANGUAGES["multi30k"]


MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
}


# ---------------------------------------------------------------------------------------------
# Where things live


def data_roots() -> list[Path]:
    """Folders searched for named corpora, in order: $ATTN_MT_DATA, then the cache."""
    roots = []
    if os.environ.get("ATTN_MT_DATA"):
        roots.append(Path(os.environ["ATTN_MT_DATA"]).expanduser())
    roots.append(cache_dir() / "data")
    return roots


def offline() -> bool:
    """True when $ATTN_MT_OFFLINE is set (to anything but 0): never touch the network."""
    return os.environ.get("ATTN_MT_OFFLINE", "0").strip() not in ("", "0")


# ---------------------------------------------------------------------------------------------
# Named corpora


def corpus_file(name: str, filename: str, download: bool = True) -> Path:
    """Find `filename` of named corpus `name` locally, or download it (sha256-checked)."""
    looked = []
    for root in data_roots():
        path = root / name / filename
        if path.is_file():
            return path
        looked.append(str(path))
    target = cache_dir() / "data" / name / filename
    if download and offline():
        looked.append("no download: ATTN_MT_OFFLINE is set")
    elif download:
        try:
            _download(MULTI30K_URL + filename, target, MULTI30K_SHA256[filename])
            return target
        except (urllib.error.URLError, OSError, TimeoutError) as err:
            looked.append(f"{MULTI30K_URL}{filename} ({getattr(err, 'reason', err)})")
    raise DataError(
        f"{name}: {filename} not found; looked in {'; '.join(looked)}. Put the corpus files in "
        f"$ATTN_MT_DATA/{name}/ (or run `attn-mt data fetch {name}` where there is network; "
        "ATTN_MT_OFFLINE=1 turns downloads off)"
    )


def _download(url: str, target: Path, sha256: str) -> None:
    """Download to a temp file beside `target`, check its hash, then rename atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url, timeout=30) as response:
        payload = response.read()
    digest = hashlib.sha256(payload).hexdigest()
    if digest != sha256:
        raise DataError(f"{url}: sha256 {digest} does not match the expected {sha256}")
    with atomic_write(target) as out:
        out.write(payload)


def fetch_corpus(name: str) -> list[Path]:
    """Make every file of a named corpus available locally; return their paths."""
    if name != "multi30k":
        raise DataError(f"{named(name)}: unknown corpus; known: multi30k")
    return [corpus_file(name, filename) for filename in MULTI30K_SHA256]


def corpus_info() -> list[str]:
    """Human-readable lines: each named corpus file and where (or whether) it was found."""
    lines = [f"data folders searched: {', '.join(str(r) for r in data_roots())}"]
    for filename, sha in MULTI30K_SHA256.items():
        found = next(
            (
                r / "multi30k" / filename
                for r in data_roots()
                if (r / "multi30k" / filename).is_file()
            ),
            None,
        )
        if found is None:
            lines.append(f"multi30k/{filename}: missing (attn-mt data fetch multi30k)")
            continue
        ok = hashlib.sha256(found.read_bytes()).hexdigest() == sha
        count = len(read_lines(found))
        lines.append(
            f"multi30k/{filename}: {count} lines, sha256 {'ok' if ok else 'MISMATCH'}, {found}"
        )
    return lines


# ---------------------------------------------------------------------------------------------
# The files of a config


def split_files(cfg: DataConfig, split: str, pair: str | None = None) -> tuple[Path, Path] | None:
    """The (source, target) paths of `split` (train/valid/test), or None if not configured;
    `pair` ("de-en") picks a direction of a named corpus or of a `data.valid` list."""
    files = getattr(cfg, split)
    if pair is None and len(cfg.pairs) == 1:  # the one direction of data.pairs
        pair = cfg.pairs[0]
    if isinstance(files, list):
        if split == "valid":
            return _listed_direction(files, pair)
        raise DataError("data.train: a list of corpora is read through `attn-mt prepare`")
    if pair is None and files.src and files.tgt:
        return Path(files.src), Path(files.tgt)
    if pair is None and (files.src or files.tgt):
        missing = "tgt" if files.src else "src"
        raise DataError(f"data.{split}.{missing}: missing; give both src and tgt files")
    if cfg.dataset is None:
        if pair is not None:
            raise DataError(f"--pair {pair}: the run's config names no corpus; use --src and --ref")
        return None
    src_lang, tgt_lang = pair.split("-", 1) if pair else (cfg.src_lang, cfg.tgt_lang)
    for lang in (src_lang, tgt_lang):
        if lang not in MULTI30K_LANGS:
            raise DataError(f"multi30k has no language {lang!r}; choose from {MULTI30K_LANGS}")
    stem = MULTI30K_SPLITS[split]
    return (
        corpus_file(cfg.dataset, f"{stem}.{src_lang}.gz"),
        corpus_file(cfg.dataset, f"{stem}.{tgt_lang}.gz"),
    )


def _listed_direction(entries: list, pair: str | None) -> tuple[Path, Path]:
    """The files of direction `pair` in a `data.valid` list (its only entry when None)."""
    named = {f"{e.src_lang}-{e.tgt_lang}": e for e in entries}
    if pair is None and len(entries) == 1:
        pair = next(iter(named))
    if pair not in named:
        raise DataError(f"--pair {pair}: data.valid has the directions {', '.join(named)}")
    return Path(named[pair].src), Path(named[pair].tgt)


def pair_name(src_lang: str, tgt_lang: str) -> str:
    """A direction as the config, the logs and metrics.jsonl write it: `de-en`."""
    return f"{src_lang}-{tgt_lang}"


def valid_directions(cfg: DataConfig) -> dict[str, tuple[Path, Path]] | None:
    """Each direction's validation files of a multilingual config ("de-en" -> paths); None
    for one direction (its validation is `split_files(cfg, "valid")`)."""
    if isinstance(cfg.valid, list) and cfg.valid[0].src_lang:
        pairs = [pair_name(e.src_lang, e.tgt_lang) for e in cfg.valid]  # type: ignore[arg-type]
    elif cfg.pairs:
        pairs = list(cfg.pairs)
    else:
        return None
    if len(pairs) == 1 and not cfg.language_tags():
        return None
    return {pair: split_files(cfg, "valid", pair) for pair in pairs}  # type: ignore[misc]


def train_corpora(cfg: DataConfig) -> list[TrainCorpus]:
    """The training corpora of a mix, each with existing src/tgt paths (one when not a list,
    one per direction of data.pairs)."""
    if isinstance(cfg.train, list):
        return list(cfg.train)
    if cfg.pairs:
        corpora = []
        for pair in cfg.pairs:
            src, tgt = split_files(cfg, "train", pair)  # type: ignore[misc]  # a named corpus
            src_lang, tgt_lang = pair.split("-", 1)
            corpora.append(
                TrainCorpus(src=str(src), tgt=str(tgt), src_lang=src_lang, tgt_lang=tgt_lang)
            )
        return corpora
    src, tgt = split_files(cfg, "train")  # type: ignore[misc]  # validate() ensures both
    return [TrainCorpus(src=str(src), tgt=str(tgt))]


def source_tags(cfg: DataConfig, corpus: TrainCorpus) -> list[str]:
    """The pieces put before each source sentence of `corpus`: the target-language tag (when
    the model has several target languages), then the corpus's own tag."""
    tags = [language_tag(corpus.tgt_lang)] if cfg.language_tags() and corpus.tgt_lang else []
    return tags + ([corpus.tag] if corpus.tag else [])
