"""The label-smoothed loss against its formula, torch's own cross-entropy and its gradient."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attn_mt.model.vocab import EOS_ID, PAD_ID
from attn_mt.train.loss import label_smoothed_loss


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
