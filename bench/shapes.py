"""Decoding speed of model shapes before training any: how the student presets were sized.

A model's decoding time depends on its shape, not on its training, once every sentence is
decoded to the same length. Each shape here gets a checkpoint with the reference run's config,
tokenizers and decode settings but fresh random weights, its output row for <eos> zeroed so
that no search stops early, and decode.max_len_a 1, max_len_b 1: every sentence is decoded to
its source length plus one, for every shape alike. Each (shape, search, variant) is then timed
by `bench/decode.py`'s own row, in a process of its own: `Translator.translate` over the first
--limit test sentences after a warm-up, float32 (prepack "auto") and int8, greedy and beam.
Speeds are given as each shape's time over the first shape's, the reference.

    python scripts/bench_shapes.py --model runs/multi30k_de_en \
        --shape teacher=256,4,3,3,1024 --shape student=256,4,6,1,1024 --limit 300

A shape is NAME=d_model,heads,encoder_layers,decoder_layers,d_ff. What a shape's quality will
be is for training to say (docs/results.md, "Distillation").
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

import attn_mt
from attn_mt.checkpoint import load_checkpoint, save_checkpoint, tokenizers_from
from attn_mt.config.file import config_from_dict
from attn_mt.model.transformer import build_model
from attn_mt.model.vocab import EOS_ID
from bench.common import cpu_name
from bench.decode import Row, in_child, load_sentences

SHAPE_KEYS = ("d_model", "heads", "encoder_layers", "decoder_layers", "d_ff")
VARIANTS = ("float32", "int8")


def parse_shape(text: str) -> tuple[str, dict[str, int]]:
    """NAME=d_model,heads,encoder_layers,decoder_layers,d_ff -> (NAME, model keys)."""
    name, _, sizes = text.partition("=")
    numbers = sizes.split(",")
    if not name or len(numbers) != len(SHAPE_KEYS) or not all(n.isdigit() for n in numbers):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give NAME=d_model,heads,encoder_layers,decoder_layers,d_ff"
        )
    return name, dict(zip(SHAPE_KEYS, map(int, numbers), strict=True))


def random_checkpoint(
    state: dict[str, Any], shape: dict[str, int], out: Path, seed: int = 0
) -> Path:
    """A checkpoint of the reference checkpoint `state`'s config, tokenizers and decode
    settings with the model keys of `shape`, random weights (seeded), <eos> never chosen,
    every output its source's length + 1 (module docstring). Written to `out`."""
    raw = copy.deepcopy(state["config"])
    raw["model"].update(shape)
    raw["decode"].update(max_len_a=1.0, max_len_b=1)
    cfg = config_from_dict(raw)  # the shape checked as a config file is
    src_tok, tgt_tok = tokenizers_from(state, "the reference checkpoint")
    torch.manual_seed(seed)
    model = build_model(cfg, src_tok.vocab_size, tgt_tok.vocab_size)
    with torch.no_grad():
        model.output.weight[EOS_ID].zero_()  # a tied embedding row: <eos> is never an input
    kept = {k: v for k, v in state.items() if k not in ("model", "ema", "optimizer")}
    save_checkpoint({**kept, "config": raw, "model": model.state_dict(), "ema": None}, out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="The reference run folder or .pt file.")
    parser.add_argument("--shape", type=parse_shape, action="append", required=True,
                        help="NAME=d_model,heads,encoder_layers,decoder_layers,d_ff "
                        "(repeatable; the first is the reference)")  # fmt: skip
    parser.add_argument("--limit", type=int, default=300, help="Test sentences timed.")
    parser.add_argument("--beam", type=int, default=5, help="Beam size of the beam rows.")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    lines, _ = load_sentences(argparse.Namespace(src=None, limit=args.limit, quick=False),
                              attn_mt.load(args.model, device="cpu", prepack=False))  # fmt: skip
    print(f"{cpu_name()}, torch {torch.__version__}, {args.threads} thread(s); "
          f"{len(lines)} sentences, each decoded to its source length (+1)")  # fmt: skip
    times: dict[tuple[str, str, int], float] = {}
    reference = load_checkpoint(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        lines_file = Path(tmp) / "lines.txt"
        lines_file.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        for name, shape in args.shape:
            ckpt = random_checkpoint(reference, shape, Path(tmp) / f"{name}.pt")
            row_args = argparse.Namespace(model=ckpt, threads=args.threads)
            for beam in (1, args.beam):
                for variant in VARIANTS:
                    row = in_child(Row("attn-mt", beam, variant), row_args, lines_file, None)
                    times[name, variant, beam] = row.seconds
    report(args, times, len(lines))


def report(args: argparse.Namespace, times: dict[tuple[str, str, int], float], count: int) -> None:
    """Sentences/s of every shape and row, and its time over the reference shape's."""
    first = args.shape[0][0]
    print(f"{'shape':<12} {'sizes':<22} {'search':<7} {'variant':<8} {'sent/s':>7} "
          f"{'time / ' + first:>14}")  # fmt: skip
    for name, shape in args.shape:
        sizes = ",".join(str(shape[k]) for k in SHAPE_KEYS)
        for beam in (1, args.beam):
            for variant in VARIANTS:
                seconds = times[name, variant, beam]
                search = "greedy" if beam == 1 else f"beam {beam}"
                print(f"{name:<12} {sizes:<22} {search:<7} {variant:<8} {count / seconds:>7.1f} "
                      f"{seconds / times[first, variant, beam]:>13.2f}x")  # fmt: skip
    sys.stdout.flush()
