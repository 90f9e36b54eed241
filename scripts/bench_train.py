"""Training speed side by side: attn-mt's Transformer against `torch.nn.Transformer`.

Both models get the same sizes, vocabulary, real Multi30k batches (attn-mt's own batching),
optimizer, loss and precision, and are timed in turns in this one process, so machine noise
hits both alike. Reported per precision: target tokens/s of each, their ratio (> 1: attn-mt is
faster), peak memory of one step, and model FLOPs utilisation (MFU) against a matrix-product
peak measured here in the same dtype and, on a known GPU, against its data-sheet peak. Also
the padding share of the batches. fp32 on CUDA uses TF32, as training does (train.tf32). fp32
on the CPU adds attn-mt with its linear layers' products through oneDNN (`attn_mt.train.onednn`,
what training picks where it pays) beside the same model through MKL.

    python scripts/bench_train.py            # fp32 and bf16 (CPU), or fp32/bf16 on CUDA
    python scripts/bench_train.py --quick    # a smaller sample, under a minute on 2 cores
    python scripts/bench_train.py --device cuda --size base   # transformer-base sizes

With `--vocab N`, the WMT workload instead: attn-mt alone at `--size` over an N-id vocabulary,
on synthetic pairs of WMT's sentence lengths (scripts/wmt_shape.py) in attn-mt's own length
buckets of each `--batch-tokens`; after `--warmup` updates, each `--loss` (the full logits
and `projected_loss`, in turns) timed on one batch shape repeated (the ceiling) and on
bucketed batches of varied shapes (the real figure): tokens/s, step time, peak memory, MFU
against the measured and the data-sheet peak.

    python scripts/bench_train.py --size base --vocab 32000 --batch-tokens 12500 25000
    python scripts/bench_train.py --size base --vocab 32000 --compile both   # eager and compiled

With `--compile on|both`, each loss also through `torch.compile` as train.compile runs the
update (batch dims marked dynamic), its compilation in the warm-up: its seconds and the graphs
it made reported (each graph break and each recompile adds one; on the CPU every dropout breaks
the graph); a graph made in a timed window, a recompile there, is warned about.

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `attn-mt` sets it

from wmt_shape import timed_batches, wmt_lengths  # noqa: E402

from attn_mt import distributed  # noqa: E402
from attn_mt.configfile import config_from_dict, load_config  # noqa: E402
from attn_mt.data.batching import Batch, collate, length_batches  # noqa: E402
from attn_mt.decode.packed import PackedLinear, packing_available  # noqa: E402
from attn_mt.model.positions import sinusoidal_table  # noqa: E402
from attn_mt.model.transformer import (  # noqa: E402
    Transformer,
    build_model,
    feed_forward_dropout,
)
from attn_mt.model.vocab import PAD_ID  # noqa: E402
from attn_mt.precision import (  # noqa: E402
    configure_kernels,
    inductor_options,
    set_cuda_environment,
)
from attn_mt.train.corpus import training_data  # noqa: E402
from attn_mt.train.loss import SmoothedObjective, label_smoothed_loss  # noqa: E402
from attn_mt.train.onednn import route_through_onednn  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ONEDNN = "attn-mt oneDNN"  # the fp32 CPU row of attn-mt with its products through oneDNN
STREAM = "attn-mt bf16 stream"  # the bf16 row of attn-mt with train.bf16_stream
SIZES = {  # --size: model keys over the config's (Vaswani et al.'s transformer-base and -big)
    "config": {},
    "base": {"d_model": 512, "heads": 8, "encoder_layers": 6, "decoder_layers": 6, "d_ff": 2048},
    "big": {"d_model": 1024, "heads": 16, "encoder_layers": 6, "decoder_layers": 6, "d_ff": 4096},
}
# Data-sheet dense peaks in TFLOP/s (no sparsity): (bf16/fp16 tensor cores, fp32 as TF32 where
# the card has it). The first name found in the device's name counts, so longer names first.
SPEC_TFLOPS = {
    "H100 PCIe": (756.0, 378.0),
    "H200": (989.0, 494.0),
    "H100": (989.0, 494.0),
    "B200": (2250.0, 1100.0),
    "A100": (312.0, 156.0),
    "L40S": (362.0, 183.0),
    "L4": (121.0, 60.0),
    "A10": (125.0, 62.5),
    "V100": (125.0, 15.7),  # fp16 only: bf16 is emulated
    "T4": (65.0, 8.1),
}


def wmt_dropout() -> dict[str, float | None]:
    """The WMT workload's dropout keys, configs/wmt14_en_de_base.yaml's: Vaswani et al.'s base
    (0.1 on embeddings and sub-layer outputs only; big en-de used 0.3)."""
    m = load_config(ROOT / "configs" / "wmt14_en_de_base.yaml").model
    return {k: getattr(m, k) for k in ("dropout", "activation_dropout", "attention_dropout")}


def spec_peak(hardware: str, precision: str) -> float | None:
    """The data-sheet peak FLOP/s of a known GPU in `precision`, or None."""
    for name, (half, fp32) in SPEC_TFLOPS.items():
        if name in hardware:
            return 1e12 * (fp32 if precision == "fp32" else half)
    return None


class Reference(nn.Module):
    """`torch.nn.Transformer` dressed as attn-mt's model `m` (a `model:` config): the same
    embeddings (shared, scaled, sinusoidal positions, dropout), pre- or post-norm, the same
    dropout on sub-layer outputs, the feed-forward hidden layer and attention weights, tied
    output projection."""

    table: torch.Tensor  # the sinusoidal positions, a buffer

    def __init__(self, m, vocab: int):
        super().__init__()
        self.d = d = m.d_model
        self.embedding = nn.Embedding(vocab, d, padding_idx=PAD_ID)
        nn.init.normal_(self.embedding.weight, std=d**-0.5)
        self.dropout = nn.Dropout(m.dropout)
        with warnings.catch_warnings():  # pre-norm: its inference fast path is off; we train
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            self.core = nn.Transformer(d, m.heads, m.encoder_layers, m.decoder_layers, m.d_ff,
                                       m.dropout, batch_first=True,
                                       norm_first=m.norm == "pre")  # fmt: skip
        for layer in self.core.modules():
            if isinstance(layer, nn.TransformerEncoderLayer | nn.TransformerDecoderLayer):
                layer.dropout.p = feed_forward_dropout(m)  # between linear1 and linear2
            elif isinstance(layer, nn.MultiheadAttention):
                layer.dropout = m.attention_dropout
        self.register_buffer("table", sinusoidal_table(1024, d), persistent=False)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids) * math.sqrt(self.d) + self.table[: ids.size(1)]
        return self.dropout(x)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        length = tgt_in.size(1)  # True: may not attend (boolean, as the padding masks are)
        causal = torch.ones(length, length, dtype=torch.bool, device=src.device).triu(1)
        hidden = self.core(
            self.embed(src),
            self.embed(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src == PAD_ID,
            tgt_key_padding_mask=tgt_in == PAD_ID,
            memory_key_padding_mask=src == PAD_ID,
            tgt_is_causal=True,
        )
        return hidden @ self.embedding.weight.T  # (B, T, V)


def step_flops(model_cfg, vocab: int, batch: Batch) -> float:
    """Matrix-product FLOPs of one training step (forward + backward = 3x forward) on the
    padded batch, counting what the kernels compute: projections, attention, output layer."""
    d, f = model_cfg.d_model, model_cfg.d_ff
    rows, s = batch.src.shape
    t = batch.tgt_in.size(1)
    src_tok, tgt_tok = rows * s, rows * t
    enc = src_tok * (4 * d * d + 2 * d * f) + rows * 2 * s * s * d  # projections, QK^T and AV
    dec = tgt_tok * (4 * d * d + 2 * d * d + 2 * d * f) + rows * 2 * t * t * d  # self + q,o
    dec += src_tok * 2 * d * d + rows * 2 * t * s * d  # cross K, V on the memory; cross scores
    forward = 2 * (model_cfg.encoder_layers * enc + model_cfg.decoder_layers * dec)
    forward += 2 * tgt_tok * d * vocab  # output projection
    return 3.0 * forward


def matmul_peak(dtype: torch.dtype, device: torch.device, seconds: float) -> float:
    """FLOP/s of large square matrix products in `dtype`: the peak MFU is measured against,
    the best over sizes a training step's products reach (a GPU is far from its peak at 2048).
    On the CPU in float32, the faster of MKL (`a @ b`, what nn.Linear runs) and oneDNN with a
    prepacked weight (what decoding uses where it pays): on some CPUs MKL reaches far less
    than oneDNN, so MKL alone would overstate the MFU (docs/performance.md)."""
    sizes = (4096, 8192) if device.type == "cuda" else (1024, 2048)
    products = []
    for n in sizes:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        products.append((n, functools.partial(torch.matmul, a, b)))
        if device.type == "cpu" and dtype == torch.float32 and packing_available():
            layer = nn.Linear(n, n, bias=False)
            layer.weight.data = b.t().contiguous()  # layer(a) = a @ b
            products.append((n, functools.partial(PackedLinear(layer), a)))
    best = 0.0
    for n, product in products:
        stop = time.perf_counter() + seconds / len(products)
        while time.perf_counter() < stop:
            sync(device)
            start = time.perf_counter()
            for _ in range(4):
                product()
            sync(device)
            best = max(best, 4 * 2 * n**3 / (time.perf_counter() - start))
    return best


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device, dtype: torch.dtype):
    """The trainer's autocast: on for bf16/fp16, off for fp32."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)


