"""Inference copies of a model's linear layers on the CPU: weights prepacked for oneDNN, and
the attention input projection split by use.

Prepacking. `nn.Linear` multiplies by its weight through MKL's sgemm, which copies the weight
into its own blocked layout at every call (and, on some CPUs, runs far below what oneDNN
reaches there). `PackedLinear` stores the weight already in oneDNN's layout
(`torch.ops.mkldnn._reorder_linear_weight`, the op torch's own compiler uses when it freezes a
CPU model) and multiplies with `torch.ops.mkldnn._linear_pointwise`: the same float32
products. It is much faster on some CPUs and slower on others, so `attn_mt.load` times both
on this CPU (`packing_pays`) and packs where oneDNN wins (`prepack="auto"`, the default;
figures: docs/performance.md). oneDNN builds and keeps a kernel for every number of
input rows it meets, so memory would grow with each new row count: inputs are padded to one of
a few row counts (`padded_rows`). A feed-forward block runs as one `PackedFeedForward`: its
rows padded once for both products, the activation done by oneDNN on the first product's
result (a post-op) instead of as an operation of its own. Where this torch build or CPU has no
such op, `pack` leaves the model as it is.

Splitting. `MultiHeadAttention.in_proj` stacks W_q, W_k and W_v; cross-attention needs only
the W_q rows for the decoder's queries at each step (and the W_k, W_v rows once, for the
encoder output). Training slices the weight; a packed or int8 layer cannot be sliced, so
`InProj` keeps the three uses as three layers: all rows, the Q rows, the K and V rows.
"""

from __future__ import annotations

import functools
import warnings
from typing import TypeVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from attn_mt.errors import UserError
from attn_mt.kernels import onednn_wins, packing_available, remembered
from attn_mt.model.attention import MultiHeadAttention
from attn_mt.model.layers import FeedForward
from attn_mt.model.transformer import Transformer

Model = TypeVar("Model", bound=nn.Module)


