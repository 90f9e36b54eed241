"""Prepacked float32 inference (`attn_mt.decode.packed`): the same function as the model it was made
from, the same hypotheses, the original left untouched, and the plain model where torch cannot
pack."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from helpers.models import assert_same, random_model, random_sources
from torch import nn

import attn_mt
from attn_mt import kernels
from attn_mt.data.text import read_lines
from attn_mt.decode import load as load_module
from attn_mt.decode import packed
from attn_mt.decode.generate import generate, max_output_lengths
from attn_mt.decode.search import Beam, Greedy
from attn_mt.errors import UserError
from attn_mt.model.attention import MultiHeadAttention
from attn_mt.model.layers import FeedForward
from attn_mt.model.vocab import PAD_ID


def logits(model: nn.Module, src: torch.Tensor) -> torch.Tensor:
    """Teacher-forced logits for the source itself as target prefix (any ids will do)."""
    return model(src, src.clamp(min=1))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_packed_model_computes_the_same_function(seed: int) -> None:
    model, src = random_model(seed), random_sources(seed)
    fast = packed.pack(random_model(seed))
    packed_layers = [n for n, m in fast.named_modules() if isinstance(m, packed.PackedLinear)]
    # Every layer inference runs: 4 in each encoder layer, 7 in each decoder layer (cross-
    # attention's Q and K-V rows apart), the output layer; never a split part it does not run.
    expected = 4 * len(model.encoder) + 7 * len(model.decoder) + 1
    assert len(packed_layers) == expected and "output" in packed_layers
    unused = ("self_attn.in_proj.q", "self_attn.in_proj.kv", "cross_attn.in_proj.all")
    assert not any(n.endswith(unused) for n in packed_layers)
    torch.testing.assert_close(logits(fast, src), logits(model, src), rtol=1e-5, atol=1e-5)
    # Cross-attention's query rows alone (what a decoding step uses) equal the slice of W_q.
    x = torch.randn(3, 4, 32)
    layer = next(m for m in model.modules() if isinstance(m, MultiHeadAttention))
    split = next(m for m in fast.modules() if isinstance(m, MultiHeadAttention))
    for first, last in ((0, 1), (1, 3)):
        torch.testing.assert_close(
            split._in_proj_rows(x, first, last), layer._in_proj_rows(x, first, last),
            rtol=1e-5, atol=1e-5,
        )  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packing_changes_no_hypothesis(seed: int) -> None:
    model, src = random_model(seed), random_sources(seed)
    fast, limits = packed.pack(random_model(seed)), max_output_lengths(src, 1.5, 5)
    beam = Beam(4, nbest=4)
    for strategy in (Greedy(), beam):
        found = [generate(m, src, limits, strategy, alpha=1.0) for m in (fast, model)]
        for a, b in zip(*found, strict=True):
            assert_same(a, b)
    # Batch-independent: each sentence alone finds what it found in the batch.
    in_batch = generate(fast, src, limits, beam, alpha=1.0)
    for row in range(3):
        alone = src[row : row + 1, : int((src[row] != PAD_ID).sum())]
        assert_same(generate(fast, alone, limits[row : row + 1], beam, alpha=1.0)[0], in_batch[row])


def test_padded_rows_are_few_sizes_and_little_waste() -> None:
    sizes = [packed.padded_rows(n) for n in range(1, 4097)]
    assert all(size >= n and size % 16 == 0 for n, size in enumerate(sizes, 1))
    assert all(size - n < max(16, n / 8) for n, size in enumerate(sizes, 1))  # <= 15 or 12%
    assert sizes == sorted(sizes)  # more rows never pad to fewer
    assert len(set(sizes)) == 16 + 8 * 4  # 16 up to 256 rows, then 8 per doubling to 4,096


@pytest.mark.parametrize("rows", [1, 15, 16, 17, 300])
def test_a_packed_layer_pads_any_row_count(rows: int) -> None:
    layer = nn.Linear(32, 48)
    x = torch.randn(rows, 2, 32)  # 2 * rows input rows: padded inside, not in the output
    torch.testing.assert_close(packed.PackedLinear(layer)(x), layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("rows", [1, 16, 17, 300])
def test_a_packed_feed_forward_is_the_block_with_its_activation_fused(
    activation: str, rows: int
) -> None:
    block = FeedForward(32, 64, dropout=0.3, activation=activation).eval()
    with torch.no_grad():
        block.w_1.bias.normal_()  # negative and positive pre-activations both
    fast = packed.PackedFeedForward(block)
    assert fast.w_1.activation == activation and fast.w_2.activation == "none"
    x = torch.randn(rows, 3, 32)
    torch.testing.assert_close(fast(x), block(x), rtol=1e-5, atol=1e-5)
    # The first product alone applies the activation; the plain layer's is the identity.
    hidden = packed.PackedLinear(block.w_1, activation)(x)
    torch.testing.assert_close(hidden, block.activation(block.w_1(x)), rtol=1e-5, atol=1e-5)
    assert (hidden >= 0).all() if activation == "relu" else (hidden < 0).any()


def test_padding_adds_zero_rows_up_to_the_padded_count() -> None:
    rows = torch.randn(17, 8)
    out = packed._padded(rows)
    assert out.shape == (packed.padded_rows(17), 8)
    assert torch.equal(out[:17], rows) and not out[17:].any()
    exact = torch.randn(16, 8)
    assert packed._padded(exact) is exact  # a padded count already: no copy


def test_packing_is_in_place_and_keeps_the_state_dict_keys() -> None:
    """load() packs the model it just built: no second copy of the weights at load time."""
    model = random_model(3)
    keys = list(model.state_dict())
    assert packed.pack(model) is model
    assert any(isinstance(m, packed.InProj) for m in model.modules())
    assert list(model.state_dict()) != keys  # in_proj.all.weight, ...: inference only


def test_linear_layers_says_how_the_model_multiplies() -> None:
    assert packed.linear_layers(random_model(0)) == "plain"
    int8 = packed.quantize(random_model(0), "int8", torch.device("cpu"))
    assert packed.linear_layers(int8) == "int8"
    if packed.packing_available():
        assert packed.linear_layers(packed.pack(random_model(0))) == "prepacked"


def test_without_the_op_pack_returns_the_model_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    model = random_model(0)
    monkeypatch.setattr(packed, "packing_available", lambda: False)
    assert packed.pack(model) is model


def test_load_packs_float32_on_the_cpu_and_translates_the_same(trained_run: Path) -> None:
    fast = attn_mt.load(trained_run, device="cpu", prepack=True)
    plain = attn_mt.load(trained_run, device="cpu", prepack=False)
    assert any(isinstance(m, packed.PackedLinear) for m in fast.model.modules())
    assert not any(isinstance(m, packed.PackedLinear) for m in plain.model.modules())
    bf16 = attn_mt.load(trained_run, device="cpu", precision="bf16", prepack=True)
    assert not any(isinstance(m, packed.PackedLinear) for m in bf16.model.modules())
    lines = read_lines(fast.config.data.test.src)
    for beam in (1, 4):
        assert fast.translate(lines, beam=beam) == plain.translate(lines, beam=beam)


@pytest.mark.parametrize("pays", [True, False])
def test_load_packs_by_default_where_packing_pays(
    trained_run: Path, monkeypatch: pytest.MonkeyPatch, pays: bool
) -> None:
    """prepack="auto" (the default) packs exactly where the timing on this CPU says it pays;
    the timing is asked about the model's own d_model -> d_ff layer."""
    asked = []
    monkeypatch.setattr(load_module, "packing_pays", lambda *size: asked.append(size) or pays)
    translator = attn_mt.load(trained_run, device="cpu")
    is_packed = any(isinstance(m, packed.PackedLinear) for m in translator.model.modules())
    model = translator.config.model
    assert is_packed == (pays and packed.packing_available())
    assert asked == [(model.d_model, model.d_ff, torch.get_num_threads())]
    with pytest.raises(UserError, match="prepack='yes'"):
        attn_mt.load(trained_run, device="cpu", prepack="yes")