def logits_loss(model: nn.Module, batch: Batch, dtype: torch.dtype) -> torch.Tensor:
    """The full (B, T, V) logits, then the label-smoothed loss (the trainer's loss before
    `projected_loss`; `nn.Transformer`'s here)."""
    with autocast(batch.src.device, dtype):
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
    return label_smoothed_loss(logits, batch.tgt_out, 0.1)[0]


def compiled_graphs() -> int:
    """The graphs torch.compile has made in this process so far (pieces between graph breaks;
    each recompile adds more)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def loss_step(loss: str, model: Transformer, compiled: bool):
    """The step of `--loss` `loss` (`step(model, batch, dtype)` -> the summed loss), through
    torch.compile as train.compile runs the update when `compiled`. `projected` is the trainer's
    loss as it runs it: the `SmoothedObjective` (`projected_loss` on the decoder's final states,
    no (B, T, V) logits kept; compiled, the loss stays out of the model's graph, its chunks
    compiled on their own, `SmoothedObjective.fuse`, and the token count is read outside)."""
    options = inductor_options(next(model.parameters()).device.type) or None  # the trainer's
    if loss == "logits":
        return torch.compile(logits_loss, options=options) if compiled else logits_loss
    objective = SmoothedObjective(model, 0.1)
    module = torch.compile(objective, options=options) if compiled else objective
    objective.fuse(compiled)

    def step(_model: Transformer, batch: Batch, dtype: torch.dtype) -> torch.Tensor:
        objective.tokens = batch.num_tgt_tokens
        with autocast(batch.src.device, dtype):
            return module(batch.src, batch.tgt_in, batch.tgt_out)[0]

    return step


LOSSES = ("logits", "projected")  # --loss


def train_steps(model: nn.Module, optimizer, batches: list[Batch], device, dtype,
                loss_of=logits_loss) -> int:  # fmt: skip
    """One update per batch, as attn-mt's trainer does it; returns target tokens seen. The
    device is synchronised once, at the end."""
    tokens = 0
    for batch in batches:
        loss = loss_of(model, batch, dtype)
        tokens += batch.num_tgt_tokens
        (loss / batch.num_tgt_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync(device)
    return tokens


def peak_memory(run, device: torch.device) -> tuple[object, float | None]:
    """`run()`'s result and the MiB it adds at its peak: CUDA's allocator counter (read on
    the host: no synchronisation), or on Linux the process's high-water mark (VmHWM, reset
    through /proc/self/clear_refs)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        result = run()
        return result, (torch.cuda.max_memory_allocated(device) - base) / 2**20
    try:
        Path("/proc/self/clear_refs").write_text("5")
        base = _status_kib("VmRSS")
        result = run()
        return result, (_status_kib("VmHWM") - base) / 1024
    except OSError:
        return run(), None


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def padding_share(batches: list[Batch]) -> float:
    """Pad positions / all positions over source and target of `batches`."""
    total = sum(b.src.numel() + b.tgt_out.numel() for b in batches)
    pads = sum(int((b.src == PAD_ID).sum() + (b.tgt_out == PAD_ID).sum()) for b in batches)
    return pads / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "multi30k_de_en.yaml"))
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
    parser.add_argument("--loss", choices=("both", *LOSSES), default="both",
                        help="with --vocab: the full logits, projected_loss, or both")  # fmt: skip
    parser.add_argument("--compile", choices=("off", "on", "both"), default="off",
                        help="with --vocab: eager, torch.compile'd, or both in turns")  # fmt: skip
    args = parser.parse_args()
    set_cuda_environment()  # the allocator the trainer runs with, before CUDA starts

    if args.threads:
        torch.set_num_threads(args.threads)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    cfg = load_config(args.config)
    raw = cfg.to_dict()
    raw["model"].update(SIZES[args.size])
    if args.vocab:
        raw["model"].update(wmt_dropout())
    elif args.batch_tokens:
        if len(args.batch_tokens) > 1:
            parser.error("several --batch-tokens only with --vocab")
        raw["train"]["batch_tokens"] = args.batch_tokens[0]
    cfg = config_from_dict(raw)
    configure_kernels(deterministic=False, tf32=cfg.train.tf32)  # as the trainer sets them
    precisions = (args.precisions or "fp32,bf16").split(",")
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    print(f"{hardware}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    if args.vocab:
        quick_cpu = args.quick and device.type == "cpu"
        warmup = args.warmup if args.warmup is not None else (1 if quick_cpu else 20)
        if warmup < 20 and not quick_cpu:
            parser.error("fewer than 20 warm-up updates only with --quick on the CPU")
        bench_wmt(args, cfg, device, hardware, precisions, warmup)
    else:
        bench_multi30k(args, cfg, device, hardware, precisions)


def bench_multi30k(args, cfg, device: torch.device, hardware: str, precisions: list[str]) -> None:
    """attn-mt against `nn.Transformer` on real Multi30k batches, in turns."""
    m = cfg.model
    per_turn = args.batches or (2 if args.quick else 4)
    rounds = args.rounds or (2 if args.quick else 4)

    # Real batches: Multi30k through attn-mt's tokenizer, filter and length bucketing.
    src_tok, tgt_tok, corpus = training_data(cfg, None, distributed.World())
    rows = length_batches(corpus.lengths, cfg.train.batch_tokens)
    generator = torch.Generator().manual_seed(0)
    pick = torch.randperm(len(rows), generator=generator)[: per_turn * 2].tolist()
    batches = [collate(corpus.src_ids, corpus.tgt_ids, rows[i]).to(device) for i in pick]
    warm, timed = batches[:per_turn], batches[per_turn:]
    sample = [collate(corpus.src_ids, corpus.tgt_ids, rows[i]) for i in range(0, len(rows), 7)]
    padding = padding_share(sample)
    vocab = tgt_tok.vocab_size

    torch.manual_seed(cfg.train.seed)
    ours: Transformer = build_model(cfg, src_tok.vocab_size, vocab).to(device)
    ref = Reference(m, vocab).to(device)
    models = {"attn-mt": ours, "nn.Transformer": ref}
    flops = sum(step_flops(m, vocab, b) for b in timed)
    print(f"model d={m.d_model} {m.encoder_layers}+{m.decoder_layers} layers d_ff={m.d_ff}, "
          f"vocab {vocab}, batches of {cfg.train.batch_tokens} tokens, "
          f"padding {100 * padding:.1f}%")  # fmt: skip

    results = []
    for name in precisions:
        dtype = DTYPES[name]
        peak = matmul_peak(dtype, device, 1.0 if args.quick else 3.0)
        timed_models = dict(models)
        if name == "fp32" and device.type == "cpu" and packing_available():
            timed_models[ONEDNN] = route_through_onednn(copy.deepcopy(ours))
        if name == "bf16":
            stream = copy.deepcopy(ours)  # a Transformer, as typed (the dict holds Modules)
            stream.bf16_stream = True
            timed_models[STREAM] = stream
        optimizers = {
            k: torch.optim.AdamW(v.parameters(), lr=1e-4, fused=True)
            for k, v in timed_models.items()
        }
        seconds, tokens = dict.fromkeys(timed_models, 0.0), dict.fromkeys(timed_models, 0)
        memory = {}
        for key, model in timed_models.items():  # first calls count for none: a kernel's
            model.train()  # set-up for a new batch shape can cost more than the update itself
            train_steps(model, optimizers[key], warm[:1] + timed, device, dtype)
        for key, model in timed_models.items():  # peak memory of a few steps
            run = functools.partial(train_steps, model, optimizers[key], warm, device, dtype)
            memory[key] = peak_memory(run, device)[1]
        for _ in range(rounds):  # interleaved turns: noise hits every model alike
            for key, model in timed_models.items():
                start = time.perf_counter()
                tokens[key] += train_steps(model, optimizers[key], timed, device, dtype)
                seconds[key] += time.perf_counter() - start
        spec = spec_peak(hardware, name) if device.type == "cuda" else None
        row: dict[str, Any] = {"precision": name, "matmul_peak_tflops": peak / 1e12,
                               "spec_peak_tflops": spec / 1e12 if spec else None}  # fmt: skip
        for key in timed_models:
            achieved = rounds * flops / seconds[key]
            row[key] = {
                "tokens_per_s": tokens[key] / seconds[key],
                "mfu": achieved / peak,
                "mfu_spec": achieved / spec if spec else None,
                "peak_mib": memory[key],
            }
        row["ratio"] = row["attn-mt"]["tokens_per_s"] / row["nn.Transformer"]["tokens_per_s"]
        if ONEDNN in row:  # > 1: oneDNN's products train faster than MKL's
            row["onednn_gain"] = row[ONEDNN]["tokens_per_s"] / row["attn-mt"]["tokens_per_s"]
        if STREAM in row:  # > 1: the bf16 residual stream trains faster than the fp32 one
            row["stream_gain"] = row[STREAM]["tokens_per_s"] / row["attn-mt"]["tokens_per_s"]
        results.append(row)

    print_multi30k(results, list(models))
    print(json.dumps({
        "bench": "train", "hardware": hardware, "device": device.type,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "size": args.size, "d_model": m.d_model, "layers": [m.encoder_layers, m.decoder_layers],
        "batch_tokens": cfg.train.batch_tokens, "padding": padding,
        "results": results,
    }))  # fmt: skip


def print_multi30k(results: list[dict], names: list[str]) -> None:
    """bench_multi30k's table: each precision's models (`names`, then the oneDNN and bf16
    stream variants where timed), their ratios under them."""
    print(f"\n{'precision':<10}{'model':<20}{'tgt tok/s':>11}{'MFU':>8}{'MFU spec':>10}"
          f"{'peak MiB':>10}{'matmul peak':>14}")  # fmt: skip
    for row in results:
        for key in (k for k in (*names, ONEDNN, STREAM) if k in row):
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


def bench_wmt(args, cfg, device: torch.device, hardware: str, precisions: list[str],
              warmup: int) -> None:  # fmt: skip
    """The WMT workload: the model over a `--vocab` vocabulary on synthetic pairs of WMT's
    lengths (scripts/wmt_shape.py) in attn-mt's length buckets. Per batch size and precision,
    each loss is timed on one batch shape repeated (the ceiling) and on bucketed batches of
    varied shapes (the real figure), all in turns; each window synchronises at its edges only."""
    m, vocab = cfg.model, args.vocab
    per_window = args.batches or (1 if args.quick and device.type == "cpu" else 40)
    rounds = args.rounds or (1 if args.quick else 3)
    losses = list(LOSSES) if args.loss == "both" else [args.loss]
    compiled = {"off": (False,), "on": (True,), "both": (False, True)}[args.compile]
    lengths = wmt_lengths(args.pairs)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg, vocab, vocab).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    steps = {(loss, c): loss_step(loss, model, c) for loss in losses for c in compiled}
    print(f"model d={m.d_model} {m.encoder_layers}+{m.decoder_layers} layers d_ff={m.d_ff}, "
          f"vocab {vocab}; {args.pairs:,} synthetic pairs, source mean "
          f"{lengths[:, 0].mean():.1f} tokens (99.9th pct {np.quantile(lengths[:, 0], 0.999):.0f}),"
          f" target mean {lengths[:, 1].mean():.1f}")  # fmt: skip
    print(f"{warmup} warm-up updates per loss, {rounds} round(s) of {per_window}-update windows")

    results, peaks = [], {}
    for batch_tokens in args.batch_tokens or [25000]:
        shapes, warm = timed_batches(lengths, vocab, batch_tokens, per_window, warmup, device)
        flops = {kind: sum(step_flops(m, vocab, b) for b in batches)
                 for kind, batches in shapes.items()}  # fmt: skip
        for name in precisions:
            dtype = DTYPES[name]
            if name not in peaks:
                peaks[name] = matmul_peak(dtype, device, 1.0 if args.quick else 3.0)
            spec = spec_peak(hardware, name) if device.type == "cuda" else None
            warm_s, graphs = {}, {}
            for key, step in steps.items():  # a compiled step compiles here
                made = compiled_graphs()
                warm_s[key] = timed_window(model, optimizer, warm, device, dtype, step)[0]
                graphs[key] = compiled_graphs() - made
                print(f"warm-up {batch_tokens} {name} {key[0]} compiled={key[1]}: "
                      f"{warm_s[key]:.1f} s, {graphs[key]} graph(s)", flush=True)  # fmt: skip
            made = compiled_graphs()
            runs: dict[tuple[str, bool, str], list[tuple[Any, float | None]]] = {
                (loss, c, kind): [] for loss, c in steps for kind in shapes
            }
            for _ in range(rounds):  # in turns: noise hits every loss and shape alike
                for (loss, c, kind), done in runs.items():
                    window = functools.partial(timed_window, model, optimizer, shapes[kind],
                                               device, dtype, steps[loss, c])  # fmt: skip
                    done.append(peak_memory(window, device))
            if compiled_graphs() > made:  # a timed window compiled: its time is not a step's
                print(f"warning: {compiled_graphs() - made} graph(s) compiled in timed windows")
            for (loss, c, kind), done in runs.items():
                seconds = sum(s for (s, _), _ in done)
                mib = [x for _, x in done if x is not None]
                achieved = rounds * flops[kind] / seconds
                results.append({
                    "batch_tokens": batch_tokens, "precision": name, "loss": loss,
                    "compiled": c, "warmup_s": warm_s[loss, c], "graphs": graphs[loss, c],
                    "shapes": kind,
                    "padding": padding_share(shapes[kind]),
                    "tokens_per_s": sum(t for (_, t), _ in done) / seconds,
                    "step_ms": 1e3 * seconds / (rounds * per_window),
                    "mfu": achieved / peaks[name], "mfu_spec": achieved / spec if spec else None,
                    "peak_mib": max(mib) if mib else None,
                    "matmul_peak_tflops": peaks[name] / 1e12,
                    "spec_peak_tflops": spec / 1e12 if spec else None,
                })  # fmt: skip
                print("result", json.dumps(results[-1]), flush=True)  # kept if a timeout stops us

    ratios, compile_ratios = print_wmt(results, peaks, hardware, device)
    print(json.dumps({
        "bench": "train", "workload": "wmt", "hardware": hardware, "device": device.type,
        "threads": torch.get_num_threads(), "torch": torch.__version__, "size": args.size,
        "d_model": m.d_model, "layers": [m.encoder_layers, m.decoder_layers], "vocab": vocab,
        "pairs": args.pairs, "warmup": warmup, "rounds": rounds, "window": per_window,
        "results": results, "projected_over_logits": ratios,
        "compiled_over_eager": compile_ratios,
    }))  # fmt: skip


