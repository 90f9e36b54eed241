"""The time budget: max_minutes counts the whole run (validations too) and keeps back the
final validation's time (before the first validation, an estimate: a share of the budget), a
time-driven schedule reaches its floor at the last update even when the updates slow down, a
validation takes no more than the budget leaves it, and a resumed run continues the same
schedule.

The clock is fake (each update takes one second of it unless a test slows it, each validation
one and a half), so the tests are exact and fast: no sleeping, no dependence on the machine's
speed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from unittest import mock

import pytest
from helpers.toy import make_config

from attn_mt.config.schema import Config, TrainConfig
from attn_mt.decode.translator import Translator
from attn_mt.train.clock import RunClock
from attn_mt.train.schedule import learning_rate
from attn_mt.train.setup import setup
from attn_mt.train.state import TrainProgress
from attn_mt.train.validate import Validator

UPDATE_SECONDS, VALIDATION_SECONDS = 1.0, 1.5
BUDGET = {"max_steps": 0, "max_minutes": 10 / 60, "schedule": "linear", "warmup": 2}
BUDGET.update(min_lr=1e-4, lr=3e-3, eval_every=4, batch_tokens=256)  # 10 s


class FakeTime:
    """A clock the patched update and validation move on; `lrs` records each update's lr."""

    def __init__(self, now: float, update_seconds: list[float] | None = None) -> None:
        self.now, self.lrs = now, []
        self.update_seconds = update_seconds or []  # of the updates in turn; then UPDATE_SECONDS

    def __call__(self) -> float:
        return self.now

    def update_took(self) -> float:
        """The seconds of the next update."""
        return self.update_seconds.pop(0) if self.update_seconds else UPDATE_SECONDS


def timed_run(
    cfg: Config, clock: FakeTime, resume: bool = False, stop_after: int = 0, search: float = 0.0
):
    """Run `cfg` on `clock`; with `stop_after`, a signal stops it after that many updates.
    Only updates and validations take time here: VALIDATION_SECONDS each, or with `search`,
    the real validation, its search taking that many seconds a sentence."""
    trainer = setup(cfg, resume=resume, clock=clock)
    update = trainer.update

    def timed_update():
        clock.lrs.append(float(trainer.optimizer.param_groups[0]["lr"]))
        result = update()
        clock.now += clock.update_took()
        if len(clock.lrs) == stop_after:
            trainer.signals.name = "SIGTERM"
        return result

    def slow_validation(validator: Validator) -> None:
        trainer.progress.last_valid_step = trainer.progress.step
        with validator.clock.phase("validation"):  # as the validation's own phases count it
            clock.now += VALIDATION_SECONDS

    def slow_search(translator: Translator, sentences: list[str], *args, **kwargs) -> list[str]:
        clock.now += search * len(sentences)
        return translate(translator, sentences, *args, **kwargs)

    trainer.update, translate = timed_update, Translator.translate
    if search:
        with mock.patch.object(Translator, "translate", slow_search):
            return trainer, trainer.run()
    with mock.patch.object(Validator, "validate_and_save", slow_validation):
        return trainer, trainer.run()


