"""Prepared token shards: today's encoding exactly, prepared once, refused when damaged, several
corpora mixed by weight and tagged, and numpy batches equal to the list-based ones."""

from __future__ import annotations

import json
import logging
import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from helpers import REPO
from helpers.toy import epoch_lists, toy_config_dict, toy_pairs, write_lines

from attn_mt.config.data import TrainCorpus
from attn_mt.config.file import config_from_dict, load_config
from attn_mt.config.schema import Config
from attn_mt.data import pool, shardwriter
from attn_mt.data import prepare as prepare_module
from attn_mt.data.batching import collate, length_batches
from attn_mt.data.corpora import cache_dir
from attn_mt.data.corpus import training_data
from attn_mt.data.epochs import ShardBatches
from attn_mt.data.prepare import prepare_shards, sample_pairs
from attn_mt.data.shards import open_shards
from attn_mt.data.text import clean_pairs, read_parallel
from attn_mt.data.tokenizer import build_tokenizers
from attn_mt.distributed import World
from attn_mt.errors import ConfigError, DataError


def shard_config(toy_data: dict[str, Path], tmp_path: Path, **data) -> Config:
    """The toy config with its own prepared folder (tests must not share one)."""
    raw = toy_config_dict(toy_data, tmp_path / "run")
    raw["data"].update(prepared_dir=str(tmp_path / "prepared"), **data)
    return config_from_dict(raw)