@pytest.mark.skipif(not packed.packing_available(), reason="this torch build cannot prepack")
@pytest.mark.parametrize("slow", ["packed", "plain"])
def test_packing_pays_where_the_packed_product_is_faster(
    monkeypatch: pytest.MonkeyPatch, slow: str
) -> None:
    """The timing answers by which feed-forward block is faster here: each side slowed down by
    2 ms a call in turn (far beyond the products of this small block) flips the answer."""
    slowed = packed.PackedFeedForward if slow == "packed" else FeedForward
    forward = slowed.forward

    def slow_forward(self, x):
        time.sleep(0.002)
        return forward(self, x)

    monkeypatch.setattr(slowed, "forward", slow_forward)
    assert packed.time_packing(24, 40, torch.get_num_threads()) == (slow == "plain")


@pytest.fixture
def timings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[int, int, int]]:
    """A fresh user cache and a fake timing (packing pays for d_model 24) that records each
    call; `packing_pays`'s in-process cache emptied before and after."""
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setenv("ATTN_MT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(packed, "time_packing", lambda *size: calls.append(size) or size[0] == 24)
    packed.packing_pays.cache_clear()
    yield calls
    packed.packing_pays.cache_clear()


def test_packing_is_timed_once_per_machine_and_size(timings, tmp_path: Path) -> None:
    """The timing's answer is kept in the user cache: a second process (the in-process cache
    emptied) reads it instead of timing, another size or machine is timed anew, and what the
    file says is what is answered."""
    assert packed.packing_pays(24, 40, 2) and not packed.packing_pays(32, 64, 2)
    packed.packing_pays.cache_clear()
    assert packed.packing_pays(24, 40, 2) and not packed.packing_pays(32, 64, 2)
    assert timings == [(24, 40, 2), (32, 64, 2)]
    path = tmp_path / "cache" / kernels.CHOICES_FILE
    kept = json.loads(path.read_text())
    assert len(kept) == 2 and all(kernels.machine() in key for key in kept)
    path.write_text(json.dumps({key: not answer for key, answer in kept.items()}))
    packed.packing_pays.cache_clear()
    assert not packed.packing_pays(24, 40, 2) and packed.packing_pays(32, 64, 2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "machine", lambda: "another machine")
        packed.packing_pays.cache_clear()
        assert packed.packing_pays(24, 40, 2)
    assert timings[2:] == [(24, 40, 2)] and len(json.loads(path.read_text())) == 3


@pytest.mark.parametrize("content", ["{not json", "[true]", '{"x": 1}', ""])
def test_an_unreadable_choices_file_is_timed_over(timings, tmp_path: Path, content: str) -> None:
    path = tmp_path / "cache" / kernels.CHOICES_FILE
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert packed.packing_pays(24, 40, 2) and timings == [(24, 40, 2)]
    kept = {key: answer for key, answer in json.loads(path.read_text()).items() if key != "x"}
    assert list(kept.values()) == [True]


def test_an_unwritable_cache_costs_the_timing_not_an_error(
    timings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ATTN_MT_CACHE", str(blocker / "cache"))  # a folder under a file
    assert packed.packing_pays(24, 40, 2)
    packed.packing_pays.cache_clear()
    assert packed.packing_pays(24, 40, 2) and timings == [(24, 40, 2)] * 2
