"""What a validation measures, under a time allowance: the sentences go in chunks in file
order, growing while the time holds them and stopping when it is spent; a multilingual run's
directions share what is left and each says its name to the progress display."""

from __future__ import annotations

from pathlib import Path

from helpers.multilingual import multilingual_files, multilingual_raw

from attn_mt.config.file import config_from_dict
from attn_mt.train.clock import Allowance
from attn_mt.train.measure import chunks, validate_directions
from attn_mt.train.setup import setup
from attn_mt.train.validate import translator_of
from attn_mt.world import World


def test_without_an_allowance_every_sentence_goes_at_once() -> None:
    assert list(chunks(1000, None, World())) == [range(1000)]


def test_chunks_grow_while_the_time_holds_them_and_stop_when_it_is_spent() -> None:
    """An eighth of a second a sentence and 10 s allowed, a tenth kept for scoring: 8, 16, 32,
    then the 16 that the 2 s left hold at that pace, and no more; 72 of 1000 in 9 s."""
    now = [0.0]
    allowance = Allowance(10.0, lambda: now[0])
    validated = []
    for rows in chunks(1000, allowance, World()):
        validated.append((rows.start, rows.stop))
        now[0] += 0.125 * len(rows)
    assert validated == [(0, 8), (8, 24), (24, 56), (56, 72)]
    assert now[0] == 9.0


def test_the_first_chunk_always_runs_and_a_spent_allowance_takes_no_more() -> None:
    now = [0.0]
    late = Allowance(-5.0, lambda: now[0])  # a validation that starts past the budget's end
    assert [len(rows) for rows in chunks(1000, late, World())] == [8]
    assert [len(rows) for rows in chunks(3, late, World())] == [3]


def test_directions_share_the_time_left_equally() -> None:
    now = [0.0]
    allowance = Allowance(10.0, lambda: now[0])
    assert allowance.part(2).seconds == 5.0
    now[0] += 4.0  # the first direction took 4 s: the second gets all that is left
    assert allowance.part(1).seconds == 6.0


def test_each_direction_says_its_name_while_it_validates(tmp_path: Path) -> None:
    files = multilingual_files(tmp_path)
    raw = multilingual_raw(files, tmp_path / "run", ("de-en", "de-fr"))
    raw["train"].update(max_steps=1, valid_max_sentences=3)
    trainer = setup(config_from_dict(raw))
    seen: list[tuple[str, int, int]] = []
    cfg, world = trainer.cfg, World()
    translator = translator_of(trainer.state)
    result = validate_directions(translator, trainer.corpus, cfg.train, _note(seen), world)
    assert result is not None and sorted(result.pairs) == ["de-en", "de-fr"]
    phases = [phase for phase, _, _ in seen]
    assert phases == sorted(phases, key=["loss de-en", "search de-en", "loss de-fr",
                                         "search de-fr"].index)  # fmt: skip
    assert ("search de-en", 3, 3) in seen and seen[-1] == ("search de-fr", 3, 3)


def _note(seen: list[tuple[str, int, int]]):
    def follow(phase: str, done: int, total: int) -> None:
        seen.append((phase, done, total))

    return follow
