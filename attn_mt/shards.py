"""Prepared training data, read back: memory-mapped token shards and the batches cut from them.

A prepared folder (written by `attn_mt.prepare`) holds

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
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attn_mt.config import Config
from attn_mt.data import Batch, collate, epoch_order, padding_fraction
from attn_mt.distributed import World
from attn_mt.errors import DataError
from attn_mt.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer

FORMAT = "attn-mt-shards/1"
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


class TokenView(Sequence):
    """One side of the shards as a read-only sequence of sentences (lists of ids)."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray):
        self.tokens, self.offsets = tokens, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> list[int]:  # type: ignore[override]
        return self.tokens[self.offsets[i] : self.offsets[i + 1]].tolist()


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

    def collate(self, rows: np.ndarray) -> Batch:
        """The padded batch of pairs `rows`, gathered from the maps in one step per tensor:
        equal to `data.collate` of the same sentences, without a Python list per sentence."""
        src = _padded(self.src, rows, lead=None, tail=EOS_ID)
        tgt_in = _padded(self.tgt, rows, lead=BOS_ID, tail=None)
        tgt_out = _padded(self.tgt, rows, lead=None, tail=EOS_ID)
        return Batch(src, tgt_in, tgt_out, rows.tolist())


def _padded(side: TokenView, rows: np.ndarray, lead: int | None, tail: int | None) -> torch.Tensor:
    """(B, L) ids of `rows`: [lead] + sentence + [tail], right-padded with PAD_ID."""
    starts, lengths = side.offsets[rows], side.offsets[rows + 1] - side.offsets[rows]
    shift = int(lead is not None)
    width = int(lengths.max(initial=0)) + 1
    columns = np.arange(width) - shift  # (L,) position within the sentence
    inside = (columns >= 0) & (columns < lengths[:, None])  # (B, L)
    where = np.where(inside, starts[:, None] + columns, 0)  # (B, L) index into the flat ids
    ids = np.where(inside, side.tokens[where], PAD_ID)
    if lead is not None:
        ids[:, 0] = lead
    if tail is not None:
        ids[np.arange(len(rows)), lengths] = tail
    return torch.from_numpy(ids.astype(np.int64))


def open_shards(folder: Path) -> Shards:
    """Map a prepared folder after checking every file's size and sha256 against the manifest;
    anything missing, truncated or altered is a one-line `DataError` naming the file."""
    manifest_path = folder / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files, dtype = manifest["files"], np.dtype(manifest["dtype"])
        if manifest["format"] != FORMAT:
            raise _damaged(manifest_path, f"format {manifest['format']}, expected {FORMAT}")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise _damaged(manifest_path, f"unreadable manifest ({type(err).__name__})") from None
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            raise _damaged(path, "missing")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise _damaged(path, f"truncated: {size} bytes, expected {expected['bytes']}")
        if sha256_file(path) != expected["sha256"]:
            raise _damaged(path, "corrupt: its sha256 differs from the manifest's")
    offsets = np.load(folder / "index.npy", mmap_mode="r")
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


def corpus_lines(entries: Sequence[dict[str, Any]], weights: Sequence[float]) -> list[str]:
    """One line per corpus (a manifest's `corpora`): pairs kept, weight, tag, share of an epoch."""
    sizes = [w * e["kept"] for w, e in zip(weights, entries, strict=True)]
    lines = []
    for i, (entry, weight, size) in enumerate(zip(entries, weights, sizes, strict=True)):
        tag = f", tag {entry['tag']}" if entry["tag"] else ""
        lines.append(
            f"corpus {i + 1}: {entry['src_path']}: {entry['kept']:,} of {entry['pairs']:,} pairs "
            f"kept, weight {weight:g}{tag}, {100 * size / max(sum(sizes), 1):.1f}% of an epoch"
        )
    return lines


