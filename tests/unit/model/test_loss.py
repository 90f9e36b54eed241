"""The label-smoothed loss against its formula, torch's own cross-entropy and its gradient."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from attn_mt.model.layers import LayerSpec
from attn_mt.model.loss import SmoothedObjective, fused_chunk, label_smoothed_loss, projected_loss
from attn_mt.model.transformer import Transformer
from attn_mt.model.vocab import EOS_ID, PAD_ID


def test_label_smoothed_loss_matches_the_formula_and_ignores_pads() -> None:
    torch.manual_seed(0)
    vocab, epsilon = 7, 0.1
    logits = torch.randn(2, 4, vocab)
    target = torch.tensor([[4, 5, 6, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID]])
    loss, nll = label_smoothed_loss(logits, target, epsilon)

    want_loss = want_nll = 0.0
    for b in range(2):
        for t in range(4):
            y = int(target[b, t])
            if y == PAD_ID:
                continue
            log_p = [
                float(logits[b, t, v]) - math.log(sum(math.exp(float(x)) for x in logits[b, t]))
                for v in range(vocab)
            ]
            want_nll += -log_p[y]
            want_loss += (1 - epsilon) * -log_p[y] + epsilon * -sum(log_p) / vocab
    assert float(loss) == pytest.approx(want_loss, rel=1e-5)
    assert float(nll) == pytest.approx(want_nll, rel=1e-5)

    flat_logits, flat_target = logits.view(-1, vocab), target.view(-1)
    torch_loss = F.cross_entropy(
        flat_logits, flat_target, label_smoothing=epsilon, ignore_index=PAD_ID, reduction="sum"
    )
    torch_nll = F.cross_entropy(flat_logits, flat_target, ignore_index=PAD_ID, reduction="sum")
    assert torch.allclose(loss, torch_loss, rtol=1e-5)
    assert torch.allclose(nll, torch_nll, rtol=1e-5)
    no_smoothing, nll_again = label_smoothed_loss(logits, target, 0.0)
    assert torch.allclose(no_smoothing, torch_nll, rtol=1e-5) and torch.equal(nll, nll_again)

    scrambled = logits.clone()
    scrambled[target == PAD_ID] = 1e4 * torch.randn(int((target == PAD_ID).sum()), vocab)
    assert torch.equal(label_smoothed_loss(scrambled, target, epsilon)[0], loss)
    all_pad = torch.full_like(target, PAD_ID)
    assert [float(x) for x in label_smoothed_loss(logits, all_pad, epsilon)] == [0.0, 0.0]


def test_label_smoothed_loss_gradient_is_the_true_gradient() -> None:
    """The hand-written backward equals autograd's gradient of the formula (float64)."""
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 9, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([[4, 5, 8, EOS_ID, PAD_ID], [7, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])
    assert torch.autograd.gradcheck(lambda x: label_smoothed_loss(x, target, 0.1)[0], (logits,))

    def formula(x: torch.Tensor) -> torch.Tensor:
        log_p = x.log_softmax(-1)
        per_token = -0.9 * log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1) - 0.1 * log_p.mean(-1)
        return per_token.masked_fill(target == PAD_ID, 0.0).sum()

    (want,) = torch.autograd.grad(formula(logits), logits)
    (got,) = torch.autograd.grad(label_smoothed_loss(logits, target, 0.1)[0], logits)
    assert torch.allclose(got, want, atol=1e-12)
    assert torch.all(got[target == PAD_ID] == 0)


def test_label_smoothed_loss_is_float32_for_bf16_logits() -> None:
    logits = torch.randn(2, 3, 11).bfloat16()
    target = torch.tensor([[4, 5, EOS_ID], [6, EOS_ID, PAD_ID]])
    loss, nll = label_smoothed_loss(logits, target, 0.1)
    assert loss.dtype == nll.dtype == torch.float32
    assert torch.allclose(loss, label_smoothed_loss(logits.float(), target, 0.1)[0])


def _logits_reference(hidden, weight, target, epsilon):
    """The loss and its gradients through the full (B, T, V) logits."""
    logits = hidden @ weight.t()
    loss, nll = label_smoothed_loss(logits, target, epsilon)
    return (loss, nll, *torch.autograd.grad(loss, (hidden, weight)))


@pytest.mark.parametrize("fused", [None, fused_chunk], ids=["eager chunk", "fused chunk"])
@pytest.mark.parametrize("chunk", [2**22, 37])  # one chunk; many, the last one short
def test_projected_loss_equals_the_loss_of_the_full_logits(chunk, fused, monkeypatch) -> None:
    """Loss, NLL and both gradients as through the full logits (float64: to rounding), with
    each chunk op by op or as the function train.compile compiles (run eagerly here)."""
    monkeypatch.setattr("attn_mt.model.loss.PROJECTION_CHUNK", chunk)
    torch.manual_seed(0)
    hidden = torch.randn(3, 6, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    target = torch.randint(4, 13, (3, 6))
    target[0, 4:] = PAD_ID
    target[2, 1:] = PAD_ID
    want = _logits_reference(hidden, weight, target, 0.1)
    tokens = int((target != PAD_ID).sum())
    loss, nll = projected_loss(hidden, weight, target, 0.1, tokens=tokens, fused=fused)
    got = (loss, nll, *torch.autograd.grad(loss, (hidden, weight)))
    for name, a, b in zip(("loss", "nll", "d hidden", "d weight"), got, want, strict=True):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-6, atol=1e-9, msg=name)
    assert torch.all(got[2][target == PAD_ID] == 0), "padding rows get no gradient"


