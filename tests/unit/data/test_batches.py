"""The batch source: the loop's only view of the data, and the only holder of its position."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from attn_mt.data.epochs import MAX_EPOCH_PAIRS, ShardBatches, check_epoch
from attn_mt.data.shards import Shards, TokenView
from attn_mt.distributed import World
from attn_mt.errors import DataError


def corpus(pairs: int = 300, seed: int = 0) -> Shards:
    """Shards held in memory (no folder): random lengths of 1-20 tokens a side."""
    rng = random.Random(seed)
    lengths = np.array([(rng.randint(1, 20), rng.randint(1, 20)) for _ in range(pairs)])
    offsets = np.zeros((pairs + 1, 2), dtype=np.int64)
    offsets[1:] = np.cumsum(lengths, axis=0)
    src = np.full(int(offsets[-1, 0]), 5, dtype=np.uint16)
    tgt = np.full(int(offsets[-1, 1]), 6, dtype=np.uint16)
    return Shards(
        Path("."), {}, TokenView(src, offsets[:, 0]), TokenView(tgt, offsets[:, 1]), lengths,
        np.zeros(pairs, dtype=np.int16),
    )  # fmt: skip


def take(source: ShardBatches, count: int) -> list[tuple[int, list[int]]]:
    return [(source.epoch, source.next().ids) for _ in range(count)]


def test_a_restored_position_continues_exactly() -> None:
    """Saved mid-epoch 1 and loaded into a new source: the same batches follow."""
    data = corpus()
    straight = ShardBatches(data, [1.0], 200, seed=3)
    per_epoch = len(straight.batches)
    first = take(straight, per_epoch + 5)
    state = straight.state_dict()
    assert state == {"epoch": 1, "index": 5, "world_size": 1}
    resumed = ShardBatches(data, [1.0], 200, seed=3)
    resumed.load_state_dict(state)
    assert take(resumed, 2 * per_epoch) == take(straight, 2 * per_epoch)
    assert first[0][0] == 0 and first[-1][0] == 1
    assert straight.epochs_done == resumed.epochs_done == 3


def test_first_batches_are_the_epochs_first_and_leave_the_position() -> None:
    source = ShardBatches(corpus(), [1.0], 200, seed=3)
    take(source, 2)
    sample = source.first_batches(2)
    fresh = ShardBatches(corpus(), [1.0], 200, seed=3)
    assert [b.src.tolist() for b in sample] == [fresh.next().src.tolist() for _ in range(2)]
    assert (source.epoch, source.index) == (0, 2)


def test_epochs_done_counts_a_finished_epoch_before_the_next_batch() -> None:
    source = ShardBatches(corpus(), [1.0], 400, seed=1)
    take(source, len(source.batches) - 1)
    assert source.epochs_done == 0
    take(source, 1)
    assert (source.epoch, source.epochs_done) == (0, 1)  # no batch of epoch 1 taken yet


def test_another_process_count_keeps_the_share_of_the_epoch_seen() -> None:
    """Two processes that each took 3 batches saw 6 of the epoch's global order; one process
    resumes at global batch 6 (rounded up: a batch may be skipped, none is repeated)."""
    data = corpus()
    ranks = [ShardBatches(data, [1.0], 200, 7, World(rank, rank, 2)) for rank in (0, 1)]
    seen = [ids for rank in ranks for _, ids in take(rank, 3)]
    single = ShardBatches(data, [1.0], 200, 7)
    single.load_state_dict(ranks[0].state_dict())
    assert single.state_dict() == {"epoch": 0, "index": 6, "world_size": 1}
    rest = [ids for _, ids in take(single, len(single.batches) - 6)]
    assert not {tuple(b) for b in rest} & {tuple(b) for b in seen}
    three = ShardBatches(data, [1.0], 200, 7, World(0, 0, 3))
    three.load_state_dict(ranks[0].state_dict())
    assert three.state_dict()["index"] == 2  # ceil(3 * 2 / 3)


def test_describe_is_one_line_with_batches_and_padding() -> None:
    line = ShardBatches(corpus(), [1.0], 200, seed=1).describe()
    assert "\n" not in line and "batches per epoch" in line and "padding" in line


def test_describe_says_how_another_process_count_was_mapped() -> None:
    data = corpus()
    two = ShardBatches(data, [1.0], 200, 7, World(0, 0, 2))
    take(two, 3)
    single = ShardBatches(data, [1.0], 200, 7)
    assert "resuming" not in single.describe()
    single.load_state_dict(two.state_dict())
    line = single.describe()
    assert "\n" not in line
    assert "resuming a 2-process run with 1 processes: epoch 0 continues at batch 6" in line


def test_weights_at_the_edges_are_one_line() -> None:
    """An epoch too large to hold, or a corpus that gives no pair, is refused before training."""
    counts = np.array([300, 100])
    check_epoch([1e6, 0.01], counts)  # 300 million pairs and 1 pair: fine
    with pytest.raises(DataError, match=r"an epoch of 30,000,000,000,000,000,000 pairs"):
        check_epoch([1e17, 1.0], counts)
    assert MAX_EPOCH_PAIRS < 1e17 * 300
    with pytest.raises(DataError, match=r"data.train\[1\].weight: 0.001 of 100 pairs is no pair"):
        check_epoch([1.0, 0.001], counts)
    check_epoch([1.0, 0.001], np.array([300, 0]))  # a corpus left empty by cleaning is no error
