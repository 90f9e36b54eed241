"""A MarianMT model's weights as attn-mt's: read tensor by tensor from `model.safetensors` or
`pytorch_model.bin` (float16 conversions upcast), renamed, and permuted twice.

The model dimension: transformers' sinusoidal table holds sin(i w_j) in column j and cos(i w_j)
in column D/2 + j, where attn-mt's interleaves them (columns 2j, 2j+1): the inverse of the
permutation `export.hf` applies (`model_permutation`). A weight that reads the residual stream
takes its input columns in attn-mt's order (`W[:, inv]`), one that writes it (and every layer
norm) its output rows (`W[inv]`, `b[inv]`); layer norms and dot products do not change under a
permutation, so the model computes the same function.

The vocabulary: the embedding rows and the output bias in attn-mt's order
(`marian_vocab.VocabularyMap`), attn-mt's `<s>` a row of zeros (Marian's decoder starts from
its `<pad>` row, which is zero), the appended pieces `<unk>`'s row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from attn_mt.errors import UserError, named
from attn_mt.export.hf import model_permutation
from attn_mt.export.marian_vocab import VocabularyMap
from attn_mt.model.attention import MultiHeadAttention
from attn_mt.model.layers import FeedForward
from attn_mt.model.transformer import Transformer
from attn_mt.model.vocab import BOS_ID, PAD_ID, UNK_ID

# The output bias of a row that must take no probability (attn-mt's `<s>`, which Marian has
# not; `<pad>` where transformers renormalises without it): exp(-100) vanishes beside any
# other term of a softmax in float32, and, finite, it keeps label smoothing's mean of the
# log-probabilities finite when the model is fine-tuned.
NO_MASS = -100.0

Weights = Callable[[str], torch.Tensor]  # a tensor by its transformers name, float32


def weights_file(folder: Path) -> Path:
    """The folder's weights: model.safetensors, else pytorch_model.bin."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    raise UserError(
        f"{named(folder)}: no model.safetensors or pytorch_model.bin; not a MarianMT folder"
    )


# safetensors' dtype names -> torch's (the float types a MarianMT checkpoint is saved in)
SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "F64": torch.float64}  # fmt: skip


@contextlib.contextmanager
def opened(path: Path) -> Iterator[tuple[set[str], Weights]]:
    """The names in a weights file and a reader of one tensor at a time (as float32). A
    safetensors file is read tensor by tensor with plain reads, not mapped: its pages would
    count in the process's memory as long as the mapping lived, so the import holds about
    one copy of the model (its own) and one tensor."""
    damaged = f"{named(path)}: truncated or damaged; download it again"
    if path.suffix == ".safetensors":
        with open(path, "rb") as handle:
            entries, start = _safetensors_header(handle, path.stat().st_size, damaged)

            def read(name: str) -> torch.Tensor:
                dtype, shape, (begin, end) = entries[name]
                data = bytearray(end - begin)
                handle.seek(start + begin)
                if handle.readinto(data) != len(data):
                    raise UserError(damaged)
                if not data:
                    return torch.zeros(shape)
                return torch.frombuffer(data, dtype=dtype).reshape(shape).float()

            yield set(entries), read
        return
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # a damaged zip or pickle fails anywhere in the reader
        raise UserError(damaged) from None
    if not isinstance(state, dict):
        raise UserError(f"{named(path)}: not a state dict of tensors")
    yield set(state), lambda name: state[name].float()


