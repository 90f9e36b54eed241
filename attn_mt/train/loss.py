"""The training loss: label-smoothed cross-entropy over the non-padding target tokens."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attn_mt.model.vocab import PAD_ID

# Elements of the float32 gradient made at a time for lower-precision logits (64 MiB).
GRAD_CHUNK = 2**24


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
        if log_probs.dtype == ctx.logits_dtype:
            return _gradient(log_probs, target, ctx.epsilon, grad_loss), None, None
        # bf16/fp16 logits: written GRAD_CHUNK elements at a time into a tensor of their dtype,
        # so the float32 log-probs are the only full float32 (N, V) tensor alive.
        grad = torch.empty(log_probs.shape, dtype=ctx.logits_dtype, device=log_probs.device)
        rows = max(GRAD_CHUNK // log_probs.size(-1), 1)
        for start in range(0, len(target), rows):
            part = slice(start, start + rows)
            grad[part] = _gradient(log_probs[part], target[part], ctx.epsilon, grad_loss)
        return grad, None, None


def _gradient(
    log_probs: torch.Tensor, target: torch.Tensor, eps: float, grad_loss: torch.Tensor
) -> torch.Tensor:
    """d loss / d logits of rows (N, V), in the log-probs' dtype."""
    grad = log_probs.exp().sub_(eps / log_probs.size(-1))  # (N, V) softmax - eps / V
    hit = torch.full((target.numel(), 1), eps - 1.0, dtype=grad.dtype, device=grad.device)
    grad.scatter_add_(-1, target.unsqueeze(-1), hit)  # - (1 - eps) at the target
    return grad.mul_((target != PAD_ID).unsqueeze(-1) * grad_loss)


def perplexity(nll: float, tokens: int) -> float:
    """exp(nll per token), the exponent held at 50 so a diverged model's is a number, not inf."""
    return math.exp(min(nll / max(tokens, 1), 50))
