"""The learning-rate schedules against their formulas, and the config rule they rest on."""

from __future__ import annotations

import math

import pytest

from attn_mt.config import TrainConfig
from attn_mt.configfile import config_from_dict
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


@pytest.mark.parametrize("name", ["inverse_sqrt", "constant", "cosine"])
def test_only_cosine_depends_on_max_steps(name: str) -> None:
    short = schedule(schedule=name, lr=1e-3, warmup=5, max_steps=20)
    long = schedule(schedule=name, lr=1e-3, warmup=5, max_steps=40)
    same = all(learning_rate(s, short) == learning_rate(s, long) for s in range(1, 60))
    assert same == (name != "cosine")


def test_cosine_without_max_steps_is_refused_by_the_config() -> None:
    """The schedule needs its length; the config says so before any training starts."""
    with pytest.raises(ConfigError, match="train.schedule.*max_steps"):
        config_from_dict({"data": {"dataset": "multi30k"}, "train": {"schedule": "cosine"}})
    config_from_dict(
        {"data": {"dataset": "multi30k"}, "train": {"schedule": "cosine", "max_steps": 9}}
    )
