"""Float32 training products through oneDNN (`attn_mt.kernels.OneDnnLinear`): the same values
and gradients as `nn.Linear` to rounding, every product of a routed model through it, the choice
made once per run and kept on resume (exact resume), a clear error for a bad setting."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers.models import random_model
from helpers.toy import assert_identical, load_raw, make_config, resumable_state, run
from torch import nn

from attn_mt import kernels
from attn_mt.errors import UserError
from attn_mt.kernels import packing_available
from attn_mt.model.transformer import Transformer

pytestmark = pytest.mark.skipif(
    not packing_available(), reason="this torch build has no oneDNN linear product"
)

# Dropout on, so the RNG matters; validation in between, as test_train's resume runs.
RESUME_MODEL = {"dropout": 0.1, "attention_dropout": 0.1, "d_model": 128, "d_ff": 1024}
SHAPES = ((64, 128), (128, 64), (64, 60))  # the layer shapes a choice is timed on
RESUME_TRAIN = {"max_steps": 6, "batch_tokens": 1500, "eval_every": 3, "log_every": 2}


def products_of(x: torch.Tensor, linear, weight: torch.Tensor, bias: torch.Tensor | None):
    """y and the gradients of x, W and b under a fixed random dL/dy."""
    y = linear(x, weight, bias)
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return (y, *torch.autograd.grad(y, inputs, grad))


@pytest.mark.parametrize("shape", [(1, 24), (37, 24), (3, 11, 24), (300, 24)])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_forward_and_gradients_equal_nn_linear(shape: tuple[int, ...], with_bias: bool) -> None:
    """One row to many, 2-D and 3-D inputs: y, dL/dx, dL/dW and dL/db agree with F.linear to
    float32 rounding."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator, requires_grad=True)
    weight = torch.randn(40, 24, generator=generator, requires_grad=True)
    bias = torch.randn(40, generator=generator, requires_grad=True) if with_bias else None
    ours = products_of(x, kernels.onednn_linear, weight, bias)
    reference = products_of(x, F.linear, weight, bias)
    assert len(ours) == len(reference) == (4 if with_bias else 3)
    for got, want in zip(ours, reference, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_routed_model_keeps_its_parameters_and_multiplies_only_through_onednn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Same parameter objects (the tied output weight stays the embedding's), same state dict;
    no product of the training step (cross-attention's sliced in_proj included) reaches
    F.linear; the loss and every gradient equal the nn.Linear model's to rounding."""
    reference, routed = random_model(0).train(), random_model(0).train()
    params = [id(p) for p in routed.parameters()]
    keys = list(routed.state_dict())
    kernels.route_through_onednn(routed)
    assert not [m for m in routed.modules() if type(m) is nn.Linear]
    assert sum(isinstance(m, kernels.OneDnnLinear) for m in routed.modules()) == sum(
        type(m) is nn.Linear for m in reference.modules()
    )
    assert [id(p) for p in routed.parameters()] == params
    assert list(routed.state_dict()) == keys
    assert routed.output.weight is routed.tgt_embed.embedding.weight

    def losses_and_gradients(model: Transformer) -> list[torch.Tensor]:
        torch.manual_seed(3)  # the same dropout draws for both models
        src, tgt = torch.randint(4, 24, (5, 9)), torch.randint(4, 24, (5, 7))
        loss = model(src, tgt).log_softmax(-1).mean()
        loss.backward()
        return [loss.detach(), *(p.grad for p in model.parameters())]

    expected = losses_and_gradients(reference)

    def no_linear(*args, **kwargs):
        raise AssertionError("a product went through F.linear")

    monkeypatch.setattr(F, "linear", no_linear)
    got = losses_and_gradients(routed)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_choice_keeps_a_recorded_one_and_otherwise_follows_the_setting_or_the_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timed = []

    def pays(*size) -> bool:
        timed.append(size)
        return True

    monkeypatch.setattr(kernels, "onednn_pays", pays)
    choose = kernels.choose_products
    monkeypatch.setenv(kernels.PRODUCTS_VARIABLE, "auto")
    assert choose("", True, SHAPES) == "onednn"
    assert timed == [(SHAPES, torch.get_num_threads())]
    assert choose("", False, SHAPES) == "mkl"  # bf16, a GPU or a compiled model
    assert [choose(kept, True, SHAPES) for kept in ("mkl", "onednn")] == ["mkl", "onednn"]
    monkeypatch.setenv(kernels.PRODUCTS_VARIABLE, "mkl")
    assert choose("", True, SHAPES) == "mkl"
    assert choose("onednn", True, SHAPES) == "onednn"  # a resumed run multiplies as it began
    monkeypatch.setenv(kernels.PRODUCTS_VARIABLE, "onednn")
    assert choose("", True, SHAPES) == "onednn"
    assert len(timed) == 1
    monkeypatch.setenv(kernels.PRODUCTS_VARIABLE, "fast")
    with pytest.raises(UserError, match="ATTN_MT_FP32_PRODUCTS=fast: unknown"):
        choose("", True, SHAPES)


@pytest.mark.parametrize("slow", ["onednn", "mkl"])
def test_onednn_pays_where_its_products_are_faster(
    monkeypatch: pytest.MonkeyPatch, slow: str
) -> None:
    """The timing answers by which is faster here: each side slowed by 20 ms a step in turn
    (far beyond the products of this small layer) flips the answer."""
    slowed = kernels._OneDnnLinearFunction if slow == "onednn" else None
    if slowed is not None:
        forward = slowed.forward

        def slow_forward(ctx, *args):
            time.sleep(0.02)
            return forward(ctx, *args)

        monkeypatch.setattr(slowed, "forward", staticmethod(slow_forward))
    else:
        linear = F.linear

        def slow_linear(*args):
            time.sleep(0.02)
            return linear(*args)

        monkeypatch.setattr(F, "linear", slow_linear)
    shapes = ((24, 40), (40, 24))
    assert kernels.onednn_pays.__wrapped__(shapes, torch.get_num_threads()) == (slow == "mkl")


@pytest.fixture(scope="module")
def straight_onednn(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """The last.pt of an uninterrupted fp32 run through oneDNN, and its train.log."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(kernels.PRODUCTS_VARIABLE, "onednn")
        out = tmp_path_factory.mktemp("straight-onednn") / "run"
        run(make_config(toy_data, out, RESUME_MODEL, **RESUME_TRAIN))
    return load_raw(out / "checkpoints" / "last.pt"), out / "train.log"


def products(last: dict) -> str:
    """What a run's last.pt records its float32 linear layers multiplied through."""
    return last["train_state"]["progress"]["matmul_backend"]


def test_a_run_through_onednn_says_so_and_resumes_through_it_exactly(
    toy_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, straight_onednn
) -> None:
    """Half a run through oneDNN, then a resume asked for MKL: it keeps the recorded oneDNN
    and ends bit for bit where the straight oneDNN run did."""
    straight, log = straight_onednn
    assert products(straight) == "onednn"
    assert "float32 products through oneDNN" in log.read_text()
    out = tmp_path / "run"
    monkeypatch.setenv(kernels.PRODUCTS_VARIABLE, "onednn")
    run(make_config(toy_data, out, RESUME_MODEL, **{**RESUME_TRAIN, "max_steps": 3}))
    monkeypatch.setenv(kernels.PRODUCTS_VARIABLE, "mkl")
    run(make_config(toy_data, out, RESUME_MODEL, **RESUME_TRAIN), resume=True)
    resumed = load_raw(out / "checkpoints" / "last.pt")
    assert products(resumed) == "onednn"
    assert_identical(resumable_state(resumed), resumable_state(straight))


def test_a_last_pt_naming_the_backend_products_resumes_through_it_exactly(
    toy_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, straight_onednn
) -> None:
    """A last.pt written before `matmul_backend` had its name (it was `products`) resumes as
    it began, bit for bit."""
    out = tmp_path / "run"
    monkeypatch.setenv(kernels.PRODUCTS_VARIABLE, "onednn")
    run(make_config(toy_data, out, RESUME_MODEL, **{**RESUME_TRAIN, "max_steps": 3}))
    last = out / "checkpoints" / "last.pt"
    old = load_raw(last)
    progress = old["train_state"]["progress"]
    progress["products"] = progress.pop("matmul_backend")
    torch.save(old, last)
    monkeypatch.setenv(kernels.PRODUCTS_VARIABLE, "mkl")
    run(make_config(toy_data, out, RESUME_MODEL, **RESUME_TRAIN), resume=True)
    resumed = load_raw(last)
    assert products(resumed) == "onednn"
    assert_identical(resumable_state(resumed), resumable_state(straight_onednn[0]))


def test_onednn_and_mkl_runs_differ_only_by_rounding(
    toy_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, straight_onednn
) -> None:
    """The same run through MKL: other bits (so the resume test above can fail), the same
    training to within float rounding grown over 6 updates."""
    monkeypatch.setenv(kernels.PRODUCTS_VARIABLE, "mkl")
    out = tmp_path / "run"
    run(make_config(toy_data, out, RESUME_MODEL, **RESUME_TRAIN))
    mkl = load_raw(out / "checkpoints" / "last.pt")
    assert products(mkl) == "mkl"
    ours = straight_onednn[0]["model"]
    assert any(not torch.equal(mkl["model"][k], ours[k]) for k in ours)
    for key in ours:
        torch.testing.assert_close(mkl["model"][key], ours[key], rtol=1e-3, atol=1e-4)


def test_bf16_training_never_routes(
    toy_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    monkeypatch.setenv(kernels.PRODUCTS_VARIABLE, "onednn")
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="attn_mt"):
        run(make_config(toy_data, out, precision="bf16", max_steps=1))
    assert products(load_raw(out / "checkpoints" / "last.pt")) == "mkl"
    assert "through oneDNN" not in caplog.text


@pytest.mark.parametrize("asked", ["auto", "mkl", "onednn"])
def test_choosing_draws_no_random_numbers(monkeypatch: pytest.MonkeyPatch, asked: str) -> None:
    """The choice comes between a run's seed (or its restored RNG) and its first update, so
    it must leave the random stream where it was, even when it times or probes the CPU."""
    monkeypatch.setenv(kernels.PRODUCTS_VARIABLE, asked)
    for cached in (packing_available, kernels.onednn_pays):
        cached.cache_clear()
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    kernels.choose_products("", True, ((24, 40),))
    assert torch.equal(torch.rand(3), expected)
