"""Training speed side by side: attn-mt's Transformer against `torch.nn.Transformer`.

attn-mt's turns time the Trainer's own update (`UpdateStep`: its loss, which never keeps the
(B, T, V) logits, AdamW, clipping); `nn.Transformer`'s time the plain step (the Trainer's
update cannot train it: bench/steps.py), its full logits and the same label-smoothed loss,
optimizer and clipping. Both get the same sizes, vocabulary, real Multi30k batches (attn-mt's
own batching) and precision, and are timed in turns in this one process, so machine noise
hits both alike. Reported per precision: target tokens/s of each, their ratio (> 1: attn-mt
is faster), peak memory of one step, and model FLOPs utilisation (MFU) against a
matrix-product peak measured here in the same dtype and, on a known GPU, against its
data-sheet peak. Also the padding share of the batches. fp32 on CUDA uses TF32, as training
does (train.tf32). fp32 on the CPU adds attn-mt with its linear layers' products through
oneDNN (`attn_mt.kernels.route_through_onednn`, what training picks where it pays) beside the
same model through MKL.

    python scripts/bench_train.py            # fp32 and bf16 (CPU), or fp32/bf16 on CUDA
    python scripts/bench_train.py --quick    # a smaller sample, under a minute on 2 cores
    python scripts/bench_train.py --device cuda --size base   # transformer-base sizes

With `--vocab N`, the WMT workload instead: attn-mt alone at `--size` over an N-id vocabulary,
on synthetic pairs of WMT's lengths (bench/workload.py) in attn-mt's own length buckets of
each `--batch-tokens`; after `--warmup` updates, each `--loss` (`logits`: the full logits
through the plain step; `projected`: the Trainer's own update, its `projected_loss`; in turns)
timed on one batch shape repeated (the ceiling) and on bucketed batches of varied shapes (the
real figure): tokens/s, step time, peak memory, MFU against the measured and the data-sheet
peak.

    python scripts/bench_train.py --size base --vocab 32000 --batch-tokens 12500 25000
    python scripts/bench_train.py --size base --vocab 32000 --compile both   # eager and compiled

With `--compile on|both`, each loss also through `torch.compile` (the Trainer's update
compiled as train.compile compiles it, batch dims marked dynamic; the logits' step with its
loss in one graph), its compilation in the warm-up: its seconds and the graphs it made
reported (each graph break and each recompile adds one; on the CPU every dropout breaks the
graph); a graph made in a timed window, a recompile there, is warned about.

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
from collections.abc import Sequence
from typing import Any

import torch

from attn_mt import distributed
from attn_mt.config.schema import Config
from attn_mt.data.batching import Batch, collate, length_batches
from attn_mt.data.corpus import training_data
from attn_mt.kernels import packing_available, route_through_onednn
from attn_mt.model.transformer import Transformer, build_model
from attn_mt.precision import DTYPES, configure_kernels, set_cuda_environment
from attn_mt.train.setup import make_optimizer
from bench import train_wmt
from bench.common import (
    DEFAULT_CONFIG,
    SIZES,
    hardware_name,
    matmul_peak,
    padding_share,
    peak_memory,
    spec_peak,
    step_flops,
    timed_window,
)
from bench.reference import Reference
from bench.steps import PlainStep, Turn, trainer_step, trainer_updates
from bench.workload import sized_config

ONEDNN = "attn-mt oneDNN"  # the fp32 CPU row of attn-mt with its products through oneDNN
STREAM = "attn-mt bf16 stream"  # the bf16 row of attn-mt with train.bf16_stream
MODELS = ("attn-mt", "nn.Transformer")  # the two rows of every precision


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    """The arguments, and their parser (for the errors found later)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--quick", action="store_true", help="fewer, smaller measurements")
    parser.add_argument("--precisions", default=None, help="e.g. fp32,bf16 (default: both)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--batches", type=int, default=None, help="timed batches per turn")
    parser.add_argument("--rounds", type=int, default=None, help="turns per model")
    parser.add_argument("--batch-tokens", type=int, nargs="+", default=None,
                        help="tokens per batch; with --vocab several sizes, in turn")  # fmt: skip
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument("--size", choices=tuple(SIZES), default="config",
                        help="Vaswani et al.: base d=512, big d=1024")  # fmt: skip
    parser.add_argument("--vocab", type=int, default=None,
                        help="the WMT workload: synthetic pairs of WMT's lengths over this "
                        "many ids (e.g. 32000) instead of Multi30k")  # fmt: skip
    parser.add_argument("--pairs", type=int, default=4_500_000,
                        help="synthetic pairs bucketed (WMT14 en-de: 4.5M)")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=None,
                        help="warm-up updates per loss with --vocab (default and least 20; "
                        "--quick on the CPU: 1)")  # fmt: skip
    parser.add_argument("--loss", choices=("both", *train_wmt.LOSSES), default="both",
                        help="with --vocab: the full logits, projected_loss, or both")  # fmt: skip
    parser.add_argument("--compile", choices=("off", "on", "both"), default="off",
                        help="with --vocab: eager, torch.compile'd, or both in turns")  # fmt: skip
    return parser.parse_args(argv), parser


