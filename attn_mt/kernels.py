"""Which CPU kernels multiply a float32 linear layer: MKL (`nn.Linear`) or oneDNN
(`torch.ops.mkldnn._linear_pointwise`). Training (`choose_products`, `OneDnnLinear`) and
decoding (`decode/packed.py`) each ask once per process, by timing both on this CPU, and both
ask the one rule here (`onednn_wins`), so they agree on what "oneDNN pays" means.

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

Shapes: N rows (tokens), I in_features, O out_features.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attn_mt.errors import UserError
from attn_mt.fileio import atomic_write, cache_dir

# oneDNN is chosen where its best round takes < 90% of MKL's: a clear win, not timing noise on
# a shared machine (the measured cases and the answer this margin gives them:
# docs/performance.md, "Training").
ONEDNN_GAIN = 0.9
ROUNDS = 5  # interleaved rounds, after one warm-up call of each
PRODUCTS = ("mkl", "onednn")  # what a run's float32 linear layers multiply through
PRODUCTS_VARIABLE = "ATTN_MT_FP32_PRODUCTS"  # auto (time both), mkl or onednn
TIMING_ROWS = 2048  # rows of the timed layers: about half a training batch's tokens
CHOICES_FILE = "kernel_choices.json"  # in the user cache: timed answers kept per machine


@functools.cache
def packing_available() -> bool:
    """Whether this torch build and CPU run oneDNN's linear product, on a weight reordered
    into its layout (tried once on a small layer, the caller's random stream untouched: a
    training run asks between its seed and its updates)."""
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            layer, x = nn.Linear(8, 4), torch.randn(3, 8)
            packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight, None)
            product = torch.ops.mkldnn._linear_pointwise(x, packed, layer.bias, "none", [], "")
            return torch.allclose(product, layer(x), atol=1e-5)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def remembered(question: str, answer: Callable[[], bool]) -> bool:
    """`answer()` (a timing of kernels), computed once per machine and kept in the user cache's
    CHOICES_FILE under `question` and `machine()`: decoding asks at every start, and the
    answer is the same each time on one machine. Delete the file to time again. An unreadable
    file is timed over; an unwritable cache folder costs the timing each time, never an error."""
    path, key = cache_dir() / CHOICES_FILE, f"{question} on {machine()}"
    try:
        known = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = None
    known = known if isinstance(known, dict) else {}
    if isinstance(known.get(key), bool):
        return known[key]
    known[key] = value = bool(answer())
    try:
        with atomic_write(path) as handle:
            handle.write(json.dumps(known, indent=1, sort_keys=True).encode())
    except OSError:
        pass
    return value


@functools.cache
def machine() -> str:
    """What a kernel timing's answer depends on besides its sizes: the CPU (model and feature
    flags, from /proc/cpuinfo where there is one), the machine type and torch's version."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            wanted = ("model name", "flags", "Features", "CPU part")
            lines = sorted({ln.strip() for ln in cpuinfo if ln.startswith(wanted)})
    except OSError:
        lines = [platform.processor()]
    cpu = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    return f"{platform.machine()} cpu {cpu}, torch {torch.__version__}"


def onednn_wins(mkl: Callable[[], object], onednn: Callable[[], object], calls: int = 1) -> bool:
    """Whether `onednn` runs clearly faster than `mkl` (the same work through each) on this
    CPU: each called once to warm up (oneDNN builds its kernels, MKL its buffers), then ROUNDS
    interleaved rounds of `calls` calls each (a few for a product too small to time alone);
    oneDNN wins where its best round takes < ONEDNN_GAIN of MKL's."""
    best = {mkl: float("inf"), onednn: float("inf")}
    for work in best:
        work()
    for _ in range(ROUNDS):
        for work in best:
            start = time.perf_counter()
            for _ in range(calls):
                work()
            best[work] = min(best[work], time.perf_counter() - start)
    return best[onednn] < ONEDNN_GAIN * best[mkl]


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