class InProj(nn.Module):
    """`in_proj` split by use: `all` (self-attention: Q, K, V from one input), `q` and `kv`
    (cross-attention), each a plain `nn.Linear` copy of those rows that `pack` or
    `quantize` may then replace."""

    def __init__(self, in_proj: nn.Linear):
        super().__init__()
        d_model = in_proj.in_features
        self.all = in_proj
        self.q = _rows(in_proj, 0, d_model)
        self.kv = _rows(in_proj, d_model, 3 * d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.all(x)  # (B, L, 3D)

    def rows(self, x: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """x times blocks first..last-1 (0 = W_q, 1 = W_k, 2 = W_v): (0, 1) or (1, 3)."""
        if (first, last) not in ((0, 1), (1, 3)):
            raise ValueError(f"in_proj blocks {first}..{last - 1}: only Q or K and V are split")
        return self.q(x) if first == 0 else self.kv(x)


def _rows(linear: nn.Linear, first: int, last: int) -> nn.Linear:
    part = nn.Linear(linear.in_features, last - first, bias=linear.bias is not None)
    with torch.no_grad():
        part.weight.copy_(linear.weight[first:last])
        if linear.bias is not None:
            part.bias.copy_(linear.bias[first:last])
    return part


def split_in_proj(model: Model) -> Model:
    """`model`, for inference from now on, with an `InProj` in each attention layer (in place:
    a copy would double the memory at load time)."""
    model.eval()
    for module in model.modules():
        if isinstance(module, MultiHeadAttention) and isinstance(module.in_proj, nn.Linear):
            module.in_proj = InProj(module.in_proj)  # type: ignore[assignment]  # for inference
    return model


# The linear layers an encoder or decoder layer runs at inference (the other `InProj` parts,
# e.g. a self-attention's Q rows alone, are never called).
PACKED_LAYERS = (
    "self_attn.in_proj.all", "self_attn.out_proj", "cross_attn.in_proj.q", "cross_attn.in_proj.kv",
    "cross_attn.out_proj",
)  # fmt: skip
ROW_BLOCK = 16  # the finest row padding; coarser (up to 1/8 of the rows) for larger batches


def padded_rows(rows: int) -> int:
    """`rows` rounded up to a multiple of 16, or of 1/8 to 1/16 of it for 256 rows or more:
    16 sizes up to 256 rows and 8 per doubling above, so oneDNN builds a bounded number of
    kernels."""
    block = max(ROW_BLOCK, 1 << max(rows.bit_length() - 4, 0))
    return -(-rows // block) * block


def _padded(rows: torch.Tensor) -> torch.Tensor:
    """(R, X) rows followed by zero rows up to `padded_rows(R)`: one copy, and only the new rows
    zeroed (`F.pad` fills the whole tensor first)."""
    count = rows.size(0)
    if (total := padded_rows(count)) == count:
        return rows
    out = rows.new_empty(total, rows.size(1))
    out[:count].copy_(rows)
    out[count:].zero_()
    return out


def _on_padded_rows(x: torch.Tensor, product, out_features: int) -> torch.Tensor:
    """`product` over the rows of x (..., in), padded to `padded_rows`; its real rows back in
    x's shape (..., out_features)."""
    rows = x.reshape(-1, x.size(-1))
    return product(_padded(rows))[: rows.size(0)].view(*x.shape[:-1], out_features)


# oneDNN post-ops for the activations of `FeedForward`: the same functions, applied to the
# product inside the kernel ("gelu" with algorithm "none" is the exact, erf form of F.gelu;
# "swish" is x * sigmoid(x), F.silu).
FUSED_ACTIVATIONS = {F.relu: "relu", F.gelu: "gelu", F.silu: "swish"}


class PackedLinear(nn.Module):
    """y = act(x W^T + b) with W held in oneDNN's blocked layout (inference only: no gradient,
    and the packed weight is not in the state dict); `activation` "none", "relu", "gelu" or
    "swish".
    Inputs are padded to `padded_rows` rows."""

    def __init__(self, linear: nn.Linear, activation: str = "none", keep_weight: bool = False):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float().contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        # The plain weight too, for `rows_of` (the output layer's, which a shortlist reads;
        # tied to the target embedding, it is that table, not a copy).
        self.weight = weight if keep_weight else None
        self.bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.activation = activation
        self.algorithm = "none" if activation == "gelu" else ""  # gelu's exact (erf) form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _on_padded_rows(x, self.multiply, self.out_features)

    def multiply(self, rows: torch.Tensor) -> torch.Tensor:
        """(R, in_features) rows, R one of the padded counts -> (R, out_features)."""
        return torch.ops.mkldnn._linear_pointwise(
            rows, self.packed, self.bias, self.activation, [], self.algorithm
        )


class PackedFeedForward(nn.Module):
    """`FeedForward` at inference: W_2 act(W_1 x + b_1) + b_2 with both products prepacked,
    the rows padded once for the two, and the activation fused into the first product."""

    def __init__(self, ff: FeedForward):
        super().__init__()
        self.w_1 = PackedLinear(ff.w_1, FUSED_ACTIVATIONS[ff.activation])
        self.w_2 = PackedLinear(ff.w_2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _on_padded_rows(x, self._multiply, self.w_2.out_features)

    def _multiply(self, rows: torch.Tensor) -> torch.Tensor:
        return self.w_2.multiply(self.w_1.multiply(rows))


TIMING_ROWS = 256  # input rows of the timed block, as many as a decoding step's batch holds


@functools.cache
def packing_pays(d_model: int, d_ff: int, threads: int) -> bool:
    """Whether packing pays for a model of this size on this CPU (`time_packing`), timed once
    per machine: the answer is kept in the user cache (`kernels.remembered`)."""
    question = f"packing pays: d_model {d_model}, d_ff {d_ff}, {threads} threads"
    return remembered(question, lambda: time_packing(d_model, d_ff, threads))


def time_packing(d_model: int, d_ff: int, threads: int) -> bool:
    """Whether the prepacked feed-forward block (`PackedFeedForward`) beats `FeedForward` on
    this CPU by a clear margin (`kernels.onednn_wins`, 3 calls a round), timed here on a block
    of this size (TIMING_ROWS input rows). `threads`: torch's thread count, which the answer
    depends on (the caller's key; the timing runs on the threads torch has).

    The block, not one of its products: it is what `pack` swaps in (the activation fused), and
    a single product's gain can sit at the margin, so that the answer flips from one process
    to the next (docs/decoding.md)."""
    if not packing_available():
        return False
    block = FeedForward(d_model, d_ff, 0.0, "relu").eval()
    fast, x = PackedFeedForward(block), torch.randn(TIMING_ROWS, d_model)
    with torch.no_grad():
        return onednn_wins(lambda: block(x), lambda: fast(x), calls=3)


def pack(model: Transformer) -> Transformer:
    """`model`, for float32 inference on the CPU from now on, with its linear layers
    (`PACKED_LAYERS` and the feed-forward block of every encoder and decoder layer, and the
    output layer) prepacked (in place); unchanged where packing is not available."""
    if not packing_available():
        return model
    model = split_in_proj(model)
    for layer in [*model.encoder, *model.decoder]:
        for name in PACKED_LAYERS:
            parent, _, leaf = name.rpartition(".")
            if (owner := _submodule(layer, parent)) is not None:
                setattr(owner, leaf, PackedLinear(getattr(owner, leaf)))
        layer.ff = PackedFeedForward(layer.ff)
    model.output = PackedLinear(model.output, keep_weight=True)  # type: ignore[assignment]
    return model


def rows_of(layer: nn.Module, rows: torch.Tensor) -> nn.Module:
    """The output rows `rows` (U,) of a linear layer (`nn.Linear`, `PackedLinear` or int8) as a
    layer of their own: its outputs are layer(x)[..., rows]. An int8 layer's rows stay int8;
    a packed layer's rows multiply through nn.Linear (packing them would cost oneDNN a new
    kernel for every shortlist)."""
    if isinstance(layer, nn.Linear | PackedLinear):
        weight, bias = layer.weight, layer.bias
        if weight is None:
            raise ValueError("a PackedLinear made without keep_weight has no rows to take")
        part = nn.Linear(layer.in_features, rows.numel(), bias=bias is not None, device="meta")
        part.weight = nn.Parameter(weight.detach().index_select(0, rows), requires_grad=False)
        if bias is not None:
            part.bias = nn.Parameter(bias.detach().index_select(0, rows), requires_grad=False)
        return part.to(weight.device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notices of torch.ao.quantization
        from torch.ao.nn.quantized.dynamic import Linear as Int8Linear
    if not isinstance(layer, Int8Linear):
        raise TypeError(f"rows_of: not a linear layer: {type(layer).__name__}")
    int8_bias = layer.bias()
    int8_part = Int8Linear(layer.in_features, rows.numel(), bias_=int8_bias is not None)
    int8_part.set_weight_bias(
        layer.weight().index_select(0, rows),
        None if int8_bias is None else int8_bias.index_select(0, rows),
    )
    return int8_part


def _submodule(module: nn.Module, name: str) -> nn.Module | None:
    """module.get_submodule(name), or None where it has none (an encoder layer's cross_attn)."""
    try:
        return module.get_submodule(name)
    except AttributeError:
        return None


# ---------------------------------------------------------------------------------------------
# int8


QUANTIZE_SCHEMES = ("int8",)


def linear_layers(model: nn.Module) -> str:
    """How `model`'s linear layers multiply: "int8" (`quantize`), "prepacked" (`pack`, oneDNN)
    or "plain" (`nn.Linear`), as `GET /info` reports it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notices of torch.ao.quantization
        from torch.ao.nn.quantized.dynamic import Linear as Int8Linear

    for module in model.modules():
        if isinstance(module, Int8Linear):
            return "int8"
        if isinstance(module, PackedLinear):
            return "prepacked"
    return "plain"


def quantize(model: Model, scheme: str, device: torch.device) -> Model:
    """`model` with int8 linear layers, for inference on the CPU (in place)."""
    if scheme not in QUANTIZE_SCHEMES:
        choices = ", ".join(QUANTIZE_SCHEMES)
        raise UserError(f"--quantize {scheme}: unknown; the choice is {choices}")
    if device.type != "cpu":
        raise UserError(f"--quantize {scheme}: runs on the CPU only; add --device cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notices of torch.ao.quantization
        from torch.ao.quantization import quantize_dynamic

        quantized = quantize_dynamic(split_in_proj(model), {nn.Linear}, torch.qint8, inplace=True)
        return cast(Model, quantized)  # `model` itself, its layers replaced