@pytest.fixture
def count_encodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the chunks encoded (prepare runs in this process with workers=1)."""
    calls: list[int] = []
    encode = shardwriter.encode_chunk

    def counted(task):
        calls.append(len(task[2]))
        return encode(task)

    monkeypatch.setattr(shardwriter, "encode_chunk", counted)
    return calls


# ---------------------------------------------------------------------------------------------
# Exactly today's tokens


@pytest.mark.parametrize("max_len", [64, 9])
def test_shards_hold_exactly_todays_encoding(toy_data, tmp_path, max_len):
    """Two worker processes; with max_len 9 some pairs are dropped, and the same ones."""
    cfg = shard_config(toy_data, tmp_path, max_len=max_len)
    shards = prepare_shards(cfg, workers=2)
    # What `train` encoded before shards: every line at once, in this process.
    src, tgt = read_parallel(cfg.data.train.src, cfg.data.train.tgt)
    src_tok, tgt_tok = build_tokenizers(cfg.tokenizer, src, tgt, cache_dir() / "spm")
    src_ids, tgt_ids = src_tok.encode(src), tgt_tok.encode(tgt)
    keep, stats = clean_pairs(src_ids, tgt_ids, max_len)
    assert [tok.model_bytes for tok in shards.tokenizers()] == [
        src_tok.model_bytes,
        tgt_tok.model_bytes,
    ]
    assert len(shards) == len(keep) == stats.kept
    assert (len(keep) < 3000) == (max_len == 9)
    assert [shards.src[i] for i in range(len(shards))] == [src_ids[i] for i in keep]
    assert [shards.tgt[i] for i in range(len(shards))] == [tgt_ids[i] for i in keep]
    corpus = training_data(cfg, None, World())[2]  # what `train` reads now
    assert corpus.shards.folder == shards.folder and corpus.stats == stats
    assert shards.src.tokens.dtype == np.uint16  # a 60-piece vocabulary fits
    entry = shards.manifest["corpora"][0]
    assert (entry["kept"], entry["dropped"]) == (stats.kept, stats.dropped)
    # The batches of every epoch are today's, row for row.
    source = ShardBatches(shards, [1.0], cfg.train.batch_tokens, cfg.train.seed)
    lengths = [(len(src_ids[i]) + 1, len(tgt_ids[i]) + 1) for i in keep]
    kept_src, kept_tgt = [src_ids[i] for i in keep], [tgt_ids[i] for i in keep]
    for epoch in range(2):
        expected = epoch_lists(lengths, cfg.train.batch_tokens, cfg.train.seed, epoch)
        taken = [source.next() for _ in expected]
        assert [batch.ids for batch in taken] == expected
        for batch in taken[:10]:  # gathered from the maps, yet today's tensors
            today = collate(kept_src, kept_tgt, batch.ids)
            for name in ("src", "tgt_in", "tgt_out"):
                assert torch.equal(getattr(batch, name), getattr(today, name)), name
    assert source.epoch == 1 and source.epochs_done == 2


def test_length_ratio_filter_counts(tmp_path: Path):
    folder = tmp_path / "data"
    folder.mkdir()
    src, tgt = toy_pairs(400, seed=5)
    src += ["qb qc", "qb " * 12]
    tgt += ["Ba Ca " * 8, "Ba"]  # one target 8x too long, one source 12x too long
    files = {
        f"{split}.{side}": write_lines(folder / f"{split}.{side}", lines)
        for split in ("train", "valid", "test")
        for side, lines in (("src", src), ("tgt", tgt))
    }
    cfg = shard_config(files, tmp_path, max_len_ratio=3)
    entry = prepare_shards(cfg, workers=1).manifest["corpora"][0]
    ratio = entry["dropped"]["max_len_ratio"]
    assert ratio >= 2 and entry["kept"] + ratio == entry["pairs"] == 402


def test_sample_is_bounded_aligned_and_seeded(toy_data):
    corpus = shard_config(toy_data, Path("/nonexistent")).data.train
    src, tgt = toy_pairs(3000, seed=1)
    assert sample_pairs([corpus], 5000) == (src, tgt)  # everything, in order
    small = sample_pairs([corpus], 100)
    assert len(small[0]) == 100 and small == sample_pairs([corpus], 100)
    pairs = set(zip(src, tgt, strict=True))
    assert all(pair in pairs for pair in zip(*small, strict=True))  # each src with its tgt
    assert small != sample_pairs([corpus], 100, seed=1)


# ---------------------------------------------------------------------------------------------
# Prepared once; any change re-prepares


def test_unchanged_corpus_is_never_encoded_twice(toy_data, tmp_path, count_encodes):
    cfg = shard_config(toy_data, tmp_path)
    first = prepare_shards(cfg, workers=1)
    assert sum(count_encodes) == 3000
    again = prepare_shards(cfg, workers=1)
    assert again.folder == first.folder and sum(count_encodes) == 3000
    # A weight is applied per epoch: no new encoding either.
    raw = toy_config_dict(toy_data, tmp_path / "run")
    raw["data"]["train"] = [{**raw["data"]["train"], "weight": 3}]
    raw["data"]["prepared_dir"] = str(tmp_path / "prepared")
    assert prepare_shards(config_from_dict(raw), workers=1).folder == first.folder
    assert sum(count_encodes) == 3000


@pytest.mark.parametrize("change", ["corpus", "max_len", "tokenizer", "tag"])
def test_any_change_re_prepares(toy_data, tmp_path, count_encodes, change):
    folder = tmp_path / "copy"
    folder.mkdir()
    files = {name: write_lines(folder / path.name, path.read_text().splitlines())
             for name, path in toy_data.items()}  # fmt: skip
    cfg = shard_config(files, tmp_path)
    first = prepare_shards(cfg, workers=1)
    raw = cfg.to_dict()
    if change == "corpus":  # one character of one line
        text = files["train.tgt"].read_text()
        files["train.tgt"].write_text(text.replace("Ba", "Ca", 1))
    elif change == "max_len":
        raw["data"]["max_len"] = 10
    elif change == "tokenizer":
        raw["tokenizer"]["vocab_size"] = 50
    else:
        raw["data"]["train"] = [{**raw["data"]["train"], "tag": "<bt>"}]
    second = prepare_shards(config_from_dict(raw), workers=1)
    assert second.folder != first.folder and sum(count_encodes) == 6000
    assert open_shards(first.folder).manifest["pairs"] == 3000  # the old one is untouched


def test_given_tokenizer_re_encodes_when_it_differs(toy_data, tmp_path, count_encodes):
    """A resumed run (or rank 0) brings its own tokenizer: the shards must be in its ids."""
    cfg = shard_config(toy_data, tmp_path)
    shards = prepare_shards(cfg, workers=1)
    raw = cfg.to_dict()
    raw["tokenizer"]["vocab_size"] = 50
    other = prepare_shards(config_from_dict(raw), workers=1).tokenizers()
    assert sum(count_encodes) == 6000
    assert prepare_shards(cfg, tokenizers=shards.tokenizers(), workers=1).folder == shards.folder
    assert sum(count_encodes) == 6000
    again = prepare_shards(cfg, tokenizers=other, workers=1)
    assert sum(count_encodes) == 9000
    assert again.tokenizer_hashes() != shards.tokenizer_hashes()


def test_interrupted_prepare_leaves_nothing_to_trust(toy_data, tmp_path, monkeypatch):
    cfg = shard_config(toy_data, tmp_path)
    monkeypatch.setattr(pool, "CHUNK", 1000)
    encode, seen = shardwriter.encode_chunk, []

    def dies(task):
        seen.append(task)
        if len(seen) == 2:
            raise KeyboardInterrupt
        return encode(task)

    monkeypatch.setattr(shardwriter, "encode_chunk", dies)
    with pytest.raises(KeyboardInterrupt):
        prepare_shards(cfg, workers=1)
    # No folder, no temp folder: only the (empty) lock file that every build of it shares.
    assert [p for p in (tmp_path / "prepared").iterdir() if p.suffix != ".lock"] == []


# ---------------------------------------------------------------------------------------------
# Damaged shards are refused


# Edits of a manifest that keep it valid JSON: each must be found, not trained on.
MANIFEST_EDITS = {
    "dtype": lambda m: m.update(dtype="int32"),  # the files still hold uint16 tokens
    "retype": lambda m: m.update(files=list(m["files"])),
    "drop": lambda m: m.pop("tokens"),
    "string-count": lambda m: m["corpora"][0].update(kept="300"),
}


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how in MANIFEST_EDITS:
        manifest = json.loads(data)
        MANIFEST_EDITS[how](manifest)
        path.write_text(json.dumps(manifest))
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flip":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    else:
        path.unlink()


@pytest.mark.parametrize(
    ("name", "how", "reason"),
    [
        ("src.bin", "truncate", "truncated"),
        ("tgt.bin", "flip", "corrupt"),
        ("index.npy", "flip", "corrupt"),
        ("corpus.npy", "delete", "missing"),
        ("manifest.json", "truncate", "unreadable manifest"),
        ("manifest.json", "dtype", "src.bin does not hold"),
        ("manifest.json", "retype", "unreadable manifest (files: missing or not a dict)"),
        ("manifest.json", "drop", "unreadable manifest (tokens: missing or not a list)"),
        ("manifest.json", "string-count", "unreadable manifest (corpora: an entry without"),
    ],
)
def test_damaged_shard_is_refused_in_one_line(toy_data, tmp_path, name, how, reason):
    cfg = shard_config(toy_data, tmp_path)
    folder = prepare_shards(cfg, workers=1).folder
    damage(folder / name, how)
    with pytest.raises(DataError) as err:
        prepare_shards(cfg, workers=1)
    message = str(err.value)
    assert message.startswith(f"{folder / name}: {reason}")
    assert "attn-mt prepare --config" in message and str(folder) in message
    assert "\n" not in message
    rebuilt = prepare_shards(cfg, workers=1, repair=True)  # what `attn-mt prepare` does
    assert rebuilt.folder == folder and len(rebuilt) == 3000


def test_concurrent_prepares_share_one_build(toy_data, tmp_path, caplog):
    """Two prepares of one corpus at once: one encodes, both get the folder; a temp folder a
    killed prepare left is removed."""
    cfg = shard_config(toy_data, tmp_path)
    folder = prepare_module.plan(cfg).folder
    stale = folder.with_name(f".{folder.name}.99999999.tmp")
    stale.mkdir(parents=True)
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(prepare_shards(cfg, workers=1)))
        for _ in range(2)
    ]
    with caplog.at_level(logging.INFO, logger="attn_mt"):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert [(r.folder, len(r)) for r in results] == [(folder, 3000)] * 2
    assert sum("encoding into" in r.getMessage() for r in caplog.records) == 1
    assert not stale.exists()


def test_a_file_where_the_prepared_folder_belongs(toy_data, tmp_path):
    """Refused in one line by train; replaced by `attn-mt prepare`."""
    cfg = shard_config(toy_data, tmp_path)
    folder = prepare_module.plan(cfg).folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.write_text("not a folder")
    with pytest.raises(DataError, match="a file, not a prepared folder; rebuild it"):
        prepare_shards(cfg, workers=1)
    assert len(prepare_shards(cfg, workers=1, repair=True)) == 3000


def test_corpus_ids_past_32767_survive(toy_data, tmp_path):
    """A list of more than 2**15 corpora widens corpus.npy to int32: the last one keeps its id.
    The corpora before it are one empty file, so only the last is encoded (about a second)."""
    cfg = shard_config(toy_data, tmp_path)
    tokenizers = prepare_shards(cfg, workers=1).tokenizers()
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    last = TrainCorpus(src=str(toy_data["train.src"]), tgt=str(toy_data["train.tgt"]))
    corpora = [TrainCorpus(src=str(empty), tgt=str(empty))] * 2**15 + [last]
    target = shardwriter.Plan(
        corpora, {"corpora": [{}] * len(corpora)}, tmp_path / "many", [[]] * len(corpora)
    )
    shardwriter.write_shards(cfg, target, tokenizers, workers=1)
    shards = open_shards(target.folder)
    assert shards.corpus.dtype == np.int32
    assert len(shards) == 3000 and set(shards.corpus.tolist()) == {2**15}


# ---------------------------------------------------------------------------------------------
# Several corpora


@pytest.fixture
def two_corpora(tmp_path: Path) -> Path:
    """A config file with a main corpus (300 pairs) and a tagged one (100), relative paths."""
    folder = tmp_path / "corpora"
    folder.mkdir()
    for name, count, seed in (("main", 300, 21), ("bt", 100, 22), ("valid", 10, 23)):
        src, tgt = toy_pairs(count, seed)
        write_lines(folder / f"{name}.src", src)
        write_lines(folder / f"{name}.tgt", tgt)
    raw = toy_config_dict({f"{s}.{x}": Path("?") for s in ("train", "valid", "test")
                           for x in ("src", "tgt")}, tmp_path / "run")  # fmt: skip
    raw["data"] = {
        "src_lang": "xx",
        "tgt_lang": "yy",
        "train": [
            {"src": "main.src", "tgt": "main.tgt", "weight": 2},
            {"src": "bt.src", "tgt": "bt.tgt", "weight": 0.5, "tag": "<bt>"},
        ],
        "valid": {"src": "valid.src", "tgt": "valid.tgt"},
        "prepared_dir": "prepared",
    }
    config = folder / "mix.yaml"
    config.write_text(yaml.safe_dump(raw))
    return config


def test_list_of_corpora_loads_with_relative_paths(two_corpora):
    cfg = load_config(two_corpora)
    main, bt = cfg.data.train
    assert main.src == str(two_corpora.parent / "main.src") and main.weight == 2
    assert (bt.weight, bt.tag) == (0.5, "<bt>")
    assert cfg.data.prepared_dir == str(two_corpora.parent / "prepared")
    assert config_from_dict(cfg.to_dict()).data.train == cfg.data.train
    with pytest.raises(ConfigError, match=r"data\.train\[1\]\.tag: 'bt' is invalid"):
        raw = cfg.to_dict()
        raw["data"]["train"][1]["tag"] = "bt"
        config_from_dict(raw)


def test_weights_give_the_expected_shares(two_corpora):
    cfg = load_config(two_corpora)
    shards = prepare_shards(cfg, workers=1)
    assert np.bincount(shards.corpus).tolist() == [300, 100]
    source = ShardBatches(shards, [2, 0.5], batch_tokens=200, seed=1)
    for epoch in range(2):
        rows = Counter(i for batch in source._batches(epoch) for i in batch.tolist())
        main = {i: n for i, n in rows.items() if i < 300}
        extra = {i: n for i, n in rows.items() if i >= 300}
        assert set(main) == set(range(300)) and set(main.values()) == {2}  # twice each
        assert len(extra) == 50 and set(extra.values()) == {1}  # a half, no repeats
        assert sum(rows.values()) == 650  # main 600 (92.3%), tagged 50 (7.7%)
    subsets = [set(source.epoch_rows(e)[600:].tolist()) for e in range(3)]
    assert subsets[0] != subsets[1] and subsets[0] == set(source.epoch_rows(0)[600:].tolist())
    lines = prepare_module.prepared_corpus_lines(cfg)
    assert "weight 2, 92.3% of an epoch" in lines[1]
    assert "weight 0.5, tag <bt>, 7.7% of an epoch" in lines[2]


def test_a_tag_reaches_the_source_side_only(two_corpora):
    shards = prepare_shards(load_config(two_corpora), workers=1)
    src_tok, tgt_tok = shards.tokenizers()
    tag = src_tok.sp.piece_to_id("<bt>")
    assert tag != src_tok.sp.unk_id() and src_tok.pieces([tag]) == ["<bt>"]
    for i in range(len(shards)):
        tagged = shards.corpus[i] == 1
        assert (shards.src[i][0] == tag) == tagged
        assert tag not in shards.src[i][1:] and tag not in shards.tgt[i]
    bt_src, _ = toy_pairs(100, 22)
    assert shards.src[300][1:] == src_tok.encode([bt_src[0]])[0]  # the tag, then the sentence


# ---------------------------------------------------------------------------------------------
# Batches


def list_length_batches(lengths, batch_tokens, order=None):
    """The pure-Python batcher attn-mt had before numpy: the oracle."""
    order = range(len(lengths)) if order is None else order
    ranked = sorted(order, key=lambda i: (max(lengths[i]), lengths[i]))
    batches, current, longest = [], [], 0
    for i in ranked:
        size = max(lengths[i])
        if current and max(longest, size) * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    return batches + [current] if current else batches


@pytest.mark.parametrize("seed", range(8))
def test_numpy_batches_equal_the_list_batches(seed):
    rng = random.Random(seed)
    lengths = [(rng.randint(1, 60), rng.randint(1, 60)) for _ in range(rng.randint(1, 2000))]
    lengths += [(300, 2)] * rng.randint(0, 2)  # longer than some budgets: alone in a batch
    order = list(range(len(lengths)))
    rng.shuffle(order)
    for budget in (1, 64, 250, 4096):
        assert length_batches(lengths, budget, order) == list_length_batches(lengths, budget, order)
        assert length_batches(np.array(lengths), budget) == list_length_batches(lengths, budget)
    one_side = [(s,) for s, _ in lengths]  # what the translator batches: sources of some rows
    subset = order[: len(order) // 2]
    assert length_batches(one_side, 300, subset) == list_length_batches(one_side, 300, subset)
    assert length_batches([], 300) == list_length_batches([], 300) == []


def test_resume_and_ranks(toy_data, tmp_path):
    """A source restored from state_dict goes on exactly; two ranks take disjoint batches."""
    shards = prepare_shards(shard_config(toy_data, tmp_path), workers=1)
    straight = ShardBatches(shards, [1.0], 1024, seed=3)
    taken = [straight.next().ids for _ in range(60)]  # crosses into epoch 1
    first = ShardBatches(shards, [1.0], 1024, seed=3)
    head = [first.next().ids for _ in range(50)]
    resumed = ShardBatches(shards, [1.0], 1024, seed=3)
    resumed.load_state_dict(first.state_dict())
    assert head + [resumed.next().ids for _ in range(10)] == taken
    ranks = [ShardBatches(shards, [1.0], 1024, 3, World(rank, rank, 2)) for rank in range(2)]
    shares = [[rank.next().ids for _ in range(len(rank.batches))] for rank in ranks]
    rows = [i for share in shares for ids in share for i in ids]
    assert len(rows) == len(set(rows)) and len(shares[0]) == len(shares[1])
    assert shares[0] == taken[0 : 2 * len(shares[0]) : 2]
    one = ShardBatches(shards, [1.0], 1024, seed=3)  # a 2-process position in one process
    one.load_state_dict({**ranks[0].state_dict(), "index": 5})
    assert one.index == 10 and one.next().ids == taken[10]


# ---------------------------------------------------------------------------------------------
# Under torchrun


@pytest.mark.slow
@pytest.mark.parametrize("machines", [False, True], ids=["one-machine", "two-machines"])
def test_two_gloo_ranks_read_disjoint_batches_of_one_prepared_copy(toy_data, tmp_path, machines):
    """One machine: rank 0 encodes, rank 1 waits and maps the same folder. Two machines (each
    process its own): each encodes into its own folder with rank 0's tokenizer, and the
    digests agree. Either way the ranks take disjoint halves of one seeded order."""
    from test_distributed import check, torchrun

    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump(shard_config(toy_data, tmp_path).to_dict()))
    worker = REPO / "tests" / "helpers" / "shards_worker.py"
    check(torchrun(str(worker), str(config), str(tmp_path / "out"), *["--machines"] * machines))
    ranks = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(2)]
    assert [rank["encoded"] for rank in ranks] == [3000, 3000 if machines else 0]
    assert (ranks[0]["folder"] == ranks[1]["folder"]) != machines
    assert ranks[0]["digest"] == ranks[1]["digest"]
    cfg = load_config(config)
    everything = epoch_lists(
        open_shards(Path(ranks[0]["folder"])).lengths + 1, cfg.train.batch_tokens, 1, 0
    )
    usable = len(everything) - len(everything) % 2
    for rank in range(2):
        assert ranks[rank]["batches"] == everything[rank:usable:2]
    rows = [i for rank in ranks for batch in rank["batches"] for i in batch]
    assert len(rows) == len(set(rows))


def test_prepare_and_data_info_commands(two_corpora):
    """`prepare` prints each corpus's share; `data info --config` refuses a damaged folder in
    one line; `prepare` rebuilds it."""
    from typer.testing import CliRunner

    from attn_mt.cli import app

    runner = CliRunner()
    before = runner.invoke(app, ["data", "info", "--config", str(two_corpora)])
    assert "not prepared yet" in before.stdout and "92.3% of an epoch" in before.stdout
    assert "multi30k" not in before.stdout  # a named corpus this config does not use
    done = runner.invoke(app, ["prepare", "--config", str(two_corpora), "--workers", "1"])
    assert done.exit_code == 0, done.output
    assert "corpus 2: " in done.stdout and "weight 0.5, tag <bt>, 7.7% of an epoch" in done.stdout
    folder = prepare_module.plan(load_config(two_corpora)).folder
    damage(folder / "src.bin", "truncate")
    refused = runner.invoke(app, ["data", "info", "--config", str(two_corpora)])
    assert isinstance(refused.exception, DataError)
    assert str(refused.exception).startswith(f"{folder / 'src.bin'}: truncated")
    again = runner.invoke(app, ["prepare", "--config", str(two_corpora), "--workers", "1"])
    assert again.exit_code == 0 and open_shards(folder).manifest["pairs"] == 400


def test_prepare_and_data_info_take_set_and_need_no_training_budget(two_corpora, tmp_path):
    """They do not train: a config without a budget is fine, and `--set` changes the data as
    it would for `train` (here data.max_len, which names another prepared folder)."""
    from typer.testing import CliRunner

    from attn_mt.cli import app

    raw = yaml.safe_load(two_corpora.read_text())
    raw["train"].pop("max_steps")  # no max_steps, max_minutes, max_epochs or patience
    no_budget = two_corpora.with_name("no-budget.yaml")
    no_budget.write_text(yaml.safe_dump(raw))
    runner = CliRunner()
    short = ["--config", str(no_budget), "--set", "data.max_len=8"]
    done = runner.invoke(app, ["prepare", *short, "--workers", "1"])
    assert done.exit_code == 0, done.output
    cfg = load_config(no_budget, ["data.max_len=8"], training=False)
    assert open_shards(prepare_module.plan(cfg).folder).manifest["identity"]["max_len"] == 8
    info = runner.invoke(app, ["data", "info", *short])
    assert info.exit_code == 0 and f"prepared in {prepare_module.plan(cfg).folder}" in info.stdout
    with pytest.raises(ConfigError, match="no budget"):
        load_config(no_budget)  # train still asks for one
