"""bench_train's WMT workload (`--vocab N`): attn-mt alone at a size over an N-id vocabulary,
each loss, eager and compiled, on synthetic batches of WMT's lengths (bench/train.py's
docstring says what is timed and reported).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from attn_mt.config.schema import Config
from attn_mt.data.batching import Batch
from attn_mt.model.transformer import Transformer, build_model
from attn_mt.precision import DTYPES
from attn_mt.train.setup import make_optimizer
from bench.common import (
    compiled_graphs,
    matmul_peak,
    padding_share,
    peak_memory,
    spec_peak,
    step_flops,
    timed_window,
)
from bench.steps import PlainStep, Turn, compile_step, trainer_step, trainer_updates
from bench.workload import timed_batches, wmt_lengths

LOSSES = ("logits", "projected")  # --loss: the plain step's full logits, the Trainer's update
Key = tuple[str, bool]  # (loss, compiled)


def wmt_turn(
    model: Transformer, optimizer, cfg: Config, precision: str, key: Key, warm: list[Batch]
) -> Turn:
    """The turn of `key` in `precision`: `projected` the Trainer's own update, `logits` the
    plain step (the Trainer's cannot run the full logits), all with one `optimizer`; compiled
    where asked (the Trainer's update compiles here, on `warm`'s first batch)."""
    loss, compiled = key
    t = cfg.train
    if loss == "logits":
        return PlainStep(model, optimizer, DTYPES[precision], t.clip_norm, t.label_smoothing,
                         compiled)  # fmt: skip
    step = trainer_step(model, t, precision, optimizer)
    if compiled:
        compile_step(step, warm[:1])
    return functools.partial(trainer_updates, step)


def warmed_up(turns: dict, keys: Sequence[Key], build, warm: list[Batch], device, label: str):
    """Each turn of `keys` (`build(key)` makes one not in `turns` yet: a compiled one compiles
    here) over `warm`: {key: (seconds, graphs made)}."""
    done = {}
    for key in keys:
        made, start = compiled_graphs(), time.perf_counter()
        if key not in turns:
            turns[key] = build(key)
        timed_window(functools.partial(turns[key], warm), device)
        done[key] = (time.perf_counter() - start, compiled_graphs() - made)
        print(f"warm-up {label} {key[0]} compiled={key[1]}: {done[key][0]:.1f} s, "
              f"{done[key][1]} graph(s)", flush=True)  # fmt: skip
    return done


def bench_wmt(args, cfg: Config, device, hardware: str, precisions: list[str], warmup: int) -> None:
    """The WMT workload: the model over a `--vocab` vocabulary on synthetic pairs of WMT's
    lengths (bench/workload.py) in attn-mt's length buckets. Per batch size and precision,
    each loss is timed on one batch shape repeated (the ceiling) and on bucketed batches of
    varied shapes (the real figure), all in turns; each window synchronises at its edges only."""
    m, vocab = cfg.model, args.vocab
    per_window = args.batches or (1 if args.quick and device.type == "cpu" else 40)
    rounds = args.rounds or (1 if args.quick else 3)
    losses = list(LOSSES) if args.loss == "both" else [args.loss]
    compiled = {"off": (False,), "on": (True,), "both": (False, True)}[args.compile]
    keys = [(loss, c) for loss in losses for c in compiled]
    lengths = wmt_lengths(args.pairs)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg, vocab, vocab).to(device).train()
    optimizer = make_optimizer(model, cfg.train)
    print(f"model d={m.d_model} {m.encoder_layers}+{m.decoder_layers} layers d_ff={m.d_ff}, "
          f"vocab {vocab}; {args.pairs:,} synthetic pairs, source mean "
          f"{lengths[:, 0].mean():.1f} tokens (99.9th pct {np.quantile(lengths[:, 0], 0.999):.0f}),"
          f" target mean {lengths[:, 1].mean():.1f}")  # fmt: skip
    print(f"{warmup} warm-up updates per loss, {rounds} round(s) of {per_window}-update windows")
    results: list[dict[str, Any]] = []
    peaks: dict[str, float] = {}
    turns: dict[str, dict[Key, Turn]] = {name: {} for name in precisions}
    for batch_tokens in args.batch_tokens or [25000]:
        shapes, warm = timed_batches(lengths, vocab, batch_tokens, per_window, warmup, device)
        for name in precisions:
            if name not in peaks:
                peaks[name] = matmul_peak(DTYPES[name], device, 1.0 if args.quick else 3.0)
            build = functools.partial(wmt_turn, model, optimizer, cfg, name, warm=warm)
            warm_ups = warmed_up(turns[name], keys, build, warm, device, f"{batch_tokens} {name}")
            rows = timed_rows(turns[name], shapes, rounds, device)
            for (loss, c, kind), (seconds, tokens, mib) in rows.items():
                flops = rounds * sum(step_flops(m, vocab, b) for b in shapes[kind])
                spec = spec_peak(hardware, name) if device.type == "cuda" else None
                results.append({
                    "batch_tokens": batch_tokens, "precision": name, "loss": loss,
                    "compiled": c, "warmup_s": warm_ups[loss, c][0],
                    "graphs": warm_ups[loss, c][1], "shapes": kind,
                    "padding": padding_share(shapes[kind]), "tokens_per_s": tokens / seconds,
                    "step_ms": 1e3 * seconds / (rounds * per_window),
                    "mfu": flops / seconds / peaks[name],
                    "mfu_spec": flops / seconds / spec if spec else None, "peak_mib": mib,
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


def timed_rows(
    turns: dict[Key, Turn], shapes: dict[str, list[Batch]], rounds: int, device
) -> dict[tuple[str, bool, str], tuple[float, int, float | None]]:
    """Every turn on every kind of batches, `rounds` windows in turns (noise hits every loss
    and shape alike): {(loss, compiled, kind): (seconds, target tokens, peak MiB)}; a graph
    compiled in a timed window (its time is not a step's) is warned about."""
    made = compiled_graphs()
    runs: dict[tuple[str, bool, str], list[tuple[tuple[float, int], float | None]]] = {
        (loss, c, kind): [] for loss, c in turns for kind in shapes
    }
    for _ in range(rounds):
        for (loss, c, kind), done in runs.items():
            window = functools.partial(turns[loss, c], shapes[kind])
            done.append(peak_memory(functools.partial(timed_window, window, device), device))
    if compiled_graphs() > made:
        print(f"warning: {compiled_graphs() - made} graph(s) compiled in timed windows")
    figures = {}
    for key, done in runs.items():
        mib = [x for _, x in done if x is not None]
        seconds = sum(s for (s, _), _ in done)
        figures[key] = (seconds, sum(t for (_, t), _ in done), max(mib) if mib else None)
    return figures


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
