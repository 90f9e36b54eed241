"""Corpus reading, named-corpus lookup and download, cleaning, and token-budget batching."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import random
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from helpers import REPO
from helpers.toy import epoch_lists

from attn_mt.config.data import DataConfig
from attn_mt.config.file import load_config
from attn_mt.config.schema import TokenizerConfig
from attn_mt.data import corpora
from attn_mt.data.batching import collate, length_batches, padding_fraction
from attn_mt.data.corpora import MULTI30K_URL, corpus_file, fetch_corpus, split_files
from attn_mt.data.text import clean_pairs, read_lines, read_parallel
from attn_mt.data.tokenizer import train_tokenizer
from attn_mt.errors import DataError
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID


@pytest.fixture(scope="session")
def multi30k_root() -> Path:
    """The folder holding multi30k/*.gz: $ATTN_MT_DATA, else the workplace's shared copy."""
    root = Path(os.environ.get("ATTN_MT_DATA") or REPO.parent / "shared" / "data")
    if not (root / "multi30k" / "train.de.gz").is_file():
        pytest.skip("Multi30k not found; set ATTN_MT_DATA")
    return root


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """No network: every urlopen fails; returns the list of URLs that were tried."""
    tried: list[str] = []

    def refuse(url, timeout=None):
        tried.append(url)
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    return tried


@pytest.fixture
def empty_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """ATTN_MT_DATA and ATTN_MT_CACHE pointing at empty folders."""
    data_root, cache = tmp_path / "data", tmp_path / "cache"
    data_root.mkdir()
    cache.mkdir()
    monkeypatch.setenv("ATTN_MT_DATA", str(data_root))
    monkeypatch.setenv("ATTN_MT_CACHE", str(cache))
    return data_root, cache


# ---------------------------------------------------------------------------------------------
# Reading


LINES = ["Ein Hund läuft.", "", "Zwei Männer — im Schnee 🙂", "end"]


def test_read_plain_and_gzip_alike(tmp_path: Path):
    text = "".join(line + "\n" for line in LINES).encode("utf-8")
    (tmp_path / "a.txt").write_bytes(text)
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(text))
    (tmp_path / "gz_named_plain.gz").write_bytes(text)  # the content decides, not the suffix
    for name in ("a.txt", "a.txt.gz", "gz_named_plain.gz"):
        assert read_lines(tmp_path / name) == LINES


def test_read_crlf_and_missing_final_newline(tmp_path: Path):
    path = tmp_path / "crlf.txt"
    path.write_bytes("\r\n".join(LINES).encode("utf-8"))
    assert read_lines(path) == LINES


def test_read_empty_file(tmp_path: Path):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    assert read_lines(path) == []


def test_invalid_utf8_names_file_and_line(tmp_path: Path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("ok\nMädchen\n".encode("latin-1"))
    with pytest.raises(DataError, match=rf"^{path}:2: invalid UTF-8"):
        read_lines(path)


def test_missing_and_corrupt_files(tmp_path: Path):
    with pytest.raises(DataError, match="nope.txt: file not found"):
        read_lines(tmp_path / "nope.txt")
    broken = tmp_path / "broken.gz"
    broken.write_bytes(gzip.compress(b"a\nb\n" * 100)[:-10])  # truncated download
    with pytest.raises(DataError, match="broken.gz: cannot read"):
        read_lines(broken)


def test_line_count_mismatch_names_both_counts(tmp_path: Path):
    src, tgt = tmp_path / "s.txt", tmp_path / "t.txt"
    src.write_text("a\nb\nc\n")
    tgt.write_text("x\ny\n")
    with pytest.raises(DataError) as info:
        read_parallel(src, tgt)
    message = str(info.value)
    assert f"{src} has 3 lines" in message and f"{tgt} has 2" in message
    src.write_text("a\nb\n")
    assert read_parallel(src, tgt) == (["a", "b"], ["x", "y"])


def test_clean_pairs_drops_and_counts():
    src = [[5, 6], [], [5] * 10, [7], [8, 9], [4] * 3]
    tgt = [[5], [6], [7], [], [9] * 11, [4] * 10]
    keep, stats = clean_pairs(src, tgt, max_len=10)
    assert keep == [0, 2, 5]  # rows exactly at max_len stay
    assert (stats.kept, stats.dropped) == (3, {"empty": 2, "max_len": 1})


# ---------------------------------------------------------------------------------------------
# Named corpora


def fake_gz(folder: Path, name: str, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(gzip.compress("".join(x + "\n" for x in lines).encode()))
    return path


def test_named_corpus_found_in_attn_mt_data(empty_places, offline):
    data_root, _ = empty_places
    src = fake_gz(data_root / "multi30k", "val.de.gz", ["ein Hund"])
    tgt = fake_gz(data_root / "multi30k", "val.en.gz", ["a dog"])
    assert split_files(DataConfig(dataset="multi30k"), "valid") == (src, tgt)
    assert offline == []  # found locally: no download tried


def test_named_corpus_found_in_cache(empty_places, offline):
    _, cache = empty_places
    path = fake_gz(cache / "data" / "multi30k", "test_2016_flickr.fr.gz", ["un chien"])
    assert corpus_file("multi30k", "test_2016_flickr.fr.gz") == path
    assert offline == []


def test_named_corpus_offline_error_names_every_place(empty_places, offline):
    data_root, cache = empty_places
    with pytest.raises(DataError) as info:
        split_files(DataConfig(dataset="multi30k", src_lang="de", tgt_lang="en"), "train")
    message = str(info.value)
    assert str(data_root / "multi30k" / "train.de.gz") in message
    assert str(cache / "data" / "multi30k" / "train.de.gz") in message
    assert f"{MULTI30K_URL}train.de.gz (no network)" in message
    assert "ATTN_MT_DATA" in message and "attn-mt data fetch multi30k" in message
    assert offline == [MULTI30K_URL + "train.de.gz"]


def test_named_corpus_unknown_language():
    with pytest.raises(DataError, match="multi30k has no language 'xx'"):
        split_files(DataConfig(dataset="multi30k", src_lang="xx", tgt_lang="en"), "train")


def test_unknown_corpus_name():
    with pytest.raises(DataError, match="wmt99: unknown corpus"):
        fetch_corpus("wmt99")


def serve(monkeypatch: pytest.MonkeyPatch, payload: bytes) -> list[str]:
    """Make urlopen return `payload` for any URL; returns the URLs requested."""
    requested: list[str] = []

    def fake_urlopen(url, timeout=None):
        requested.append(url)
        return io.BytesIO(payload)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    return requested


def test_download_checks_sha256_and_leaves_nothing_on_mismatch(
    empty_places, monkeypatch: pytest.MonkeyPatch
):
    _, cache = empty_places
    good = gzip.compress(b"ein Hund\n")
    monkeypatch.setitem(corpora.MULTI30K_SHA256, "val.de.gz", hashlib.sha256(good).hexdigest())
    serve(monkeypatch, b"<html>rate limited</html>")
    with pytest.raises(DataError, match="sha256 .* does not match the expected"):
        corpus_file("multi30k", "val.de.gz")
    assert [p for p in cache.rglob("*") if p.is_file()] == []


def test_download_writes_the_checked_file(empty_places, monkeypatch: pytest.MonkeyPatch):
    _, cache = empty_places
    good = gzip.compress(b"ein Hund\n")
    monkeypatch.setitem(corpora.MULTI30K_SHA256, "val.de.gz", hashlib.sha256(good).hexdigest())
    requested = serve(monkeypatch, good)
    path = corpus_file("multi30k", "val.de.gz")
    assert path == cache / "data" / "multi30k" / "val.de.gz"
    assert path.read_bytes() == good
    assert requested == [MULTI30K_URL + "val.de.gz"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["val.de.gz"]  # no temp file left
    assert corpus_file("multi30k", "val.de.gz") == path  # now cached: no second download
    assert len(requested) == 1


def test_fetch_real_multi30k(multi30k_root: Path, monkeypatch: pytest.MonkeyPatch, offline):
    monkeypatch.setenv("ATTN_MT_DATA", str(multi30k_root))
    paths = fetch_corpus("multi30k")
    assert len(paths) == 12 and all(p.parent == multi30k_root / "multi30k" for p in paths)
    src, tgt = split_files(DataConfig(dataset="multi30k"), "valid")
    assert len(read_parallel(src, tgt)[0]) == 1014


# ---------------------------------------------------------------------------------------------
# Batches


def random_lengths(count: int, seed: int, long_rows: int = 0) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    lengths = [(rng.randint(2, 40), rng.randint(2, 40)) for _ in range(count)]
    return lengths + [(100, 5)] * long_rows


def test_batches_respect_the_token_budget_and_cover_every_row():
    lengths = random_lengths(500, seed=0, long_rows=2)
    batches = epoch_lists(lengths, batch_tokens=64, seed=1, epoch=0)
    for rows in batches:
        longest = max(max(lengths[i]) for i in rows)
        assert len(rows) * longest <= 64 or len(rows) == 1
    assert sorted(i for rows in batches for i in rows) == list(range(len(lengths)))
    assert [500] in batches and [501] in batches  # over-long rows go alone


def test_batch_order_is_a_function_of_seed_and_epoch():
    lengths = random_lengths(300, seed=1)
    first = epoch_lists(lengths, 128, seed=1, epoch=0)
    assert epoch_lists(lengths, 128, seed=1, epoch=0) == first
    assert epoch_lists(lengths, 128, seed=1, epoch=1) != first
    assert epoch_lists(lengths, 128, seed=2, epoch=0) != first


def test_ddp_shares_are_disjoint_equal_and_cover_the_truncated_list():
    lengths = random_lengths(400, seed=2)
    everything = epoch_lists(lengths, 100, seed=3, epoch=5)
    world = 3
    usable = len(everything) - len(everything) % world
    assert usable < len(everything)  # this case exercises the truncation
    shares = [epoch_lists(lengths, 100, 3, 5, rank=r, world_size=world) for r in range(world)]
    assert len({len(share) for share in shares}) == 1
    rows = [i for share in shares for batch in share for i in batch]
    assert len(rows) == len(set(rows))
    assert sorted(map(tuple, sum(shares, []))) == sorted(map(tuple, everything[:usable]))


def test_length_batches_keep_ties_in_the_given_order():
    lengths = [(3, 3)] * 6
    assert length_batches(lengths, 9, order=[5, 4, 3, 2, 1, 0]) == [[5, 4, 3], [2, 1, 0]]


def test_collate_shifts_targets_for_teacher_forcing():
    src_ids, tgt_ids = [[7, 8, 9], [7]], [[10], [11, 12, 13]]
    batch = collate(src_ids, tgt_ids, [0, 1])
    assert batch.src.tolist() == [[7, 8, 9, EOS_ID], [7, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 10, PAD_ID, PAD_ID], [BOS_ID, 11, 12, 13]]
    assert batch.tgt_out.tolist() == [[10, EOS_ID, PAD_ID, PAD_ID], [11, 12, 13, EOS_ID]]
    # The decoder input at position t is the target at t - 1: the model predicts the next token.
    real = batch.tgt_in[:, 1:] != PAD_ID
    assert torch.equal(batch.tgt_in[:, 1:][real], batch.tgt_out[:, :-1][real])
    assert batch.num_tgt_tokens == 6
    assert batch.ids == [0, 1]


def test_padding_is_low_on_toy_data(toy_data: dict[str, Path]):
    src, tgt = read_parallel(toy_data["train.src"], toy_data["train.tgt"])
    src_ids = [line.split() for line in src]  # one "token" per word is enough for lengths
    tgt_ids = [line.split() for line in tgt]
    lengths = [(len(s) + 1, len(t) + 1) for s, t in zip(src_ids, tgt_ids, strict=True)]
    batches = epoch_lists(lengths, 1024, seed=1, epoch=0)
    as_ids = [[1] * len(s) for s in src_ids], [[1] * len(t) for t in tgt_ids]
    assert padding_fraction([collate(*as_ids, rows) for rows in batches]) < 0.05


def test_padding_is_low_on_multi30k(multi30k_root: Path, tmp_path: Path):
    files = multi30k_root / "multi30k"
    src, tgt = read_parallel(files / "train.de.gz", files / "train.en.gz")
    settings = TokenizerConfig(vocab_size=1000, max_sentences=6000)
    tok = train_tokenizer(settings, src[:3000] + tgt[:3000], tmp_path / "spm")
    src_ids, tgt_ids = tok.encode(src), tok.encode(tgt)
    lengths = [(len(s) + 1, len(t) + 1) for s, t in zip(src_ids, tgt_ids, strict=True)]
    budget = load_config(REPO / "configs" / "multi30k_de_en.yaml").train.batch_tokens
    batches = epoch_lists(lengths, budget, seed=1, epoch=0)
    assert padding_fraction([collate(src_ids, tgt_ids, rows) for rows in batches]) < 0.10


@pytest.mark.parametrize("gzipped", [False, True])
def test_parallel_files_may_be_streams_read_once(tmp_path: Path, gzipped: bool) -> None:
    """`evaluate --src <(...) --ref <(...)`: FIFOs are read as they come, once (they were
    'file not found', and a peek at the gzip magic would have eaten the first bytes)."""
    import threading

    texts = {"src": "ein Hund\nzwei\n", "tgt": "a dog\ntwo\n"}
    fifos = {name: tmp_path / name for name in texts}

    def feed(name: str) -> None:
        data = texts[name].encode()
        with open(fifos[name], "wb") as handle:
            handle.write(gzip.compress(data) if gzipped else data)

    for path in fifos.values():
        os.mkfifo(path)
    feeders = [threading.Thread(target=feed, args=(name,), daemon=True) for name in texts]
    for feeder in feeders:
        feeder.start()
    assert read_parallel(fifos["src"], fifos["tgt"]) == (["ein Hund", "zwei"], ["a dog", "two"])
    for feeder in feeders:
        feeder.join(timeout=5)
    assert not any(feeder.is_alive() for feeder in feeders)
