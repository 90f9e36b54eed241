"""Float32 training products through oneDNN, on CPUs where it beats MKL.

On the CPU, `nn.Linear` multiplies float32 through MKL's sgemm. On some CPUs oneDNN's kernels
run far faster (MKL takes a generic AVX2 path on AMD processors; figures: docs/performance.md),
but torch sends only bf16 products, and float32 ones at reduced precision, to oneDNN.
`OneDnnLinear` sends the forward product and the input gradient of a float32 linear layer
there itself, each one `torch.ops.mkldnn._linear_pointwise` call (y = x A^T + b with A a plain
matrix, which oneDNN reorders into its layout inside the call; the weight changes every update,
so nothing is prepacked):

    forward          y     = x W^T + b          A = W
    input gradient   dL/dx = dL/dy W            A = W^T
    weight gradient  dL/dW = (dL/dy)^T x        MKL: as a oneDNN call both operands would have
                                                to be transposed and copied, which was slower

The same float32 sums in another order: results agree with `nn.Linear` to rounding, not bit
for bit. oneDNN builds a kernel per shape and keeps the recent ones (its primitive cache), so
the token counts that change at every update cost little set-up time.

`choose_products` decides once per run, by timing both on this CPU (or as
$ATTN_MT_FP32_PRODUCTS says: auto, mkl or onednn), and the run's progress records the choice, so
a resumed run multiplies as it began (exact resume).

Shapes: N rows (tokens), I in_features, O out_features.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import nn

from attn_mt import distributed
from attn_mt.config import Config
from attn_mt.errors import UserError
from attn_mt.kernels import onednn_wins, packing_available
from attn_mt.model.transformer import Transformer

PRODUCTS = ("mkl", "onednn")  # what a run's float32 linear layers multiply through
PRODUCTS_VARIABLE = "ATTN_MT_FP32_PRODUCTS"  # auto (time both), mkl or onednn
TIMING_ROWS = 2048  # rows of the timed layers: about half a training batch's tokens


def _product(rows: torch.Tensor, matrix: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """rows A^T + bias through oneDNN: (N, I) x (O, I) -> (N, O)."""
    return torch.ops.mkldnn._linear_pointwise(rows, matrix, bias, "none", [], "")


class _OneDnnLinearFunction(torch.autograd.Function):
    """y = x W^T + b, its forward product and input gradient through oneDNN (module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        rows = x.reshape(-1, x.size(-1))  # (N, I)
        return _product(rows, weight, bias).view(*x.shape[:-1], weight.size(0))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        rows = x.reshape(-1, x.size(-1))  # (N, I)
        grad_rows = grad.reshape(-1, grad.size(-1)).contiguous()  # (N, O)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _product(grad_rows, weight.t().contiguous(), None).view_as(x)  # (N, I)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_rows.t() @ rows  # (O, N) x (N, I) -> (O, I)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_rows.sum(0)
        return grad_x, grad_weight, grad_bias


def onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """F.linear(x, weight, bias), float32 on the CPU, forward and backward through oneDNN."""
    return _OneDnnLinearFunction.apply(x, weight, bias)


class OneDnnLinear(nn.Linear):
    """`nn.Linear` whose products run through oneDNN (`onednn_linear`); the same parameters
    and state dict. `rows` is the attention's sliced use of an in_proj (as `InProj.rows`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return onednn_linear(x, self.weight, self.bias)

    def rows(self, x: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """x times the blocks first..last-1 of a stacked in_proj (0 = W_q, 1 = W_k, 2 = W_v)."""
        block = slice(first * self.in_features, last * self.in_features)
        return onednn_linear(x, self.weight[block], self.bias[block])


def route_through_onednn(model: nn.Module) -> nn.Module:
    """`model` with each `nn.Linear` replaced by a `OneDnnLinear` holding the same parameter
    objects (in place: tied weights stay tied, an optimizer built before keeps them)."""
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                bias = child.bias is not None
                layer = OneDnnLinear(child.in_features, child.out_features, bias, device="meta")
                layer.weight, layer.bias = child.weight, child.bias
                setattr(parent, name, layer)
    return model


def choose_for_run(
    model: Transformer,
    cfg: Config,
    recorded: str,
    device: torch.device,
    dtype: torch.dtype | None,
    world: distributed.World,
) -> str:
    """What a run's float32 linear layers multiply through (`choose_products`, on rank 0 for
    every rank: decided as a run begins, kept on resume), `model` routed through oneDNN where
    that is the answer. Only float32 on a CPU, not compiled, is eligible."""
    eligible = device.type == "cpu" and dtype is None and cfg.train.compile == "false"
    d_model, d_ff, vocab = cfg.model.d_model, cfg.model.d_ff, model.output.out_features
    shapes = ((d_model, d_ff), (d_ff, d_model), (d_model, vocab))
    backend = distributed.from_main(lambda: choose_products(recorded, eligible, shapes), world)
    if backend == "onednn":
        route_through_onednn(model)
    return backend


def choose_products(recorded: str, eligible: bool, shapes: tuple[tuple[int, int], ...]) -> str:
    """What a run's float32 linear layers multiply through: 'mkl' (nn.Linear) where oneDNN is
    not `eligible` (not float32 on a CPU, compiled, or not in this torch build), else what the
    run `recorded` when it began, else, at its start, what $ATTN_MT_FP32_PRODUCTS names, or with
    'auto' (its default) 'onednn' where that pays on this CPU for layers of `shapes`
    ((in_features, out_features), ...)."""
    asked = os.environ.get(PRODUCTS_VARIABLE, "auto")
    if asked not in (*PRODUCTS, "auto"):
        raise UserError(f"{PRODUCTS_VARIABLE}={asked}: unknown; use auto, mkl or onednn")
    if not eligible or not packing_available():
        return "mkl"
    if recorded in PRODUCTS:
        return recorded
    if asked != "auto":
        return asked
    return "onednn" if onednn_pays(shapes, torch.get_num_threads()) else "mkl"


@functools.cache
def onednn_pays(shapes: tuple[tuple[int, int], ...], threads: int) -> bool:
    """Whether a training step's products (forward and both gradients) of layers of `shapes`
    run clearly faster through oneDNN than through MKL on this CPU (`kernels.onednn_wins`),
    TIMING_ROWS rows a layer; once per process. `threads` is part of the cache key."""
    numbers = torch.Generator().manual_seed(0)  # the run's own random streams stay untouched
    layers = []
    for in_features, out_features in shapes:
        x = torch.randn(TIMING_ROWS, in_features, generator=numbers, requires_grad=True)
        weight = torch.randn(out_features, in_features, generator=numbers, requires_grad=True)
        layers.append((x, weight, torch.zeros(out_features, requires_grad=True)))

    def step(linear) -> None:
        for x, weight, bias in layers:
            linear(x, weight, bias).sum().backward()

    # F.linear looked up at each call, as nn.Linear does
    return onednn_wins(lambda: step(F.linear), lambda: step(onednn_linear))
