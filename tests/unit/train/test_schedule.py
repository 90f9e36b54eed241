"""The learning-rate schedules against their formulas, and the config rule they rest on."""

from __future__ import annotations

import math

import pytest

from attn_mt.config.file import config_from_dict
from attn_mt.config.schema import TrainConfig
from attn_mt.errors import ConfigError
from attn_mt.train.schedule import learning_rate


def schedule(**train) -> TrainConfig:
    return TrainConfig(**train)


def test_inverse_sqrt_peaks_at_warmup_then_decays_as_inverse_sqrt() -> None:
    cfg = schedule(schedule="inverse_sqrt", lr=1e-3, warmup=10)
    rates = {step: learning_rate(step, cfg) for step in range(1, 201)}
    assert max(rates, key=rates.get) == 10
    assert rates[10] == 1e-3
    for step in range(1, 11):
        assert rates[step] == pytest.approx(1e-3 * step / 10)
    for step in range(11, 201):
        assert rates[step] == pytest.approx(1e-3 * math.sqrt(10 / step))


def test_cosine_warms_up_and_reaches_min_lr_at_max_steps() -> None:
    cfg = schedule(schedule="cosine", lr=1e-3, min_lr=1e-5, warmup=10, max_steps=100)
    rates = [learning_rate(step, cfg) for step in range(1, 121)]
    assert rates[9] == pytest.approx(1e-3)
    assert rates[:10] == pytest.approx([1e-3 * s / 10 for s in range(1, 11)])
    assert all(a >= b for a, b in zip(rates[9:], rates[10:], strict=False))
    assert rates[54] == pytest.approx((1e-3 + 1e-5) / 2)  # half-way through the decay
    assert rates[99] == pytest.approx(1e-5)
    assert rates[100:] == pytest.approx([1e-5] * 20)  # stays at the floor after max_steps


def test_constant_schedule_after_warmup() -> None:
    cfg = schedule(schedule="constant", lr=5e-4, warmup=4)
    assert [learning_rate(s, cfg) for s in range(1, 9)] == pytest.approx(
        [1.25e-4, 2.5e-4, 3.75e-4, 5e-4, 5e-4, 5e-4, 5e-4, 5e-4]
    )
    assert learning_rate(1, schedule(schedule="constant", lr=5e-4, warmup=0)) == 5e-4


@pytest.mark.parametrize("name", ["inverse_sqrt", "constant", "linear", "cosine"])
def test_only_the_decaying_schedules_depend_on_max_steps(name: str) -> None:
    short = schedule(schedule=name, lr=1e-3, warmup=5, max_steps=20)
    long = schedule(schedule=name, lr=1e-3, warmup=5, max_steps=40)
    same = all(learning_rate(s, short) == learning_rate(s, long) for s in range(1, 60))
    assert same == (name not in ("linear", "cosine"))


def test_step_schedules_ignore_the_time_spent() -> None:
    for name in ("inverse_sqrt", "constant", "linear", "cosine"):
        cfg = schedule(schedule=name, lr=1e-3, warmup=5, max_steps=20, max_minutes=1)
        assert all(learning_rate(s, cfg) == learning_rate(s, cfg, 1e4) for s in range(1, 30))


def test_linear_over_steps_falls_in_a_straight_line_to_min_lr() -> None:
    cfg = schedule(schedule="linear", lr=1e-3, min_lr=1e-5, warmup=10, max_steps=110)
    rates = [learning_rate(step, cfg) for step in range(1, 131)]
    assert rates[:10] == pytest.approx([1e-3 * s / 10 for s in range(1, 11)])
    steps = [b - a for a, b in zip(rates[9:109], rates[10:110], strict=True)]
    assert steps == pytest.approx([-(1e-3 - 1e-5) / 100] * 100)
    assert rates[109:] == [1e-5] * 21


@pytest.mark.parametrize("name", ["linear", "cosine"])
def test_time_driven_schedule_reaches_its_floor_exactly_at_the_budget(name: str) -> None:
    """With no max_steps the decay follows the share of max_minutes spent, not the step."""
    cfg = schedule(schedule=name, lr=1e-3, min_lr=1e-5, warmup=10, max_minutes=2)
    assert learning_rate(5, cfg, 0.0) == pytest.approx(5e-4)  # the warm-up is in steps
    seconds = [i * 0.5 for i in range(241)]  # 0 .. 120 s
    rates = [learning_rate(400, cfg, t) for t in seconds]
    assert rates[0] == pytest.approx(1e-3) and rates[-1] == 1e-5  # exactly the floor at 120 s
    assert all(a > b for a, b in zip(rates, rates[1:], strict=False))
    middle = (1e-3 + 1e-5) / 2
    assert learning_rate(400, cfg, 60.0) == pytest.approx(middle)  # both are symmetric
    assert learning_rate(400, cfg, 500.0) == 1e-5  # stays at the floor past the budget
    # A slower CPU makes fewer steps in the same time and gets the same lr.
    assert learning_rate(20, cfg, 90.0) == learning_rate(4000, cfg, 90.0)
    # Warm-up and decay meet without a jump: the lr is the lower of the two.
    late = learning_rate(9, cfg, 90.0)
    assert late == learning_rate(400, cfg, 90.0) < 1e-3 * 9 / 10


@pytest.mark.parametrize("name", ["linear", "cosine"])
def test_a_decaying_schedule_without_a_length_is_one_line_from_the_config(name: str) -> None:
    """The schedule needs its length; the config says so before any training starts."""
    with pytest.raises(ConfigError, match="train.schedule.*max_steps or train.max_minutes") as err:
        config_from_dict({"data": {"dataset": "multi30k"}, "train": {"schedule": name}})
    assert "\n" not in str(err.value)
    for length in ({"max_steps": 9}, {"max_minutes": 0.5}):
        config_from_dict({"data": {"dataset": "multi30k"}, "train": {"schedule": name, **length}})
