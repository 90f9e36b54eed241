"""Attention and positional-encoding plots: the pictures hold exactly the model's numbers."""

from __future__ import annotations

import dataclasses
import logging
import random
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
import torch
from torch import nn

import attn_mt
from attn_mt import viz
from attn_mt.errors import UserError
from attn_mt.model.positions import sinusoidal_table
from attn_mt.train import validate
from attn_mt.train.setup import train

SENTENCE = "qb qd qf qg qh"


@pytest.fixture(scope="module")
def translator(trained_run: Path) -> attn_mt.Translator:
    return attn_mt.load(trained_run, device="cpu", prepack=True)  # maps from packed layers too


@pytest.fixture(scope="module")
def weights(trained_run: Path) -> nn.Module:
    """The same model with plain nn.Linear layers, whose projection weights can be read."""
    return attn_mt.load(trained_run, device="cpu", prepack=False).model


def attention_modules(model: nn.Module, kind: str) -> list[nn.Module]:
    stack = model.encoder if kind == "encoder" else model.decoder
    return [layer.cross_attn if kind == "cross" else layer.self_attn for layer in stack]


def reference_weights(translator: attn_mt.Translator, plain: nn.Module, kind: str) -> torch.Tensor:
    """(L, H, R, C) weights recomputed by torch.nn.MultiheadAttention from each attention
    module's own inputs (captured by hooks) and the projection weights of the `plain` model."""
    modules = attention_modules(translator.model, kind)
    inputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [
        m.register_forward_pre_hook(lambda _, args, i=i: inputs.__setitem__(i, args[:2]))
        for i, m in enumerate(modules)
    ]
    try:
        viz.attention_maps(translator, SENTENCE, kind)  # the last call of each is the full pass
    finally:
        for hook in hooks:
            hook.remove()
    weights = []
    for i, module in enumerate(attention_modules(plain, kind)):
        query, key_value = inputs[i]
        d_model = query.size(-1)
        reference = nn.MultiheadAttention(d_model, module.heads, batch_first=True)
        reference.in_proj_weight.data.copy_(module.in_proj.weight)
        reference.in_proj_bias.data.copy_(module.in_proj.bias)
        length = query.size(1)
        future = torch.ones(length, length, dtype=torch.bool).triu(1)  # True = may not attend
        _, w = reference(
            query,
            key_value,
            key_value,
            attn_mask=future if kind == "decoder" else None,
            need_weights=True,
            average_attn_weights=False,
        )
        weights.append(w[0])  # (H, R, C)
    return torch.stack(weights)


@pytest.mark.parametrize("kind", viz.KINDS)
def test_maps_are_the_model_attention(translator: attn_mt.Translator, weights, kind: str) -> None:
    maps = viz.attention_maps(translator, SENTENCE, kind)
    torch.testing.assert_close(maps.weights, reference_weights(translator, weights, kind))
    layers = len(translator.model.encoder if kind == "encoder" else translator.model.decoder)
    assert maps.weights.shape[:2] == (layers, translator.model.encoder[0].self_attn.heads)
    assert maps.weights.shape[2:] == (len(maps.rows), len(maps.columns))
    torch.testing.assert_close(maps.weights.sum(-1), torch.ones(maps.weights.shape[:3]))
    source = translator.src_tokenizer.pieces(translator.src_tokenizer.encode([SENTENCE])[0])
    output = translator.tgt_tokenizer.pieces(translator.tgt_tokenizer.encode([maps.translation])[0])
    # A decoder row is labelled by what it outputs: one place on from its input
    expected = {
        "cross": (output + ["</s>"], source + ["</s>"]),
        "encoder": (source + ["</s>"],) * 2,
        "decoder": (output + ["</s>"], ["<s>"] + output),
    }
    assert (maps.rows, maps.columns) == expected[kind]
    assert maps.translation == translator.translate([SENTENCE], beam=1)[0]
    if kind == "decoder":  # the future is masked out: exactly zero weight
        assert torch.equal(maps.weights.triu(1), torch.zeros_like(maps.weights))