@pytest.fixture(scope="module")
def straight(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """The budgeted run straight through: (its config, trainer, result, clock)."""
    cfg = make_config(toy_data, tmp_path_factory.mktemp("budget") / "run", **BUDGET)
    clock = FakeTime(now=5000.0)
    return (cfg, *timed_run(cfg, clock), clock)


def test_the_run_stops_at_the_budget_with_the_lr_at_its_floor(straight) -> None:
    cfg, trainer, result, clock = straight
    # Updates 1-4 (4 s), a validation (5.5 s); the budget of 10 s less the final validation's
    # 1.5 s puts the deadline at 8.5 s. Update 6, launched at 6.5 s, is the last: the one after
    # it would end at the deadline. The final validation ends the run at 9 s, within budget.
    assert (result.stopped_by, result.step) == ("max_minutes", 6)
    assert trainer.progress.elapsed == 7.5  # the validation counts
    assert clock.now - 5000.0 == 9.0
    assert clock.lrs[0] == pytest.approx(1.5e-3)  # warm-up: step 1 of 2
    assert all(a > b for a, b in zip(clock.lrs[1:], clock.lrs[2:], strict=False))
    # The last update trains at the schedule's floor, the one before it above.
    assert clock.lrs[-1] == pytest.approx(1e-4) and clock.lrs[-2] > 2e-4


def test_resume_continues_the_same_time_driven_schedule(straight, tmp_path: Path) -> None:
    cfg = straight[0]
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, out_dir=str(tmp_path)))
    first = FakeTime(now=0.0)
    stopped, result = timed_run(cfg, first, stop_after=3)
    assert (result.stopped_by, stopped.progress.elapsed) == ("signal", 3.0)
    later = FakeTime(now=123456.0)  # another process: its clock starts anywhere
    resumed, result = timed_run(cfg, later, resume=True)
    assert (result.stopped_by, result.step, resumed.progress.elapsed) == ("max_minutes", 6, 7.5)
    assert first.lrs + later.lrs == straight[3].lrs  # the pace, too, comes back from last.pt


TWO_MINUTES = TrainConfig(max_minutes=2, max_steps=0, schedule="linear", lr=1e-3, min_lr=1e-5)


def test_before_any_validation_the_deadline_keeps_back_a_share_of_the_budget() -> None:
    now = [0.0]
    clock = RunClock(start=0.0, first_step=0, now=lambda: now[0])
    # No validation yet: 15% of the 120 s budget is kept back for the final one.
    assert clock.deadline(TWO_MINUTES) == 102.0
    now[0] = 101.9
    assert not clock.out_of_time(TWO_MINUTES)
    now[0] = 102.0
    assert clock.out_of_time(TWO_MINUTES)
    # A long budget keeps back at most two minutes.
    assert clock.deadline(dataclasses.replace(TWO_MINUTES, max_minutes=600)) == 36000 - 120


def test_after_a_validation_the_deadline_keeps_back_its_time() -> None:
    clock = RunClock(start=0.0, first_step=0, now=lambda: 0.0)
    assert clock.deadline(TWO_MINUTES) == 102.0
    clock.validated(7.5)  # shorter than the estimate: the deadline moves later
    assert clock.deadline(TWO_MINUTES) == 112.5
    clock.validated(30.0)
    assert clock.deadline(TWO_MINUTES) == 90.0
    # A resumed run reads the latest validation's time back from last.pt.
    resumed = RunClock(start=-50.0, first_step=40, last_validation=30.0, now=lambda: 0.0)
    assert resumed.deadline(TWO_MINUTES) == 90.0


def test_the_timesheet_splits_this_process_time_into_disjoint_parts() -> None:
    """Start-up until training began, each phase's time, and the updates as the rest; a
    resumed process counts its own time only, not the earlier processes' (`earlier`)."""
    now = [100.0]
    resumed = TrainProgress(step=40, elapsed=1000.0, validation_seconds=3.0)
    clock = RunClock.of(began=40.0, progress=resumed, now=lambda: now[0])  # 60 s of start-up
    assert clock.elapsed() == 1060.0  # the run's clock still counts the earlier processes
    for phase, seconds in [("validation", 7.0), ("checkpoints", 0.5), ("validation", 3.0)]:
        now[0] += 10.0  # updates between the phases
        with clock.phase(phase):
            now[0] += seconds
    with pytest.raises(RuntimeError), clock.phase("loss only"):  # timed however it ends
        now[0] += 2.0
        raise RuntimeError
    sheet = clock.timesheet()
    assert list(sheet.items()) == [
        ("start-up", 60.0), ("updates", 30.0), ("checkpoints", 0.5), ("loss only", 2.0),
        ("validation", 10.0),
    ]  # fmt: skip
    assert sum(sheet.values()) == now[0] - 40.0


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_the_schedule_reaches_its_floor_at_the_deadline_before_any_validation(schedule) -> None:
    t = dataclasses.replace(TWO_MINUTES, schedule=schedule)
    now = [0.0]
    clock = RunClock(start=0.0, first_step=0, now=lambda: now[0])
    now[0] = 101.0  # just before the deadline (102 s): above the floor
    assert learning_rate(500, t, clock.schedule_seconds(t)) > t.min_lr
    now[0] = 102.0  # the deadline: training stops here, at the floor
    assert clock.out_of_time(t)
    assert learning_rate(500, t, clock.schedule_seconds(t)) == pytest.approx(t.min_lr)


