"""The model's training objective: label-smoothed cross-entropy over the non-padding target
tokens, and `SmoothedObjective`, the module training runs (the model and its loss in one
forward, the output projection and the loss a chunk of rows at a time); perplexity."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attn_mt.model.transformer import Transformer
from attn_mt.model.vocab import PAD_ID
from attn_mt.precision import inductor_options

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
    softmax - (1 - eps) * onehot(y) - eps / V on real rows, 0 on padding. Written out
    because autograd's backward through log_softmax, gather and mean is slower on the (N, V)
    logits (docs/performance.md)."""

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
        if log_probs.dtype == ctx.logits_dtype or torch.compiler.is_compiling():
            # Compiled, the gradient is one fused kernel (no float32 copy is made), and a
            # chunk loop would tie the graph to the batch's token count: a recompile per shape.
            gradient = _gradient(log_probs, target, ctx.epsilon, grad_loss)
            return gradient.to(ctx.logits_dtype), None, None
        # bf16/fp16 logits: written GRAD_CHUNK elements at a time into a tensor of their dtype,
        # so the float32 log-probs are the only full float32 (N, V) tensor alive.
        grad = torch.empty(log_probs.shape, dtype=ctx.logits_dtype, device=log_probs.device)
        rows = max(GRAD_CHUNK // log_probs.size(-1), 1)
        for start in range(0, len(target), rows):
            part = slice(start, start + rows)
            grad[part] = _gradient(log_probs[part], target[part], ctx.epsilon, grad_loss)
        return grad, None, None


def _gradient(
    log_probs: torch.Tensor, target: torch.Tensor, eps: float, grad_loss: torch.Tensor | float
) -> torch.Tensor:
    """d loss / d logits of rows (N, V), in the log-probs' dtype."""
    grad = log_probs.exp().sub_(eps / log_probs.size(-1))  # (N, V) softmax - eps / V
    hit = torch.full((target.numel(), 1), eps - 1.0, dtype=grad.dtype, device=grad.device)
    grad.scatter_add_(-1, target.unsqueeze(-1), hit)  # - (1 - eps) at the target
    return grad.mul_((target != PAD_ID).unsqueeze(-1) * grad_loss)


# Logit elements one step of `projected_loss` makes at a time: 4M (16 MiB of float32) on the
# CPU; 256M on a GPU (1 GiB of float32 log-probs: 8,192 rows of a 32k vocabulary), where each
# chunk is a round of launches from the host and thin products leave the card idle; the
# choice, measured against smaller and larger chunks, is in docs/history.md ("GPU sessions").
PROJECTION_CHUNK = 2**22
PROJECTION_CHUNK_GPU = 2**28


def projection_chunk(device_type: str) -> int:
    """Logit elements one step of `projected_loss` makes at a time on `device_type`."""
    return PROJECTION_CHUNK if device_type == "cpu" else PROJECTION_CHUNK_GPU


def projected_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    epsilon: float,
    tokens: int | None = None,
    fused: Chunk | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`label_smoothed_loss` of the logits `hidden @ weight^T`, which are never all made.

    The output projection and the loss run together over the non-pad rows only, a chunk of
    rows at a time, and the gradients of `hidden` and `weight` are made in the same pass (the
    loss is the graph's end, so d loss / d logits is known in the forward): no (tokens x V)
    tensor is kept for the backward, and no logits are computed for padding (Liger-Kernel's
    fused linear cross-entropy does the same on the GPU).
    Args: hidden (B, T, D) the decoder's final states; weight (V, D) the output projection;
    target (B, T) with PAD_ID where there is no token; tokens: the count of non-pad targets
    when the caller knows it (picking the rows then needs no wait for the device); fused:
    `fused_chunk` compiled, to run each chunk of a pass with gradients (else `eager_chunk`).
    Under autocast the products run in its dtype, the softmax in float32.
    Returns two float32 scalars (float64 for float64 inputs): the summed loss and NLL; only the
    loss has a gradient.
    """
    return _ProjectedCrossEntropy.apply(hidden, weight, target, epsilon, tokens, fused)


# One chunk of `projected_loss`: (rows (n, D), weight (V, D), labels (n,), epsilon, gradient?)
# -> the summed loss and NLL of the logits rows @ weight^T, and d loss / d logits (n, V) in the
# rows' dtype (None without the gradient).
Chunk = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, float, bool],
    tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
]


def eager_chunk(
    rows: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, epsilon: float, gradient: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A `Chunk` op by op, each (n, V) tensor let go as soon as the next is made."""
    log_probs = _projected_log_probs(rows, w)
    loss, nll = _summed(log_probs, labels, epsilon)
    if not gradient:
        return loss, nll, None
    return loss, nll, _gradient(log_probs, labels, epsilon, 1.0).to(rows.dtype)


def fused_chunk(
    rows: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, epsilon: float, gradient: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A `Chunk` written for torch.compile (`SmoothedObjective.fuse`): the target's one-hot is
    a comparison, not a scatter, so Inductor can make the softmax, the loss and the gradient in
    a few passes over the logits, with no float32 (n, V) tensor written. Eagerly it would
    make several (n, V) temporaries: `eager_chunk` is the eager one."""
    log_probs = _projected_log_probs(rows, w)
    loss, nll = _summed(log_probs, labels, epsilon)
    if not gradient:
        return loss, nll, None
    vocab = log_probs.size(-1)
    hit = labels.unsqueeze(-1) == torch.arange(vocab, device=labels.device)  # (n, V)
    grad = log_probs.exp() - epsilon / vocab - (1.0 - epsilon) * hit  # labels are never pad
    return loss, nll, grad.to(rows.dtype)


def _projected_log_probs(rows: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """log_softmax(rows @ w^T) (n, V), in float32 at least; the logits die on return."""
    logits = rows @ w.t()  # (n, V)
    return F.log_softmax(logits, dim=-1, dtype=torch.promote_types(rows.dtype, torch.float32))


def _summed(
    log_probs: torch.Tensor, labels: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed label-smoothed loss and NLL of rows (n, V) of log-probs, none of them pad."""
    nll = -log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (n,)
    smooth = -log_probs.mean(dim=-1)  # (n,)
    return ((1.0 - epsilon) * nll + epsilon * smooth).sum(), nll.sum()


class _ProjectedCrossEntropy(torch.autograd.Function):
    """`projected_loss`; backward only scales the gradients the forward made."""

    @staticmethod
    def forward(ctx, hidden, weight, target, epsilon, tokens, fused):
        device_type = hidden.device.type
        dtype = hidden.dtype
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
        keep = target.reshape(-1) != PAD_ID
        if tokens is None:
            positions = keep.nonzero().squeeze(1)  # (N,)
        else:
            positions = torch.nonzero_static(keep, size=tokens).squeeze(1)  # (N,)
        rows = hidden.reshape(-1, hidden.size(-1)).index_select(0, positions).to(dtype)  # (N, D)
        labels = target.reshape(-1).index_select(0, positions)  # (N,)
        w = weight.to(dtype)  # (V, D)
        softmax_dtype = torch.promote_types(dtype, torch.float32)
        wants_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        chunk_of = fused if fused is not None and wants_grad else eager_chunk
        grad_rows = torch.empty_like(rows) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight, dtype=softmax_dtype) if ctx.needs_input_grad[1] else None
        loss = torch.zeros((), dtype=softmax_dtype, device=hidden.device)
        nll_sum = torch.zeros((), dtype=softmax_dtype, device=hidden.device)
        step = max(projection_chunk(device_type) // weight.size(0), 1)
        with torch.autocast(device_type, enabled=False):
            for start in range(0, rows.size(0), step):
                part = slice(start, start + step)
                summed, nll, grad = chunk_of(rows[part], w, labels[part], epsilon, wants_grad)
                loss += summed
                nll_sum += nll
                if grad is None:  # no gradient asked
                    continue
                if grad_rows is not None:
                    grad_rows[part] = grad @ w  # (n, D)
                if grad_w is not None:
                    grad_w.add_(grad.t() @ rows[part])  # (V, D), summed in float32
        ctx.save_for_backward(positions, grad_rows, grad_w)
        ctx.hidden_shape, ctx.hidden_dtype = hidden.shape, hidden.dtype
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(nll_sum)
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):
        positions, grad_rows, grad_w = ctx.saved_tensors
        grad_hidden = grad_weight = None
        if grad_rows is not None:
            shape = ctx.hidden_shape
            flat = torch.zeros(
                shape.numel() // shape[-1],
                shape[-1],
                dtype=ctx.hidden_dtype,
                device=grad_rows.device,
            )
            flat.index_copy_(0, positions, (grad_rows * grad_loss).to(ctx.hidden_dtype))
            grad_hidden = flat.view(shape)
        if grad_w is not None:
            grad_weight = (grad_w * grad_loss).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None


class SmoothedObjective(nn.Module):
    """The training objective as one module, which DDP and torch.compile wrap, so that their
    hooks and graphs see the whole forward: the model's decoder states scored by
    `projected_loss` against the output projection, no (B, T, V) logits made."""

    def __init__(self, model: Transformer, epsilon: float):
        super().__init__()
        self.model, self.epsilon = model, epsilon
        # The non-pad count of the next forward's `tgt_out`, when the caller knows it (then
        # nothing waits for the device to pick the rows). An attribute, not an argument: it is
        # read outside torch.compile's graph, which would be made again for each int value.
        self.tokens: int | None = None
        self.fused: Chunk | None = None  # `fuse`

    def fuse(self, on: bool, settings: dict[str, Any] | None = None) -> None:
        """Run each chunk of the loss as one compiled function (`fused_chunk` through
        torch.compile), or op by op. train.compile turns it on with the compiled model, whose
        graph leaves the loss out (`score`): its softmax, loss and gradient would otherwise run
        op by op beside compiled layers (docs/gpu.md). It compiles with the device's Inductor
        settings (`precision.inductor_options`), `settings` over them."""
        self.fused = None
        if on:
            options = inductor_options(next(self.parameters()).device.type) | (settings or {})
            self.fused = torch.compile(fused_chunk, dynamic=True, options=options or None)

    def forward(
        self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed label-smoothed loss and NLL of `tgt_out` (B, T) under teacher forcing of
        `src` (B, S) and `tgt_in` (B, T)."""
        return self.score(self.model.features(src, tgt_in), tgt_out)  # (B, T, D) in

    @torch.compiler.disable
    def score(
        self, hidden: torch.Tensor, tgt_out: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`projected_loss` of the states (B, T, D), run eagerly under torch.compile: its chunk
        loop depends on the number of tokens."""
        weight, bias = self.model.output.weight, self.model.output.bias
        if bias is not None:  # W y + b = [W, b] [y, 1]: the bias as a column over a constant 1
            weight = torch.cat([weight, bias.unsqueeze(1)], dim=1)  # (V, D + 1)
            hidden = torch.cat([hidden, hidden.new_ones(*hidden.shape[:-1], 1)], dim=-1)
        return projected_loss(hidden, weight, tgt_out, self.epsilon, self.tokens, self.fused)


def perplexity(nll: float, tokens: int) -> float:
    """exp(nll per token), the exponent held at 50 so a diverged model's is a number, not inf."""
    return math.exp(min(nll / max(tokens, 1), 50))