def _safetensors_header(handle, size: int, damaged: str) -> tuple[dict, int]:
    """A safetensors file's tensors (name -> (dtype, shape, (begin, end) in the data)) and
    where its data start; every entry checked against the file's size."""
    import json
    import math

    prefix = handle.read(8)
    length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
    if not 2 <= length <= size - 8:
        raise UserError(damaged)
    try:
        header = json.loads(handle.read(length))
    except (UnicodeDecodeError, ValueError):
        raise UserError(damaged) from None
    entries = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = SAFETENSORS_DTYPES[entry["dtype"]]
            shape = [int(n) for n in entry["shape"]]
            begin, end = (int(n) for n in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{damaged} (tensor {name})") from None
        itemsize = torch.empty((), dtype=dtype).element_size()
        if end - begin != math.prod(shape) * itemsize or not 0 <= begin <= end <= size - 8 - length:
            raise UserError(damaged)
        entries[name] = (dtype, shape, (begin, end))
    return entries, 8 + length


def embedding_name(names: set[str], side: str) -> str:
    """The name of the encoder's or decoder's embedding (`side`): its own, or the shared one."""
    own = f"model.{side}.embed_tokens.weight"
    return own if own in names else "model.shared.weight"


@torch.no_grad()
def fill(
    model: Transformer,
    read: Weights,
    names: set[str],
    maps: tuple[VocabularyMap, VocabularyMap],
    bias: torch.Tensor,
) -> None:
    """Copy a MarianMT model's weights into `model` (built with the import's config): `maps`
    the source and target vocabularies' permutations, `bias` the output bias in attn-mt's rows
    (`output_bias`; the model has none where it is all zero)."""
    inv = torch.argsort(model_permutation(model.d_model))  # x_attn-mt = h_transformers[inv]

    def reads(layer: nn.Linear, weight: torch.Tensor, bias: torch.Tensor) -> None:
        layer.weight.copy_(weight[:, inv])
        layer.bias.copy_(bias)

    def writes(layer: nn.Linear | nn.LayerNorm, prefix: str) -> None:
        layer.weight.copy_(read(f"{prefix}.weight")[inv])
        layer.bias.copy_(read(f"{prefix}.bias")[inv])

    def attention(attn: MultiHeadAttention, prefix: str) -> None:
        parts = [f"{prefix}.{p}_proj" for p in "qkv"]
        weight = torch.cat([read(f"{p}.weight") for p in parts])  # (3D, D)
        reads(attn.in_proj, weight, torch.cat([read(f"{p}.bias") for p in parts]))
        writes(attn.out_proj, f"{prefix}.out_proj")

    def feed_forward(ff: FeedForward, prefix: str) -> None:
        reads(ff.w_1, read(f"{prefix}.fc1.weight"), read(f"{prefix}.fc1.bias"))
        writes(ff.w_2, f"{prefix}.fc2")

    src_embedding, tgt_embedding = model.src_embed.embedding, model.tgt_embed.embedding
    for embedding, side, mapping in (
        (src_embedding, "encoder", maps[0]),
        (tgt_embedding, "decoder", maps[1]),
    ):
        if side == "decoder" and embedding is src_embedding:
            break  # one matrix for both
        vocabulary_rows(read(embedding_name(names, side)), mapping, embedding.weight)
        for part in embedding.weight.split(4096):  # the columns, a block of rows at a time
            part.copy_(part[:, inv])
    for i, enc in enumerate(model.encoder_layers):
        prefix = f"model.encoder.layers.{i}"
        attention(enc.self_attn, f"{prefix}.self_attn")
        writes(enc.res_attn.norm, f"{prefix}.self_attn_layer_norm")
        feed_forward(enc.ff, prefix)
        writes(enc.res_ff.norm, f"{prefix}.final_layer_norm")
    for i, dec in enumerate(model.decoder_layers):
        prefix = f"model.decoder.layers.{i}"
        attention(dec.self_attn, f"{prefix}.self_attn")
        writes(dec.res_self.norm, f"{prefix}.self_attn_layer_norm")
        attention(dec.cross_attn, f"{prefix}.encoder_attn")
        writes(dec.res_cross.norm, f"{prefix}.encoder_attn_layer_norm")
        feed_forward(dec.ff, prefix)
        writes(dec.res_ff.norm, f"{prefix}.final_layer_norm")
    if model.pre_norm:  # attn-mt's pre-norm exports (Pegasus): a layer norm ends each stack
        assert isinstance(model.encoder_norm, nn.LayerNorm)
        assert isinstance(model.decoder_norm, nn.LayerNorm)
        writes(model.encoder_norm, "model.encoder.layer_norm")
        writes(model.decoder_norm, "model.decoder.layer_norm")
    if model.output.bias is not None:
        model.output.bias.copy_(bias)


def vocabulary_rows(marian: torch.Tensor, mapping: VocabularyMap, out: torch.Tensor) -> None:
    """Write the rows of a Marian tensor into `out` (size, D) in attn-mt's order: `<s>`
    zeros, each piece appended after the vocabulary (the rows beyond `mapping.rows`) `<unk>`'s
    row. Written in place: an embedding of 58k rows is no small copy."""
    unk = mapping.rows[UNK_ID]
    assert unk is not None
    size = out.size(0)
    rows = [0 if m is None else m for m in mapping.rows] + [unk] * (size - len(mapping.rows))
    torch.index_select(marian, 0, torch.tensor(rows), out=out)
    if mapping.rows[BOS_ID] is None:  # Marian's decoder starts from a zero vector
        out[BOS_ID] = 0


def output_bias(
    marian: torch.Tensor | None, mapping: VocabularyMap, rows: int, renormalize: bool
) -> torch.Tensor:
    """The output bias (rows,) in attn-mt's order from Marian's `final_logits_bias` (None: a
    model without one): `<s>` where Marian has none and the appended pieces take no
    probability, nor `<pad>` where transformers renormalises without it."""
    bias = torch.full((rows,), NO_MASS)
    ours = [a for a, m in enumerate(mapping.rows) if m is not None]
    found = torch.zeros(mapping.size) if marian is None else marian
    bias[ours] = found[[mapping.rows[a] for a in ours]]
    if renormalize:
        bias[PAD_ID] = NO_MASS
    return bias
