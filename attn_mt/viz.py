"""Heatmaps of what a model attends to, and of the sinusoidal positional encoding.

Figures are `matplotlib.figure.Figure` objects built without pyplot, so nothing here needs a
display or touches pyplot's global state; PNGs are written by matplotlib's Agg renderer.

Shape legend: L layers, H heads, R rows (queries), C columns (keys), P positions, D model width.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import torch
from matplotlib.figure import Figure

from attn_mt.checkpoint import load_checkpoint, model_from
from attn_mt.data.batching import source_batch
from attn_mt.decode.load import load
from attn_mt.decode.translator import Translator
from attn_mt.errors import UserError
from attn_mt.fileio import atomic_write
from attn_mt.model.attention import record_attention
from attn_mt.model.positions import POSITIONS
from attn_mt.model.vocab import BOS_ID, EOS_ID

KINDS = ("cross", "encoder", "decoder")
# (rows, columns) of each kind. A decoder row is labelled by the piece it outputs (y1 .. yn
# `</s>`), as other toolkits draw it; decoder columns by the decoder's input (`<s>` y1 .. yn).
AXES = {"cross": ("output", "source"), "encoder": ("source",) * 2, "decoder": ("output", "target")}
AXIS_LABELS = {"source": "source", "output": "output", "target": "target (decoder input)"}
DEFAULT_PE_WIDTH = 256
MAX_PE_VALUES = 10_000_000  # a table larger than this would not fit the picture, nor memory


@dataclass
class AttentionMaps:
    """Attention weights of every layer and head for one sentence and its translation.

    Rows are queries, columns keys: for `cross` the decoder positions, labelled by the pieces
    they output (y1 .. yn `</s>`), attending the source pieces (x1 .. xm `</s>`); for `encoder`
    source x source; for `decoder` output x decoder input (`<s>` y1 .. yn; causal, so the upper
    triangle is zero).
    """

    kind: str
    source: str
    translation: str
    rows: list[str]  # R piece labels (y axis)
    columns: list[str]  # C piece labels (x axis)
    weights: torch.Tensor  # (L, H, R, C) float32 on the CPU; each row sums to 1


def attention_maps(
    translator: Translator, text: str, kind: str = "cross", tgt_lang: str | None = None
) -> AttentionMaps:
    """Translate `text` greedily, then collect the `kind` attention of every layer and head from
    one teacher-forced forward pass over the source and that translation (float32)."""
    _check_kind(kind)
    if not text.strip():
        raise UserError("--text is empty: give a sentence to translate")
    [best] = translator.translate_nbest([text], beam=1, tgt_lang=tgt_lang)[0]
    [ids] = translator.encode([text], tgt_lang, warn=False)  # as the search read it (it warned)
    src = source_batch([ids], [0]).to(translator.device)  # (1, S)
    src_ids = src[0].tolist()
    tgt_ids = [BOS_ID] + best.tokens  # the decoder input that produced the translation
    model = translator.model  # in eval mode: the weights carry no dropout
    if kind == "encoder":
        modules = [layer.self_attn for layer in model.encoder_layers]
    else:
        decoder = model.decoder_layers
        modules = [layer.cross_attn if kind == "cross" else layer.self_attn for layer in decoder]
    tgt = torch.tensor([tgt_ids], device=translator.device)  # (1, T)
    with torch.no_grad(), record_attention(model):
        model(src, tgt)
        weights = torch.stack([m.recorded_weights()[0] for m in modules])  # (L, H, R, C)
    pieces = {
        "source": translator.src_tokenizer.pieces(src_ids),
        "target": translator.tgt_tokenizer.pieces(tgt_ids),
        "output": translator.tgt_tokenizer.pieces([*best.tokens, EOS_ID]),
    }
    rows, columns = (pieces[side] for side in AXES[kind])
    return AttentionMaps(kind, text.strip(), best.text, rows, columns, weights.float().cpu())


def plot_attention(
    maps: AttentionMaps, layer: int | None = None, head: int | None = None
) -> Figure:
    """A grid of heatmaps, one per (layer, head) — or only `layer` / `head` when given — with
    key pieces along x, query pieces along y, and one shared 0..1 colour bar."""
    num_layers, num_heads, num_rows, num_cols = maps.weights.shape
    stack = "encoder" if maps.kind == "encoder" else "decoder"
    layers = _select("--layer", layer, num_layers, f"{stack} layers")
    heads = _select("--head", head, num_heads, "heads")
    # Cells shrink for long sentences so a panel stays under ~8 inches; fonts follow them.
    cell = min(0.3, 8.0 / max(num_rows, num_cols))
    fontsize = max(4.0, min(9.0, 30 * cell))
    panel_w, panel_h = max(2.0, cell * num_cols) + 1.2, max(2.0, cell * num_rows) + 1.4
    figure = Figure(
        figsize=(len(heads) * panel_w + 1.2, len(layers) * panel_h + 0.6), layout="constrained"
    )
    axes = figure.subplots(len(layers), len(heads), squeeze=False)
    y_name, x_name = (AXIS_LABELS[side] for side in AXES[maps.kind])
    for i, layer_index in enumerate(layers):
        for j, head_index in enumerate(heads):
            ax = axes[i][j]
            image = ax.imshow(
                maps.weights[layer_index, head_index].numpy(),
                cmap="viridis",
                vmin=0.0,
                vmax=1.0,
                aspect="auto",
                interpolation="nearest",
            )
            ax.set_title(f"layer {layer_index} head {head_index}", fontsize=fontsize + 1)
            ax.set_xticks(range(num_cols), maps.columns, rotation=90, fontsize=fontsize)
            ax.set_yticks(range(num_rows), maps.rows, fontsize=fontsize)
            if i == len(layers) - 1:
                ax.set_xlabel(x_name, fontsize=fontsize + 1)
            if j == 0:
                ax.set_ylabel(y_name, fontsize=fontsize + 1)
    figure.colorbar(image, ax=axes, label="attention weight", shrink=0.9)
    title = f"{maps.kind} attention: {maps.source}  →  {maps.translation}"
    # Wrapped to the figure's width (a 10-point character is about 0.08 inch wide), so a
    # one-panel figure shows the whole sentence.
    width = max(int(figure.get_figwidth() / 0.08), 20)
    figure.suptitle(textwrap.fill(title, width), fontsize=10)
    return figure


def plot_attention_file(
    model_path: str | Path,
    text: str,
    out: str | Path,
    kind: str = "cross",
    layer: int | None = None,
    head: int | None = None,
    device: str = "auto",
    tgt_lang: str | None = None,
) -> Figure:
    """Load a checkpoint, plot the `kind` attention for `text` (translated into `tgt_lang`, for
    a multilingual model) and write it to `out` as PNG."""
    _check_kind(kind)  # fail before the (slow) load on options that cannot work
    if not text.strip():
        raise UserError("--text is empty: give a sentence to translate")
    figure = plot_attention(
        attention_maps(load(model_path, device=device), text, kind, tgt_lang), layer, head
    )
    save_png(figure, out)
    return figure


def validation_attention_figure(
    translator: Translator, sentence: str, tgt_lang: str | None = None
) -> Figure:
    """The last decoder layer's cross-attention heads for one sentence, for TensorBoard at every
    validation. One row: a grid of every layer's heads made validation slow at base size
    (docs/history.md, "GPU sessions"); `attn-mt attention` draws them all."""
    maps = attention_maps(translator, sentence, "cross", tgt_lang)
    return plot_attention(maps, layer=maps.weights.size(0) - 1)


def positional_encoding_figure(positions: int = 100, d_model: int = DEFAULT_PE_WIDTH) -> Figure:
    """Heatmap of the sinusoidal table P (positions x dimensions): each column pair is one
    frequency, from fast (left) to slow (right), P[i, 2j] = sin(i / 10000^(2j/d))."""
    _check_positions(positions)
    if d_model < 2 or d_model % 2:
        raise UserError(f"--d-model {d_model}: must be an even number of at least 2")
    if positions * d_model > MAX_PE_VALUES:
        raise UserError(
            f"--positions {positions} --d-model {d_model}: {positions * d_model:,} values are "
            f"too many to draw; at most {MAX_PE_VALUES:,}"
        )
    table = POSITIONS["sinusoidal"](d_model, positions).encodings(positions)  # (P, D)
    return _position_figure(table, "sinusoidal")


def _position_figure(table: torch.Tensor, kind: str) -> Figure:
    """Heatmap of a position table (P, D) of `kind` (a key of model.POSITIONS)."""
    figure = Figure(figsize=(10, 6), layout="constrained")
    ax = figure.add_subplot()
    limit = float(table.abs().max()) if kind != "sinusoidal" else 1.0
    image = ax.imshow(table.numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
    ax.set_ylabel("position")
    d_model = table.size(1)
    if kind == "sinusoidal":
        ax.set_xlabel("encoding dimension (even: sin, odd: cos; frequency falls to the right)")
        title = (
            f"sinusoidal positional encoding, d_model = {d_model}: "
            "P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(i / 10000^(2j/d))"
        )
    else:
        ax.set_xlabel("embedding dimension")
        title = f"{kind} positional embeddings, d_model = {d_model}"
    ax.set_title(title, fontsize=10)
    figure.colorbar(image, ax=ax, label="value")
    return figure


def plot_positional_encoding_file(
    out: str | Path,
    model: str | Path | None = None,
    positions: int = 100,
    d_model: int | None = None,
) -> Figure:
    """Write the positional-encoding heatmap to `out` (PNG): the table of the checkpoint
    `model` when given (sinusoidal or learned, as the model adds it), else the sinusoidal
    table of width `d_model` (default 256)."""
    if model is None:
        width = DEFAULT_PE_WIDTH if d_model is None else d_model  # 0 is refused, not 256
        figure = positional_encoding_figure(positions, width)
    else:
        _check_positions(positions)
        network, cfg = model_from(load_checkpoint(model), model)
        width = cfg.model.d_model
        if d_model is not None and d_model != width:
            raise UserError(
                f"--d-model {d_model}: the model's width is {width}; give one of the two"
            )
        table = network.src_embed.positions.encodings(positions)  # (P, D)
        figure = _position_figure(table, cfg.model.positions)
    save_png(figure, out)
    return figure


def save_png(figure: Figure, out: str | Path) -> None:
    """Write `figure` as a PNG of exactly figsize x dpi pixels (through `atomic_write`)."""
    out = Path(out)
    try:
        with atomic_write(out) as handle:
            figure.savefig(handle, format="png", dpi=figure.dpi)
    except OSError as err:
        raise UserError(f"{out}: cannot write the image ({err.strerror or err})") from None


def _check_positions(positions: int) -> None:
    if positions < 1:
        raise UserError(f"--positions {positions}: must be at least 1")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise UserError(f"--kind {kind}: choose one of {', '.join(KINDS)}")


def _select(option: str, index: int | None, count: int, what: str) -> list[int]:
    """[index] after a range check, or every index when None."""
    if index is None:
        return list(range(count))
    if not 0 <= index < count:
        raise UserError(
            f"{option} {index}: out of range; this model's {what} are numbered 0 to {count - 1}"
        )
    return [index]