def test_projected_loss_under_bf16_autocast_is_the_reference_within_bf16() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(4, 9, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    target = torch.randint(4, 50, (4, 9))
    target[1, 5:] = PAD_ID
    want = _logits_reference(hidden, weight, target, 0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, nll = projected_loss(hidden, weight, target, 0.1)
    got = (loss, nll, *torch.autograd.grad(loss, (hidden, weight)))
    assert loss.dtype == torch.float32
    assert got[2].dtype == hidden.dtype and got[3].dtype == weight.dtype
    for name, a, b in zip(("loss", "nll", "d hidden", "d weight"), got, want, strict=True):
        scale = float(b.detach().abs().max())
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2 * scale, msg=name)


def test_projected_loss_keeps_no_vocabulary_sized_tensor_for_the_backward() -> None:
    """What the graph saves is of the hidden and weight's size, not tokens x vocabulary."""
    hidden = torch.randn(8, 20, 16, requires_grad=True)
    weight = torch.randn(3000, 16, requires_grad=True)
    target = torch.randint(4, 3000, (8, 20))
    saved: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        projected_loss(hidden, weight, target, 0.1)
    assert saved and max(saved) <= weight.numel()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        label_smoothed_loss(hidden @ weight.t(), target, 0.1)
    assert max(saved) >= target.numel() * 3000, "the reference keeps the (N, V) log-probs"


def test_compiled_label_smoothed_loss_serves_every_batch_shape_with_one_graph(monkeypatch) -> None:
    """Under torch.compile the bf16 gradient is not chunked: a chunk loop ties the graph to
    the token count, a recompile for every batch shape (docs/history.md, "GPU sessions")."""
    monkeypatch.setattr("attn_mt.model.loss.GRAD_CHUNK", 3 * 50)  # eagerly: 3 rows at a time
    graphs = []

    def counting_backend(graph, _inputs):
        graphs.append(graph)
        return graph.forward

    def step(logits, target):
        return label_smoothed_loss(logits, target, 0.1)[0]

    compiled = torch.compile(step, backend=counting_backend, dynamic=True)
    for rows, length in [(4, 7), (5, 9), (3, 11)]:
        logits = torch.randn(rows, length, 50).bfloat16().requires_grad_()
        target = torch.randint(4, 50, (rows, length))
        target[0, 3:] = PAD_ID
        (got,) = torch.autograd.grad(compiled(logits, target), logits)
        (want,) = torch.autograd.grad(step(logits, target), logits)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, want)
    assert len(graphs) == 1


def test_fused_loss_compiles_with_the_devices_inductor_settings(monkeypatch) -> None:
    """`SmoothedObjective.fuse` gives torch.compile the Inductor settings of the model's
    device (`precision.inductor_options`), as the compiled model gets them."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: calls.append(kwargs) or fn)
    monkeypatch.setattr("attn_mt.model.loss.inductor_options", lambda kind: {"for": kind})
    model = Transformer(50, 50, LayerSpec(d_model=16, heads=2, d_ff=32), 1, 1)
    SmoothedObjective(model, 0.1).fuse(True)
    assert calls == [{"dynamic": True, "options": {"for": "cpu"}}]


def test_fused_loss_compiles_one_graph_for_every_chunk_and_batch(monkeypatch) -> None:
    """`SmoothedObjective.fuse`: the loss's chunks run through torch.compile, one dynamic graph
    for chunks of every row count (full ones, a short last one, other batches), with the
    eager objective's loss and gradients."""
    monkeypatch.setattr("attn_mt.model.loss.PROJECTION_CHUNK", 7 * 50)  # 7 rows a chunk
    graphs = []

    def counted(graph, _inputs):
        graphs.append(graph)
        return graph.forward

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=counted))
    torch.manual_seed(0)
    model = Transformer(50, 50, LayerSpec(d_model=16, heads=2, d_ff=32), 1, 1)
    objective = SmoothedObjective(model, 0.1)
    torch._dynamo.reset()
    try:
        for rows, length in [(4, 7), (5, 9), (3, 11)]:
            src, tgt = torch.randint(4, 50, (rows, 6)), torch.randint(4, 50, (rows, length + 1))
            tgt[0, 4:] = PAD_ID
            found = []
            for fused in (False, True):
                objective.fuse(fused)
                loss, nll = objective(src, tgt[:, :-1], tgt[:, 1:])
                found.append([loss, nll, *torch.autograd.grad(loss, list(model.parameters()))])
            for a, b in zip(*found, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1, graphs
