"""What the weight EMA (train.ema_decay) costs a training step, measured side by side.

The model of a config (default: the shipped Multi30k de->en one) trains on batches of its
usual shape (random ids; the time of a step does not depend on them) with the optimizer and
precision `train` uses; steps with and without `WeightEMA.update()` alternate in rounds in this
one process, so machine noise hits both alike. Reports the median step time of each, the
median time of the update alone, and the slowdown in percent.

    python scripts/bench_ema.py [--config FILE] [--rounds 5] [--steps 8]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `attn-mt` sets it

from attn_mt.configfile import load_config  # noqa: E402
from attn_mt.model.transformer import build_model  # noqa: E402
from attn_mt.precision import DTYPES, autocast_context, resolve_precision  # noqa: E402
from attn_mt.train.ema import WeightEMA  # noqa: E402
from attn_mt.train.loss import label_smoothed_loss  # noqa: E402
from attn_mt.train.state import make_optimizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LENGTH = 24  # tokens per side of a typical Multi30k pair (+ <eos>)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "multi30k_de_en.yaml"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per turn")
    parser.add_argument("--decay", type=float, default=0.998)
    args = parser.parse_args()
    cfg = load_config(args.config)
    device = torch.device("cpu")
    precision = resolve_precision(cfg.train.precision, device)
    torch.manual_seed(0)
    vocab = cfg.tokenizer.vocab_size
    model = build_model(cfg, vocab, vocab).train()
    optimizer = make_optimizer(model, cfg.train)
    ema = WeightEMA(model, args.decay)
    rows = cfg.train.batch_tokens // LENGTH
    src = torch.randint(4, vocab, (rows, LENGTH))
    tgt = torch.randint(4, vocab, (rows, LENGTH + 1))

    def step(with_ema: bool) -> float:
        start = time.perf_counter()
        with autocast_context(device, DTYPES[precision]):
            logits = model(src, tgt[:, :-1])
            loss, _ = label_smoothed_loss(logits, tgt[:, 1:], cfg.train.label_smoothing)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if with_ema:
            ema.update()
        return time.perf_counter() - start

    def update() -> float:
        start = time.perf_counter()
        ema.update()
        return time.perf_counter() - start

    for _ in range(3):
        step(True)  # warm-up
    times: dict[str, list[float]] = {"without": [], "with": [], "update": []}
    for _ in range(args.rounds):
        for name, with_ema in (("without", False), ("with", True)):
            times[name] += [step(with_ema) for _ in range(args.steps)]
        times["update"] += [update() for _ in range(args.steps)]
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


if __name__ == "__main__":
    main()
