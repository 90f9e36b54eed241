"""What the weight EMA (train.ema_decay) costs a training step, measured side by side.

The model of a config (default: the shipped Multi30k de->en one) trains on batches of its
usual shape (random ids; the time of a step does not depend on them) with the Trainer's own
update (`UpdateStep`: its loss, optimizer, clipping and precision); updates with and without
the `WeightEMA` alternate in rounds in this one process, so machine noise hits both alike.
Reports the median step time of each, the median time of `WeightEMA.update()` alone, and the
slowdown in percent.

    python scripts/bench_ema.py [--config FILE] [--rounds 5] [--steps 8]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics

import torch

from attn_mt.config.file import load_config
from attn_mt.data.batching import Batch
from attn_mt.model.transformer import build_model
from attn_mt.model.vocab import EOS_ID
from attn_mt.precision import resolve_precision
from attn_mt.train.setup import make_optimizer
from attn_mt.train.state import WeightEMA
from bench.common import DEFAULT_CONFIG, timed_window
from bench.steps import trainer_step, trainer_updates

LENGTH = 24  # tokens per side of a typical Multi30k pair (+ <eos>)


def random_batch(rows: int, vocab: int) -> Batch:
    """`rows` pairs of LENGTH random ids a side, no padding."""
    src = torch.randint(EOS_ID + 1, vocab, (rows, LENGTH))
    tgt = torch.randint(EOS_ID + 1, vocab, (rows, LENGTH + 1))
    return Batch(src, tgt[:, :-1], tgt[:, 1:], list(range(rows)), rows * LENGTH)


def main(argv: list[str] | None = None) -> None:
    """Parse the options, time the updates with and without the EMA, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per turn")
    parser.add_argument("--decay", type=float, default=0.998)
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    device = torch.device("cpu")
    precision = resolve_precision(cfg.train.precision, device)
    torch.manual_seed(0)
    vocab = cfg.tokenizer.vocab_size
    model = build_model(cfg, vocab, vocab).train()
    optimizer = make_optimizer(model, cfg.train)
    ema = WeightEMA(model, args.decay)
    steps = {
        "without": trainer_step(model, cfg.train, precision, optimizer),
        "with": trainer_step(model, cfg.train, precision, optimizer, ema),
    }
    rows = cfg.train.batch_tokens // LENGTH
    batch = [random_batch(rows, vocab)]

    def seconds(run) -> float:
        return timed_window(run, device)[0]

    for _ in range(3):
        seconds(functools.partial(trainer_updates, steps["with"], batch))  # warm-up
    times: dict[str, list[float]] = {"without": [], "with": [], "update": []}
    for _ in range(args.rounds):
        for name, step in steps.items():
            times[name] += [seconds(functools.partial(trainer_updates, step, batch))
                            for _ in range(args.steps)]  # fmt: skip
        times["update"] += [seconds(ema.update) for _ in range(args.steps)]
    median = {name: statistics.median(values) for name, values in times.items()}
    slowdown = 100 * (median["with"] / median["without"] - 1)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params:,} parameters, precision {precision}, {rows} x {LENGTH} tokens a batch")
    print(f"step without EMA  {1000 * median['without']:8.1f} ms (median)")
    print(f"step with EMA     {1000 * median['with']:8.1f} ms")
    print(f"EMA update alone  {1000 * median['update']:8.2f} ms")
    print(f"slowdown          {slowdown:8.2f} %  (update alone: "
          f"{100 * median['update'] / median['without']:.2f} % of a step)")  # fmt: skip
    figures = {k: round(1000 * v, 3) for k, v in median.items()}
    print(json.dumps({"bench": "ema", "parameters": params, "precision": precision,
                      "median_ms": figures, "slowdown_percent": round(slowdown, 2)}))  # fmt: skip