def test_figure_shows_the_weights(translator: attn_mt.Translator) -> None:
    maps = viz.attention_maps(translator, SENTENCE, "cross")
    figure = viz.plot_attention(maps)
    panels = [ax for ax in figure.axes if ax.get_title().startswith("layer")]
    layers, heads = maps.weights.shape[:2]
    assert len(panels) == layers * heads
    for ax in panels:
        _, layer, _, head = ax.get_title().split()
        shown = torch.as_tensor(ax.images[0].get_array())
        torch.testing.assert_close(shown, maps.weights[int(layer), int(head)])
        assert [t.get_text() for t in ax.get_xticklabels()] == maps.columns
        assert [t.get_text() for t in ax.get_yticklabels()] == maps.rows
    assert len(figure.axes) == len(panels) + 1  # and one colour bar
    single = viz.plot_attention(maps, layer=0, head=heads - 1)
    assert [ax.get_title() for ax in single.axes[:-1]] == [f"layer 0 head {heads - 1}"]
    long = dataclasses.replace(maps, source=" ".join(["a long source sentence"] * 8))
    single = viz.plot_attention(long, layer=0, head=0)
    single.canvas.draw()  # the one-panel title is drawn whole, inside the figure
    shown = single._suptitle.get_window_extent()
    assert shown.x0 >= 0 and shown.x1 <= single.bbox.width and shown.y1 <= single.bbox.height


def test_png_has_the_figure_size(trained_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "deep" / "cross.png"
    figure = viz.plot_attention_file(trained_run, SENTENCE, out, head=1, device="cpu")
    image = matplotlib.image.imread(out)
    width, height = figure.get_size_inches() * figure.dpi
    assert image.shape == (round(height), round(width), 4)
    assert image[..., :3].std() > 0.05  # not a blank canvas


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kind": "diagonal"}, "--kind diagonal"),
        ({"layer": 1}, "--layer 1"),
        ({"head": -1}, "--head -1"),
        ({"text": "  "}, "--text is empty"),
    ],
)
def test_bad_options_are_user_errors(
    trained_run: Path, tmp_path: Path, options: dict, message: str
) -> None:
    args = {"text": SENTENCE, "device": "cpu", **options}
    with pytest.raises(UserError, match=message):
        viz.plot_attention_file(trained_run, out=tmp_path / "x.png", **args)
    assert not (tmp_path / "x.png").exists()