@dataclass
class Resampler:
    """Subword regularization of a batch (`tokenizer.sampling_alpha`): its pairs' best
    segmentations, as the shards hold them, decoded to text and encoded again with a sampled one.

    The seed is the batch's place in the data (seed, epoch, batch, rank), so a resumed run
    samples what the straight run would have. The batch was cut by the best segmentations'
    lengths, and its padded width is that of its longest sentence: so that one long sample
    does not widen the whole batch (it did, by up to 80% of padding), a sampled sentence
    keeps its best segmentation when it is longer than the batch's longest best one plus 10%
    (at least 2 pieces), or than `data.max_len`. On Multi30k at alpha 0.3 a batch then holds
    6% more real tokens and a 13% larger padded tensor than unsampled, and 53% of its
    sentences are cut differently.
    """

    tokenizers: tuple[Tokenizer, Tokenizer]
    alpha: float
    max_len: int

    def collate(self, shards: Shards, rows: np.ndarray, seed: int) -> Batch:
        sides = []
        for tokenizer, view in zip(self.tokenizers, (shards.src, shards.tgt), strict=True):
            best = [view[row] for row in rows]
            sampled = tokenizer.sample(tokenizer.decode(best), self.alpha, seed)
            width = max(map(len, best))
            limit = min(width + max(2, width // 10), self.max_len)
            sides.append(
                [s if 0 < len(s) <= limit else b for s, b in zip(sampled, best, strict=True)]
            )
        batch = collate(*sides, range(len(rows)))
        batch.ids = rows.tolist()
        return batch


def batch_seed(*place: int) -> int:
    """A 32-bit seed for SentencePiece from a batch's place (seed, epoch, batch, rank)."""
    return int(np.random.SeedSequence(list(place)).generate_state(1)[0])


class ShardSource:
    """This rank's batches from the shards, epoch after epoch, from a resumable position.

    An epoch takes each corpus `weight` times: whole passes, plus for a fractional weight a
    subset drawn anew each epoch (seeded by seed, epoch and corpus). With every weight 1 the
    epoch is the corpus itself and the batches are `data.epoch_order` of its lengths.
    """

    def __init__(
        self,
        shards: Shards,
        weights: Sequence[float],
        batch_tokens: int,
        seed: int,
        world: World = World(),
        resampler: Resampler | None = None,
    ):
        self.shards, self.weights = shards, list(weights)
        self.resampler = resampler
        self.batch_tokens, self.seed, self.world = batch_tokens, seed, world
        counts = np.bincount(shards.corpus, minlength=len(self.weights))
        self.starts = np.concatenate([[0], np.cumsum(counts)])  # corpora are stored in order
        self.epoch, self.index = 0, 0  # the position
        self.rescaled = ""  # how a position saved by another process count was mapped
        self._order: tuple[int, list[np.ndarray]] | None = None  # (epoch, its batches)

    @classmethod
    def from_config(cls, cfg: Config, shards: Shards, world: World) -> ShardSource:
        """The source of `cfg`'s weights, batch budget, seed and subword sampling for this
        process."""
        alpha = cfg.tokenizer.sampling_alpha
        resampler = Resampler(shards.tokenizers(), alpha, cfg.data.max_len) if alpha else None
        t = cfg.train
        return cls(shards, cfg.data.weights(), t.batch_tokens, t.seed, world, resampler)

    @property
    def batches(self) -> list[np.ndarray]:
        """This rank's batches (rows) of the current epoch, computed once per epoch."""
        if self._order is None or self._order[0] != self.epoch:
            self._order = (self.epoch, self._batches(self.epoch))
        return self._order[1]

    def epoch_rows(self, epoch: int) -> np.ndarray:
        """The pairs of one epoch (with repeats), before batching."""
        if all(w == 1 for w in self.weights):
            return np.arange(len(self.shards))
        parts = []
        for c, weight in enumerate(self.weights):
            start, end = int(self.starts[c]), int(self.starts[c + 1])
            parts += [np.arange(start, end)] * int(weight)
            extra = round((weight - int(weight)) * (end - start))
            if extra:
                rng = np.random.default_rng([self.seed, epoch, c])
                parts.append(start + np.sort(rng.choice(end - start, extra, replace=False)))
        return np.concatenate(parts)

    def _batches(self, epoch: int) -> list[np.ndarray]:
        rows = self.epoch_rows(epoch)
        lengths = self.shards.lengths[rows] + 1  # + <eos>: what the batch holds
        batches = epoch_order(
            lengths, self.batch_tokens, self.seed, epoch, self.world.rank, self.world.size
        )
        if not batches:
            raise DataError(
                f"the training data makes fewer batches than the {self.world.size} processes; "
                "lower train.batch_tokens or use fewer processes"
            )
        return [rows[positions] for positions in batches]

    @property
    def epochs_done(self) -> int:
        """Whole epochs consumed so far."""
        return self.epoch + (1 if self.index >= len(self.batches) else 0)

    @property
    def epochs_run(self) -> float:
        """Epochs consumed so far, the current one's share included (for the ETA)."""
        return self.epoch + self.index / len(self.batches)

    def next(self) -> Batch:
        """The next batch of this rank, moving to the next epoch at the end of one."""
        if self.index >= len(self.batches):
            self.epoch, self.index = self.epoch + 1, 0
        rows = self.batches[self.index]
        self.index += 1
        if self.resampler is None:
            return self.shards.collate(rows)
        seed = batch_seed(self.seed, self.epoch, self.index, self.world.rank)
        return self.resampler.collate(self.shards, rows, seed)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "world_size": self.world.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go to a saved position; from another process count, keep the share of the epoch's
        global order already seen (rounded up: a few batches may be skipped, none repeated)."""
        index, saved_world = state["index"], state.get("world_size", 1)
        if saved_world != self.world.size:
            index = -(-index * saved_world // self.world.size)
            self.rescaled = (
                f"resuming a {saved_world}-process run with {self.world.size} processes: "
                f"epoch {state['epoch']} continues at batch {index}"
            )
        self.epoch, self.index = state["epoch"], index

    def describe(self) -> str:
        """Batches per epoch and the padding share of the first 50 (for the start-up log)."""
        sample = [self.shards.collate(rows) for rows in self.batches[:50]]
        per = " per process" if self.world.size > 1 else ""
        padding = 100 * padding_fraction(sample)
        line = f"{len(self.batches)} batches per epoch{per}, padding {padding:.1f}%"
        if self.resampler:
            line += f", segmentations sampled (alpha {self.resampler.alpha:g})"
        return f"{line}; {self.rescaled}" if self.rescaled else line