def print_wmt(results: list[dict], peaks: dict, hardware: str, device) -> tuple[dict, dict]:
    """bench_wmt's table, its peaks and its ratios (projected over logits, compiled over
    eager); returns the ratios."""
    print(f"\n{'tokens':>7} {'prec':<5}{'loss':<10}{'mode':<9}{'shapes':<9}{'pad':>6}"
          f"{'tgt tok/s':>10}{'ms/step':>9}{'MFU':>7}{'MFU spec':>9}{'peak MiB':>9}"
          f"{'warm-up s':>10}")  # fmt: skip
    for r in results:
        mem = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "n/a"
        spec_mfu = f"{100 * r['mfu_spec']:.1f}%" if r["mfu_spec"] is not None else "n/a"
        mode = "compiled" if r["compiled"] else "eager"
        print(f"{r['batch_tokens']:>7} {r['precision']:<5}{r['loss']:<10}{mode:<9}"
              f"{r['shapes']:<9}{100 * r['padding']:>5.1f}%{r['tokens_per_s']:>10.0f}"
              f"{r['step_ms']:>9.0f}{100 * r['mfu']:>6.1f}%{spec_mfu:>9}{mem:>9}"
              f"{r['warmup_s']:>10.1f}")  # fmt: skip
    for name in peaks:
        spec = spec_peak(hardware, name) if device.type == "cuda" else None
        print(
            f"{name} peaks: measured matmul {peaks[name] / 1e9:,.0f} GFLOP/s, data sheet "
            + (f"{spec / 1e9:,.0f} GFLOP/s" if spec else "n/a")
        )
    ratios = loss_ratios(results, "loss", "logits", "projected")
    compile_ratios = loss_ratios(results, "compiled", False, True)
    for what, found in (("projected / logits", ratios), ("compiled / eager", compile_ratios)):
        for label, ratio in found.items():
            print(
                f"{what}, {label}: speed x{ratio['speed']:.2f}, peak memory "
                + (f"x{ratio['memory']:.2f}" if ratio["memory"] is not None else "n/a")
            )
    return ratios, compile_ratios