def main(argv: list[str] | None = None) -> None:
    """Parse the options and time the workload they name."""
    args, parser = parse(argv)
    set_cuda_environment()  # the allocator the trainer runs with, before CUDA starts
    if args.threads:
        torch.set_num_threads(args.threads)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    train: dict[str, Any] = {}
    if not args.vocab and args.batch_tokens:
        if len(args.batch_tokens) > 1:
            parser.error("several --batch-tokens only with --vocab")
        train["batch_tokens"] = args.batch_tokens[0]
    cfg = sized_config(args.config, args.size, wmt=bool(args.vocab), **train)
    configure_kernels(deterministic=False, tf32=cfg.train.tf32)  # as the trainer sets them
    precisions = (args.precisions or "fp32,bf16").split(",")
    hardware = hardware_name(device)
    print(f"{hardware}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    if args.vocab:
        quick_cpu = args.quick and device.type == "cpu"
        warmup = args.warmup if args.warmup is not None else (1 if quick_cpu else 20)
        if warmup < 20 and not quick_cpu:
            parser.error("fewer than 20 warm-up updates only with --quick on the CPU")
        train_wmt.bench_wmt(args, cfg, device, hardware, precisions, warmup)
    else:
        bench_multi30k(args, cfg, device, hardware, precisions)


def multi30k_batches(
    cfg: Config, per_turn: int, device: torch.device
) -> tuple[list[Batch], list[Batch], float, tuple[int, int]]:
    """Real batches: Multi30k through attn-mt's tokenizer, filter and length bucketing.
    Returns the warm-up and the timed batches (`per_turn` each, on `device`), the padding
    share of every seventh batch of the corpus, and the (source, target) vocabulary sizes."""
    src_tok, tgt_tok, corpus = training_data(cfg, None, distributed.World())
    rows = length_batches(corpus.lengths, cfg.train.batch_tokens)
    generator = torch.Generator().manual_seed(0)
    pick = torch.randperm(len(rows), generator=generator)[: per_turn * 2].tolist()
    batches = [collate(corpus.src_ids, corpus.tgt_ids, rows[i]).to(device) for i in pick]
    sample = [collate(corpus.src_ids, corpus.tgt_ids, rows[i]) for i in range(0, len(rows), 7)]
    vocabs = (src_tok.vocab_size, tgt_tok.vocab_size)
    return batches[:per_turn], batches[per_turn:], padding_share(sample), vocabs


def multi30k_turns(
    ours: Transformer, ref: Reference, cfg: Config, precision: str, device: torch.device
) -> dict[str, Turn]:
    """The turns of one precision: attn-mt's update and nn.Transformer's plain step, each with
    a fresh optimizer; fp32 on the CPU adds attn-mt through oneDNN, bf16 the bf16 stream."""
    t = cfg.train
    reference = PlainStep(ref, make_optimizer(ref, t), DTYPES[precision], t.clip_norm,
                          t.label_smoothing)  # fmt: skip
    models = {"attn-mt": ours}
    if precision == "fp32" and device.type == "cpu" and packing_available():
        models[ONEDNN] = onednn = copy.deepcopy(ours)
        route_through_onednn(onednn)  # in place: its linear layers' products through oneDNN
    if precision == "bf16":
        models[STREAM] = stream = copy.deepcopy(ours)
        stream.bf16_stream = True
    turns: dict[str, Turn] = {
        key: functools.partial(trainer_updates, trainer_step(model, t, precision))
        for key, model in models.items()
    }
    return {"attn-mt": turns.pop("attn-mt"), "nn.Transformer": reference, **turns}


def timed_turns(
    turns: dict[str, Turn], warm: list[Batch], timed: list[Batch], rounds: int, device
) -> dict[str, tuple[float, int, float | None]]:
    """Each turn's seconds and target tokens over `rounds` interleaved windows of `timed` (noise
    hits every model alike), and its peak MiB over `warm`, after a first pass over both that
    counts for none (a kernel's set-up for a new batch shape can cost more than the update)."""
    for turn in turns.values():
        turn(warm[:1] + timed)
    memory = {key: peak_memory(functools.partial(turn, warm), device)[1]
              for key, turn in turns.items()}  # fmt: skip
    seconds, tokens = dict.fromkeys(turns, 0.0), dict.fromkeys(turns, 0)
    for _ in range(rounds):
        for key, turn in turns.items():
            took, done = timed_window(functools.partial(turn, timed), device)
            seconds[key] += took
            tokens[key] += done
    return {key: (seconds[key], tokens[key], memory[key]) for key in turns}


def bench_multi30k(args, cfg: Config, device, hardware: str, precisions: Sequence[str]) -> None:
    """attn-mt against `nn.Transformer` on real Multi30k batches, in turns."""
    m = cfg.model
    per_turn = args.batches or (2 if args.quick else 4)
    rounds = args.rounds or (2 if args.quick else 4)
    warm, timed, padding, (src_vocab, vocab) = multi30k_batches(cfg, per_turn, device)
    torch.manual_seed(cfg.train.seed)
    ours: Transformer = build_model(cfg, src_vocab, vocab).to(device).train()
    ref = Reference(m, vocab).to(device).train()
    flops = sum(step_flops(m, vocab, b) for b in timed)
    print(f"model d={m.d_model} {m.encoder_layers}+{m.decoder_layers} layers d_ff={m.d_ff}, "
          f"vocab {vocab}, batches of {cfg.train.batch_tokens} tokens, "
          f"padding {100 * padding:.1f}%")  # fmt: skip
    results = []
    for name in precisions:
        peak = matmul_peak(DTYPES[name], device, 1.0 if args.quick else 3.0)
        turns = multi30k_turns(ours, ref, cfg, name, device)
        figures = timed_turns(turns, warm, timed, rounds, device)
        spec = spec_peak(hardware, name) if device.type == "cuda" else None
        row: dict[str, Any] = {"precision": name, "matmul_peak_tflops": peak / 1e12,
                               "spec_peak_tflops": spec / 1e12 if spec else None}  # fmt: skip
        for key, (seconds, tokens, mib) in figures.items():
            achieved = rounds * flops / seconds
            row[key] = {"tokens_per_s": tokens / seconds, "mfu": achieved / peak,
                        "mfu_spec": achieved / spec if spec else None, "peak_mib": mib}  # fmt: skip
        row["ratio"] = row["attn-mt"]["tokens_per_s"] / row["nn.Transformer"]["tokens_per_s"]
        if ONEDNN in row:  # > 1: oneDNN's products train faster than MKL's
            row["onednn_gain"] = row[ONEDNN]["tokens_per_s"] / row["attn-mt"]["tokens_per_s"]
        if STREAM in row:  # > 1: the bf16 residual stream trains faster than the fp32 one
            row["stream_gain"] = row[STREAM]["tokens_per_s"] / row["attn-mt"]["tokens_per_s"]
        results.append(row)
    print_multi30k(results)
    print(json.dumps({
        "bench": "train", "hardware": hardware, "device": device.type,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "size": args.size, "d_model": m.d_model, "layers": [m.encoder_layers, m.decoder_layers],
        "batch_tokens": cfg.train.batch_tokens, "padding": padding,
        "results": results,
    }))  # fmt: skip


def print_multi30k(results: list[dict]) -> None:
    """bench_multi30k's table: each precision's models (attn-mt and nn.Transformer, then the
    oneDNN and bf16 stream variants where timed), their ratios under them."""
    print(f"\n{'precision':<10}{'model':<20}{'tgt tok/s':>11}{'MFU':>8}{'MFU spec':>10}"
          f"{'peak MiB':>10}{'matmul peak':>14}")  # fmt: skip
    for row in results:
        for key in (k for k in (*MODELS, ONEDNN, STREAM) if k in row):
            r = row[key]
            mem = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "n/a"
            spec_mfu = f"{100 * r['mfu_spec']:.1f}%" if r["mfu_spec"] is not None else "n/a"
            gflops = row["matmul_peak_tflops"] * 1e3
            print(f"{row['precision']:<10}{key:<20}{r['tokens_per_s']:>11.0f}"
                  f"{100 * r['mfu']:>7.1f}%{spec_mfu:>10}{mem:>10}{gflops:>9.0f} GF/s")  # fmt: skip
        print(f"{'':<10}{'ratio':<20}{row['ratio']:>11.2f}")
        if "onednn_gain" in row:
            print(f"{'':<10}{'oneDNN / MKL':<20}{row['onednn_gain']:>11.2f}")
        if "stream_gain" in row:
            print(f"{'':<10}{'stream bf16/fp32':<20}{row['stream_gain']:>11.2f}")
