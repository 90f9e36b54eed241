"""Token shards: the prepared training corpus on disk, written once and memory-mapped by every
process (fairseq's `indexed_dataset` pattern); this module reads
and checks one, `attn_mt.data.shardwriter` writes it.

A prepared folder (written by `attn_mt.data.prepare`) holds

    src.bin, tgt.bin      every kept sentence's token ids end to end (uint16, or int32 when the
                          vocabulary has more than 65,535 pieces), read through numpy.memmap
    index.npy             (N + 1, 2) int64: where pair i starts in src.bin and tgt.bin
    corpus.npy            (N,) int16: which corpus of `data.train` pair i comes from
    src.model, tgt.model  the SentencePiece models the ids belong to
    manifest.json         the inputs' sizes and sha256, the settings, the counts, and the size
                          and sha256 of each file above (written last: no manifest, no trust)

The format is nanoGPT's flat token file with fairseq's offsets index: nothing but numpy, a file
per array, and the page cache shares one copy between all processes of a machine. A sentence is
sliced out only when its batch is built; the lengths (what the batcher needs) are in memory.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attn_mt.data.text import describe_dropped
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import DataError

FORMAT = "attn-mt-shards/2"  # 2: the counts of every rule of data.filters
MANIFEST = "manifest.json"
SHARD_FILES = ("src.bin", "tgt.bin", "index.npy", "corpus.npy", "src.model", "tgt.model")
REBUILD = "rebuild it with `attn-mt prepare --config FILE` (or delete {folder})"


def sha256_file(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _damaged(path: Path, reason: str) -> DataError:
    return DataError(f"{path}: {reason}; {REBUILD.format(folder=path.parent)}")


# ---------------------------------------------------------------------------------------------
# Reading


class TokenView(Sequence):
    """One side of the shards as a read-only sequence of sentences (lists of ids)."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray):
        self.tokens, self.offsets = tokens, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> list[int]:  # type: ignore[override]
        return self.tokens[self.offsets[i] : self.offsets[i + 1]].tolist()

    @classmethod
    def of(cls, sentences: Sequence[Sequence[int]]) -> TokenView:
        """Sentences held in memory laid out as the shards hold them: one flat array of ids
        and the offsets where each sentence starts."""
        lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
        offsets = np.zeros(len(sentences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = itertools.chain.from_iterable(sentences)
        return cls(np.fromiter(flat, dtype=np.int64, count=int(offsets[-1])), offsets)


@dataclass
class Shards:
    """A verified prepared folder, mapped: token views, lengths and the corpus of each pair."""

    folder: Path
    manifest: dict[str, Any]
    src: TokenView
    tgt: TokenView
    lengths: np.ndarray  # (N, 2) tokens of (source, target), without <eos>
    corpus: np.ndarray  # (N,) index into data.train

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def digest(self) -> str:
        """sha256 of every file's size and hash: equal on two machines exactly when the shards
        are (the inputs' paths, which may differ, are left out)."""
        return hashlib.sha256(
            json.dumps(self.manifest["files"], sort_keys=True).encode()
        ).hexdigest()

    def tokenizers(self) -> tuple[Tokenizer, Tokenizer]:
        """The (source, target) SentencePiece models; one object when they are the same."""
        src = Tokenizer((self.folder / "src.model").read_bytes())
        tgt_bytes = (self.folder / "tgt.model").read_bytes()
        return src, (src if tgt_bytes == src.model_bytes else Tokenizer(tgt_bytes))

    def tokenizer_hashes(self) -> list[str]:
        return list(self.manifest["tokenizer_sha256"])


def open_shards(folder: Path) -> Shards:
    """Map a prepared folder after checking every file's size and sha256 against the manifest;
    anything missing, truncated or altered is a one-line `DataError` naming the file."""
    manifest_path = folder / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise _damaged(manifest_path, f"unreadable manifest ({type(err).__name__})") from None
    if problem := _manifest_problem(manifest):
        raise _damaged(manifest_path, f"unreadable manifest ({problem})")
    if manifest["format"] != FORMAT:
        raise _damaged(manifest_path, f"format {manifest['format']}, expected {FORMAT}")
    files, dtype = manifest["files"], np.dtype(manifest["dtype"])
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            raise _damaged(path, "missing")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise _damaged(path, f"truncated: {size} bytes, expected {expected['bytes']}")
        if sha256_file(path) != expected["sha256"]:
            raise _damaged(path, "corrupt: its sha256 differs from the manifest's")
    for name, count in zip(("src.bin", "tgt.bin"), manifest["tokens"], strict=True):
        if files[name]["bytes"] != count * dtype.itemsize:  # e.g. the dtype was edited
            raise _damaged(manifest_path, f"{name} does not hold {count} {dtype} tokens")
    offsets = np.load(folder / "index.npy", mmap_mode="r")
    if offsets.shape != (manifest["pairs"] + 1, 2) or list(offsets[-1]) != manifest["tokens"]:
        raise _damaged(manifest_path, "index.npy does not match its pairs and tokens")
    src_tokens, tgt_tokens = (
        np.memmap(folder / name, dtype=dtype, mode="r") if count else np.zeros(0, dtype)
        for name, count in zip(("src.bin", "tgt.bin"), manifest["tokens"], strict=True)
    )
    return Shards(
        folder=folder,
        manifest=manifest,
        src=TokenView(src_tokens, offsets[:, 0]),
        tgt=TokenView(tgt_tokens, offsets[:, 1]),
        lengths=np.diff(offsets, axis=0),
        corpus=np.load(folder / "corpus.npy"),
    )


# A manifest's fields and their types; a corpus entry's counts (FilterStats and `pairs`).
MANIFEST_FIELDS = {
    "format": str,
    "corpora": list,
    "identity": dict,
    "dtype": str,
    "pairs": int,
    "tokens": list,
    "tokenizer_sha256": list,
    "files": dict,
}
CORPUS_COUNTS = ("pairs", "kept")


def _manifest_problem(manifest: Any) -> str | None:
    """What makes `manifest` unusable (a field missing or of the wrong type), or None."""

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not isinstance(manifest, dict):
        return "not a JSON object"
    for name, kind in MANIFEST_FIELDS.items():
        if not isinstance(manifest.get(name), kind) or isinstance(manifest.get(name), bool):
            return f"{name}: missing or not a {kind.__name__}"
    if manifest["dtype"] not in ("uint16", "int32"):
        return f"dtype: {manifest['dtype']!r}, expected uint16 or int32"
    if len(manifest["tokens"]) != 2 or not all(
        map(count, [manifest["pairs"], *manifest["tokens"]])
    ):
        return "pairs or tokens: not counts"
    files = manifest["files"]
    if sorted(files) != sorted(SHARD_FILES) or not all(
        isinstance(f, dict) and count(f.get("bytes")) and isinstance(f.get("sha256"), str)
        for f in files.values()
    ):
        return f"files: not the {len(SHARD_FILES)} shard files with their bytes and sha256"
    if not all(
        isinstance(c, dict)
        and all(count(c.get(k)) for k in CORPUS_COUNTS)
        and isinstance(c.get("dropped"), dict)
        and all(isinstance(rule, str) and count(n) for rule, n in c["dropped"].items())
        for c in manifest["corpora"]
    ):
        return "corpora: an entry without its counts"
    return None


def corpus_lines(entries: Sequence[dict[str, Any]], weights: Sequence[float]) -> list[str]:
    """One line per corpus (a manifest's `corpora`): pairs kept (and dropped, by rule), weight,
    tag, share of an epoch."""
    sizes = [w * e["kept"] for w, e in zip(weights, entries, strict=True)]
    lines = []
    for i, (entry, weight, size) in enumerate(zip(entries, weights, sizes, strict=True)):
        tags = [t for t in (entry.get("language_tag"), entry["tag"]) if t]  # as put before
        tag = f", tag {' '.join(tags)}" if tags else ""
        dropped = f" ({describe_dropped(entry['dropped'])})" if "dropped" in entry else ""
        lines.append(
            f"corpus {i + 1}: {entry['src_path']}: {entry['kept']:,} of {entry['pairs']:,} pairs "
            f"kept{dropped}, weight {weight:g}{tag}, {100 * size / max(sum(sizes), 1):.1f}% of "
            "an epoch"
        )
    return lines


def temperature_weights(
    weights: Sequence[float], counts: Sequence[int] | np.ndarray, temperature: float
) -> list[float]:
    """Per-corpus weights that give corpus i the share p_i ~ n_i^(1/T) of an epoch, n_i its
    pairs per epoch at `weights` (weight x pairs kept), the epoch keeping its size sum(n_i):
    T = 1 leaves the weights as they are (shares by size); a larger T flattens the mix toward
    equal shares (Arivazhagan et al., 2019; mBART, NLLB sample languages so). The shares are
    computed in log space, as n^(1/T) overflows for a small T; a T so small that a corpus gets
    no pair an epoch is refused."""
    if temperature == 1:
        return list(weights)
    sizes = np.asarray(weights, dtype=np.float64) * np.asarray(counts, dtype=np.float64)
    logs = np.log(sizes, out=np.full_like(sizes, -np.inf), where=sizes > 0)
    shares = np.exp((logs - logs.max()) / temperature)  # n_i^(1/T) / max n^(1/T), in [0, 1]
    shares /= shares.sum()
    starved = [i for i, size in enumerate(sizes) if size and shares[i] * sizes.sum() < 0.5]
    if starved:
        i = starved[0]
        raise DataError(
            f"data.temperature: {temperature:g} gives corpus {i + 1} ({sizes[i]:,.0f} pairs) no "
            "pair per epoch, as n^(1/T) puts nearly all of it on the largest corpus; raise it "
            "(1 = shares by size, larger flattens the mix)"
        )
    return [
        float(w * share * sizes.sum() / size) if size else float(w)
        for w, share, size in zip(weights, shares, sizes, strict=True)
    ]


def mix_weights(shards: Shards, weights: Sequence[float], temperature: float) -> list[float]:
    """The weights an epoch of `shards` takes its corpora with (`temperature_weights`)."""
    counts = np.bincount(shards.corpus, minlength=len(weights))
    return temperature_weights(weights, counts, temperature)