def timed_window(model, optimizer, batches, device, dtype, loss_of) -> tuple[float, int]:
    """Seconds and non-pad target tokens of one update per batch, the device synchronised only
    before and after."""
    sync(device)
    start = time.perf_counter()
    tokens = train_steps(model, optimizer, batches, device, dtype, loss_of)  # syncs at its end
    return time.perf_counter() - start, tokens


def loss_ratios(results: list[dict], field: str, base: object, other: object) -> dict[str, dict]:
    """Rows whose `field` is `other` over their twins whose `field` is `base` (all else equal:
    batch size, precision, shapes, loss, compiled): speed and peak memory."""
    keys = ("batch_tokens", "precision", "shapes", "loss", "compiled")
    by_key = {tuple(r[k] for k in keys): r for r in results}
    ratios = {}
    for key, r in by_key.items():
        twin = by_key.get(tuple(base if k == field else v for k, v in zip(keys, key, strict=True)))
        if r[field] != other or twin is None:
            continue
        mem = r["peak_mib"] / twin["peak_mib"] if r["peak_mib"] and twin["peak_mib"] else None
        named = [
            str(v) for k, v in zip(keys, key, strict=True) if k not in (field, "compiled", "loss")
        ]
        named += [r["loss"]] if field != "loss" else []
        named += ["compiled"] if field != "compiled" and r["compiled"] else []
        ratios[" ".join(named)] = {"speed": r["tokens_per_s"] / twin["tokens_per_s"], "memory": mem}
    return ratios


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
