"""`scripts/bench_align.py`: the alignment error rate of each way to read word alignments off
a model's cross-attention, against hand-made gold alignments.

Each gold pair's reference is forced through the decoder (the alignment of a given target,
as AER is defined), and every reading is scored: each decoder layer and the mean of all, each
head and the mean of the heads, the rows of the step that chose each target piece (shift 0)
or of the step after it, where the piece is the decoder's input (shift 1; Chen et al., 2020's
Shift-Att). AER = 1 - 2 |A & G| / (|A| + |G|), every gold link sure (Och & Ney, 2003); lower
is better. The gold file is one pair a line: source, target and Pharaoh links `i-j` (source
word i, target word j, from 0, words split at whitespace), separated by TABs.

    python scripts/bench_align.py --model RUN [--gold tests/data/align_de_en.tsv]

Prints a row per reading, best first, and the AER of what `--alignment` reads; the last line
is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

import attn_mt
from attn_mt.data.ids import target_ids
from attn_mt.decode.alignment import (
    Alignment,
    alignment_error_rate,
    cross_attention,
    layer_attention,
    layer_index,
    output_words,
    source_words,
    word_alignment,
)

GOLD = Path(__file__).resolve().parents[1] / "tests" / "data" / "align_de_en.tsv"
MEAN, MAX = "mean", "max"  # the layer or head field of a mean over all, the largest head


@dataclass(frozen=True)
class GoldPair:
    """One hand-aligned sentence pair: its source and target text and their links."""

    source: str
    target: str
    links: Alignment


def read_gold(path: Path) -> list[GoldPair]:
    """The pairs of a gold file (source TAB target TAB links), each link checked to name
    words the two sentences have."""
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        source, target, links = line.split("\t")
        pair = GoldPair(source, target, [parse_link(link) for link in links.split()])
        words = len(source.split()), len(target.split())
        if not all(i < words[0] and j < words[1] for i, j in pair.links):
            raise ValueError(f"{path}:{number}: a link names a word the pair does not have")
        pairs.append(pair)
    return pairs


def parse_link(text: str) -> tuple[int, int]:
    """`i-j` as (i, j)."""
    i, j = text.split("-")
    return int(i), int(j)


def readings_aer(translator: attn_mt.Translator, gold: list[GoldPair]) -> list[dict]:
    """Every reading's AER on `gold`, best first: a row each of layer (or the mean of all),
    head (or their mean or largest weight), shift and aer; then the row of what
    `--alignment` reads (`cross_attention` at decode.alignment_layer, shift 0)."""
    lead = len(translator.language_prefix(None))
    sources = translator.encode([p.source for p in gold], None)
    targets = target_ids(translator.tgt_tokenizer, [p.target for p in gold])
    words = [
        (
            source_words(translator.src_tokenizer, p.source, s[lead:]),
            output_words(translator.tgt_tokenizer, t),
        )
        for p, s, t in zip(gold, sources, targets, strict=True)
    ]

    def aer(attention: torch.Tensor, shift: int) -> float:  # attention: (B, T, S)
        found = [
            word_alignment(a[:, lead:], src, out, shift)
            for a, (src, out) in zip(attention, words, strict=True)
        ]
        return round(alignment_error_rate(found, [p.links for p in gold]), 4)

    depth = min(len(m.decoder_layers) for m in translator.models)
    att = layer_attention(translator.models, sources, targets, range(depth))  # (L, B, H, T, S)
    layers = {**{str(i): w for i, w in enumerate(att)}, MEAN: att.mean(dim=0)}  # (B, H, T, S)
    rows = []
    for layer, weights in layers.items():
        heads = {str(h): w for h, w in enumerate(weights.unbind(1))}  # (B, T, S)
        heads |= {MEAN: weights.mean(1), MAX: weights.amax(1)}
        for head, attention in heads.items():
            rows += [
                {"layer": layer, "head": head, "shift": s, "aer": aer(attention, s)} for s in (0, 1)
            ]
    named = translator.config.decode.alignment_layer
    used = cross_attention(translator.models, sources, targets, named)
    name = MEAN if named is None else str(layer_index(translator.models, named))
    rows.sort(key=lambda row: row["aer"])
    return [*rows, {"layer": name, "head": MEAN, "shift": 0, "aer": aer(used, 0)}]


def main(argv: list[str] | None = None) -> None:
    """Parse the options, score every reading, print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a run folder or checkpoint")
    parser.add_argument("--gold", type=Path, default=GOLD, help="source TAB target TAB links")
    args = parser.parse_args(argv)
    torch.set_num_threads(min(torch.get_num_threads(), 4))
    translator = attn_mt.load(args.model, device="cpu")
    gold = read_gold(args.gold)
    *rows, used = readings_aer(translator, gold)
    print(f"{len(gold)} pairs, {sum(len(p.links) for p in gold)} gold links; AER, lower is better")
    print("layer  head  shift  AER")
    for row in rows:
        print(f"{row['layer']:>5}  {row['head']:>4}  {row['shift']:>5}  {row['aer']:.4f}")
    print(f"--alignment (layer {used['layer']}, head mean, shift 0): AER {used['aer']:.4f}")
    print(json.dumps({"pairs": len(gold), "alignment": used["aer"], "readings": rows}))