def test_positional_encoding_figure_is_the_table(tmp_path: Path, trained_run: Path) -> None:
    figure = viz.positional_encoding_figure(positions=50, d_model=32)
    [image] = figure.axes[0].images
    torch.testing.assert_close(torch.as_tensor(image.get_array()), sinusoidal_table(50, 32))
    assert figure.axes[0].get_xlabel().startswith("encoding dimension")
    assert figure.axes[0].get_ylabel() == "position"
    assert len(figure.axes) == 2  # the heatmap and its colour bar
    from_model = viz.plot_positional_encoding_file(tmp_path / "pe.png", model=trained_run)
    assert from_model.axes[0].images[0].get_array().shape == (100, 64)  # the toy d_model
    with pytest.raises(UserError, match="--d-model 7"):
        viz.positional_encoding_figure(10, 7)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "attn_mt", "attention", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_cli(trained_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.png"
    done = run_cli("--model", str(trained_run), "--text", SENTENCE, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert matplotlib.image.imread(out).ndim == 3
    done = run_cli("--pe", "--d-model", "64", "--out", str(tmp_path / "pe.png"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pe.png").is_file()
    done = run_cli(
        "--model", str(trained_run), "--text", SENTENCE, "--layer", "3", "--out", "y.png"
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "attn-mt: error: --layer 3: out of range; this model's decoder layers are numbered 0 to 0"
    ]


def test_validation_plots_the_last_layers_heads(translator, monkeypatch) -> None:
    """One row at every validation (a grid of every head is slow at base size: docs/history.md)."""
    maps = viz.attention_maps(translator, SENTENCE, "cross")
    deeper = dataclasses.replace(maps, weights=torch.cat([maps.weights * 0.5, maps.weights]))
    monkeypatch.setattr(viz, "attention_maps", lambda *args, **kwargs: deeper)
    figure = viz.validation_attention_figure(translator, SENTENCE)
    last = deeper.weights.size(0) - 1
    heads = deeper.weights.size(1)
    assert [ax.get_title() for ax in figure.axes[:-1]] == [
        f"layer {last} head {head}" for head in range(heads)
    ]
    shown = torch.as_tensor(figure.axes[0].images[0].get_array())
    torch.testing.assert_close(shown, deeper.weights[last, 0])


def attention_images(out_dir: Path) -> list:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out_dir / "tb"), size_guidance={"images": 0})
    events.Reload()
    tags = events.Tags()["images"]
    return events.Images("valid/attention") if "valid/attention" in tags else []


def test_validation_writes_attention_image(toy_config, monkeypatch) -> None:
    monkeypatch.setattr(validate, "PLOT_SHARE", 1e9)  # a plot at every validation
    result = train(toy_config(max_steps=4, eval_every=2))
    images = attention_images(result.out_dir)
    assert [image.step for image in images] == [2, 4]
    assert all(image.width > 100 and image.height > 100 for image in images)
    lines = (result.out_dir / "train.log").read_text().splitlines()
    assert sum("valid step" in line and ", plot " in line for line in lines) == 2


def test_a_run_of_seconds_draws_no_plot(toy_config) -> None:
    """The plot's first drawing (~1 s) would be a good share of such a run: none is drawn."""
    result = train(toy_config(max_steps=4, eval_every=2))
    assert attention_images(result.out_dir) == []
    log = (result.out_dir / "train.log").read_text()
    assert log.count("valid step") == 2 and ", plot " not in log


def simulated_run(share: float, cost: float, intervals: list[float]) -> tuple[int, float, float]:
    """Validations after `intervals` seconds of training each, on a clock; a plot, when the
    budget allows it, takes `cost` seconds. Returns (plots drawn, their seconds, the run's)."""
    now = [0.0]
    budget = validate.PlotBudget(share, clock=lambda: now[0])
    drawn, plotted = 0, 0.0
    for interval in intervals:
        now[0] += interval
        if budget.due():
            now[0] += cost
            budget.spent(cost)
            drawn, plotted = drawn + 1, plotted + cost
    return drawn, plotted, now[0]


@pytest.mark.parametrize("seed", range(20))
def test_plots_take_their_share_of_the_time_and_no_more(seed: int) -> None:
    """Validations at random intervals, plots of a random steady cost: the plots take at most
    `share` of the run's time (plus what the first one cost beyond its guess)."""
    rng = random.Random(seed)
    share, cost = rng.choice([0.01, 0.02, 0.1]), rng.uniform(0.05, 3.0)
    scale = rng.choice([0.5, 5.0, 60.0])
    intervals = [rng.expovariate(1 / scale) for _ in range(200)]
    _, plotted, seconds = simulated_run(share, cost, intervals)
    assert plotted <= share * seconds + max(0.0, cost - validate.PLOT_GUESS)


@pytest.mark.parametrize("cost", [0.2, 1.0, 3.0])
def test_validations_far_enough_apart_each_draw_a_plot(cost: float) -> None:
    """A default run validates every few minutes: each of its validations has its plot."""
    share = validate.PLOT_SHARE
    gap = max(cost, validate.PLOT_GUESS) / share
    drawn, _, _ = simulated_run(share, cost, [gap * 1.01] * 30)
    assert drawn == 30


def test_plot_failure_does_not_stop_training(toy_config, monkeypatch, caplog) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("no fonts today")

    monkeypatch.setattr(validate, "PLOT_SHARE", 1e9)
    monkeypatch.setattr(viz, "validation_attention_figure", broken)
    with caplog.at_level(logging.WARNING, logger="attn_mt"):
        result = train(toy_config(max_steps=2, eval_every=2))
    assert result.step == 2 and (result.out_dir / "checkpoints" / "best.pt").is_file()
    assert "attention plot skipped (RuntimeError: no fonts today)" in caplog.text
