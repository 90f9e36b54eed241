"""int8 inference on the CPU (`translate --quantize int8`): torch's dynamic quantization.

Every `nn.Linear` (the attention projections, the feed-forward layers and the output layer)
is replaced by torch's dynamically quantized one: weights stored as int8 with one scale per
tensor, activations quantized per batch on the fly, products in int8 with int32 sums (fbgemm
or oneDNN kernels), results back in float32. Embeddings, layer norms, the softmax and the
search stay in float32. The attention input projections are split by use first
(`attn_mt.packed.InProj`: cross-attention's queries need only the W_q rows). The tied output
layer gets an int8 copy of the embedding matrix; the embedding itself stays float. This is
the API of `torch.ao.quantization`, which torch marks as deprecated in favour of the separate
torchao package; its warnings are silenced here.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from attn_mt.errors import UserError
from attn_mt.packed import split_in_proj

QUANTIZATIONS = ("int8",)


def quantize(model: nn.Module, scheme: str, device: torch.device) -> nn.Module:
    """`model` with int8 linear layers, for inference on the CPU (in place)."""
    if scheme not in QUANTIZATIONS:
        raise UserError(f"--quantize {scheme}: unknown; the choice is {', '.join(QUANTIZATIONS)}")
    if device.type != "cpu":
        raise UserError(f"--quantize {scheme}: runs on the CPU only; add --device cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notices of torch.ao.quantization
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(split_in_proj(model), {nn.Linear}, torch.qint8, inplace=True)