def test_a_run_ending_before_its_first_validation_ends_within_its_budget(
    toy_data: dict[str, Path], tmp_path: Path
) -> None:
    cfg = make_config(toy_data, tmp_path / "run", **{**BUDGET, "eval_every": 100})
    clock = FakeTime(now=0.0)
    trainer, result = timed_run(cfg, clock)
    # No validation by the deadline: 15% of the 10 s budget (1.5 s) is kept back, so the last
    # update is the one launched at 7 s (the next would end at 9 s, past the 8.5 s deadline),
    # at the floor, and the final validation ends the run at 9.5 s.
    assert (result.stopped_by, result.step) == ("max_minutes", 8)
    assert clock.now == 9.5
    assert clock.lrs[-1] == pytest.approx(1e-4) and clock.lrs[-2] > 1e-4


def test_the_lr_reaches_its_floor_at_the_last_update_when_the_updates_slow_down(
    toy_data: dict[str, Path], tmp_path: Path
) -> None:
    """Updates of 1 s, then of 2 s (a machine loaded after the start): the clock follows the
    pace, so the last update still trains at the floor and the run ends within its budget. At
    the pace of the start the run would have launched an update at 7 s, above the floor, and
    ended at 10.5 s."""
    cfg = make_config(toy_data, tmp_path / "run", **{**BUDGET, "eval_every": 100})
    clock = FakeTime(now=0.0, update_seconds=[1.0] * 3 + [2.0] * 20)
    trainer, result = timed_run(cfg, clock)
    # Launched at 0, 1, 2, 3 and 5 s; at 5 s the pace is 2 s, so the update after it would
    # end past the 8.5 s deadline: the one launched at 5 s is the last.
    assert (result.stopped_by, result.step) == ("max_minutes", 5)
    assert clock.now == 8.5 <= 10.0
    assert clock.lrs[-1] == pytest.approx(1e-4) and clock.lrs[-2] > 1e-4
    assert trainer.progress.pace == 2.0  # kept in last.pt for a resume


def test_a_validation_takes_no_more_than_the_budget_leaves_it(
    toy_data: dict[str, Path], tmp_path: Path
) -> None:
    """The final validation of a run whose search would take 50 s (100 sentences of 0.5 s)
    gets what is left of the budget: it validates the first sentences in file order, as many
    as fit, the log says so, and the run ends within max_minutes."""
    budget = {**BUDGET, "max_minutes": 1.0, "eval_every": 100}
    cfg = make_config(toy_data, tmp_path / "run", **budget)
    clock = FakeTime(now=0.0, update_seconds=[5.0] * 20)
    trainer, result = timed_run(cfg, clock, search=0.5)
    # The deadline is at 51 s (9 s kept back): the update launched at 45 s is the last. The
    # final validation may take 9 s (15% of the budget), a tenth of it kept for scoring: its
    # first chunk of 8 sentences (4 s), then as many again as the time left holds, no more.
    assert (result.stopped_by, result.step) == ("max_minutes", 10)
    assert clock.now == 58.0 <= 60.0
    rows = (Path(cfg.train.out_dir) / "metrics.jsonl").read_text().splitlines()
    [valid] = [row for row in map(json.loads, rows) if row["split"] == "valid"]
    assert valid["sentences"] == 16 and valid["step"] == 10
    log_text = (Path(cfg.train.out_dir) / "train.log").read_text()
    assert "valid step 10 (on 16 of 100 validation sentences, all the time budget held)" in log_text
