"""The training loss: label-smoothed cross-entropy over the non-padding target tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attn_mt.model.vocab import PAD_ID


def label_smoothed_loss(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over non-pad targets.

    loss = (1 - eps) * -log p(y) + eps * mean_v(-log p(v))  (Szegedy et al., 2016)
    Args: logits (B, T, V); target (B, T) with PAD_ID where there is no token.
    Returns two scalars in float32 (or float64 for float64 logits); only `loss` has a gradient.
    """
    vocab = logits.size(-1)
    return _SmoothedCrossEntropy.apply(logits.reshape(-1, vocab), target.reshape(-1), epsilon)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """`label_smoothed_loss` with its gradient written out: d loss / d logits =
    softmax - (1 - eps) * onehot(y) - eps / V on real rows, 0 on padding. Autograd's own
    backward through log_softmax, gather and mean took 2x as long on the (N, V) logits."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, epsilon: float):
        dtype = torch.promote_types(logits.dtype, torch.float32)
        log_probs = F.log_softmax(logits, dim=-1, dtype=dtype)  # (N, V)
        nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (N,)
        smooth = -log_probs.mean(dim=-1)  # (N,)
        pad = target == PAD_ID
        loss = ((1.0 - epsilon) * nll + epsilon * smooth).masked_fill(pad, 0.0).sum()
        nll_sum = nll.masked_fill(pad, 0.0).sum()
        ctx.save_for_backward(log_probs, target)
        ctx.epsilon, ctx.logits_dtype = epsilon, logits.dtype
        ctx.mark_non_differentiable(nll_sum)
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor):
        log_probs, target = ctx.saved_tensors
        eps = ctx.epsilon
        grad = log_probs.exp().sub_(eps / log_probs.size(-1))  # (N, V) softmax - eps / V
        hit = torch.full((target.numel(), 1), eps - 1.0, dtype=grad.dtype, device=grad.device)
        grad.scatter_add_(-1, target.unsqueeze(-1), hit)  # - (1 - eps) at the target
        grad.mul_((target != PAD_ID).unsqueeze(-1) * grad_loss)
        return grad.to(ctx.logits_dtype), None, None
