"""The first-GPU-run checklist's parts (bench/gpu_check.py runs them): a check (`Check`), what
it is given (`Context`) and how it fails (`CheckFailed`), and the checks that run in this
process: the environment, the GPU presets, cached and mask-free decoding, the search's waits
for the device, CPU against CUDA numerics, an update read at once or one later, the peak
memory of an update. Those that run attn-mt or a benchmark in a process of their own are in
bench/check_runs.py. Each check returns its figures; a wrong result is a `CheckFailed`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from unittest import mock

import torch

from attn_mt.config.file import load_config
from attn_mt.config.schema import TrainConfig
from attn_mt.data.batching import Batch
from attn_mt.decode.generate import StepDecoder, generate, max_output_lengths
from attn_mt.decode.search import Beam, Greedy
from attn_mt.model.attention import causal_mask
from attn_mt.model.layers import LayerSpec
from attn_mt.model.transformer import Transformer, build_model
from attn_mt.model.vocab import BOS_ID, PAD_ID
from attn_mt.precision import DTYPES, autocast_context, configure_kernels, resolve_precision
from attn_mt.train import loop
from attn_mt.train.setup import setup
from bench.common import ROOT
from bench.steps import trainer_step, trainer_updates

CONFIGS = ROOT / "configs"
VOCAB = 32000  # a WMT-sized joint vocabulary for the memory figures
BASE = ("model.d_model=512", "model.heads=8", "model.encoder_layers=6",
        "model.decoder_layers=6", "model.d_ff=2048")  # fmt: skip  # transformer-base
Figures = dict[str, Any]


class CheckFailed(Exception):
    """A check ran and found something wrong; the message says what."""


@dataclass
class Check:
    name: str
    run: Callable[[Context], Figures]
    gpu_only: bool


@dataclass
class Context:
    out: Path
    device: torch.device
    deadline: float  # time.monotonic() at which the budget ends
    only: tuple[str, ...] = ()  # words a check's name must hold one of; empty: every check
    results: list[dict[str, Any]] = field(default_factory=list)

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def chosen(self, check: Check) -> bool:
        return not self.only or any(holds(check.name, word) for word in self.only)


def holds(name: str, word: str) -> bool:
    """Whether a check's name holds `word` (an --only word), case ignored."""
    return word.lower() in name.lower()


# ---------------------------------------------------------------------------------------------
# Helpers


def tiny_model(device: torch.device, seed: int = 0) -> Transformer:
    """A 3+3-layer model, random weights, dropout off: the Multi30k config's width on CUDA,
    a quarter of it on the CPU (where it only has to be quick)."""
    torch.manual_seed(seed)
    d_model = 256 if device.type == "cuda" else 64
    layer = LayerSpec(d_model=d_model, heads=4, d_ff=4 * d_model)
    return Transformer(1000, 1000, layer, 3, 3).to(device)


def random_batch(rows: int, src_len: int, tgt_len: int, vocab: int = 1000, seed: int = 0) -> Batch:
    """A right-padded random batch on the CPU, rows of varied lengths."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (rows, src_len), generator=gen)
    tgt = torch.randint(4, vocab, (rows, tgt_len + 1), generator=gen)
    tgt[:, 0] = BOS_ID
    for row in range(1, rows, 2):  # every other row shorter: padding on both sides
        src[row, src_len // 2 :] = PAD_ID
        tgt[row, tgt_len // 2 :] = PAD_ID
    tokens = int((tgt[:, 1:] != PAD_ID).sum())
    return Batch(src, tgt[:, :-1], tgt[:, 1:], list(range(rows)), tokens)


def gradients(model: Transformer, batch: Batch, precision: str) -> Figures:
    """Loss per token and gradients of the Trainer's forward and backward passes of one update
    (`UpdateStep.backward`) of `model` on `batch`."""
    device = next(model.parameters()).device
    model.zero_grad(set_to_none=True)
    tokens, sums = trainer_step(model, TrainConfig(), precision).backward([batch.to(device)])
    # every parameter takes part in the loss: each has a gradient after backward()
    grads = {
        n: cast(torch.Tensor, p.grad).detach().float().cpu() for n, p in model.named_parameters()
    }
    return {"loss": float(sums[0]) / float(tokens[0]), "grads": grads}


def worst_relative(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """max over tensors of |ours - reference| / |reference| (Frobenius norms)."""
    return max(
        float((ours[n] - ref).norm() / ref.norm().clamp_min(1e-12)) for n, ref in reference.items()
    )


def metrics(run: Path, split: str) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl of `split` (train or valid)."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if m["split"] == split]


# ---------------------------------------------------------------------------------------------
# Checks that also run on the CPU


def environment(ctx: Context) -> Figures:
    figures: Figures = {"torch": torch.__version__, "python": sys.version.split()[0]}
    figures["device"] = str(ctx.device)
    figures["auto precision"] = resolve_precision("auto", ctx.device)
    figures["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if ctx.device.type == "cuda":
        figures["gpu"] = torch.cuda.get_device_name(ctx.device)
        figures["capability"] = torch.cuda.get_device_capability(ctx.device)
        figures["cuda"] = torch.version.cuda
        figures["memory GiB"] = torch.cuda.get_device_properties(ctx.device).total_memory / 2**30
    return figures


def presets(ctx: Context) -> Figures:
    """The GPU configs load (the WMT14 data need not be here); their sizes and batches."""
    figures = {}
    for name in ("wmt14_en_de_base", "wmt14_en_de_big", "multi30k_de_en_gpu"):
        cfg = load_config(CONFIGS / f"{name}.yaml")
        m, t = cfg.model, cfg.train
        figures[name] = (
            f"d_model {m.d_model}, {m.encoder_layers}+{m.decoder_layers} layers, "
            f"{t.batch_tokens * t.accumulate} tokens per update, {t.max_steps} updates"
        )
    return figures


def cached_decoding(ctx: Context) -> Figures:
    """Step-by-step decoding with the key/value cache gives the whole-prefix logits."""
    configure_kernels(deterministic=False, tf32=False)
    model = tiny_model(ctx.device).eval()
    batch = random_batch(4, 12, 10)
    src, tgt = (
        batch.src[:, :6].to(ctx.device),
        batch.tgt_in[:, :8].to(ctx.device),
    )  # no padding: stepwise
    figures = {}
    for precision in ("fp32", "bf16") if ctx.device.type == "cuda" else ("fp32",):
        with torch.no_grad(), autocast_context(ctx.device, DTYPES[precision]):
            src_mask = (src != PAD_ID)[:, None, None, :]
            memory = model.encode(src, src_mask)
            full = model.decode(tgt, memory, src_mask).float()
            cache = model.new_cache()
            steps = [model.decode(tgt[:, i : i + 1], memory, src_mask, cache) for i in range(8)]
            cached = torch.cat(steps, dim=1).float()
        figures[f"{precision} max |diff|"] = float((full - cached).abs().max())
    if figures["fp32 max |diff|"] > 1e-4:
        raise CheckFailed(f"cached decoding differs from full decoding: {figures}")
    return figures


def mask_free_attention(ctx: Context) -> Figures:
    """The decoder's causal flag (flash on CUDA, forced there) equals causal & padding masks."""
    model = tiny_model(ctx.device).eval()
    batch = random_batch(4, 16, 16).to(ctx.device)
    src, tgt_in = batch.src, batch.tgt_in
    precision = "bf16" if ctx.device.type == "cuda" else "fp32"
    with torch.no_grad(), autocast_context(ctx.device, DTYPES[precision]):
        src_mask = (src != PAD_ID)[:, None, None, :]
        memory = model.encode(src, src_mask)
        if ctx.device.type == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            # Through decode, as training and translation call it: flash takes no mask, so
            # a decoder that passed one to self-attention is an error here. Cross-attention is
            # given no source mask for this call (flash would refuse it too); not compared.
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                model.decode(tgt_in, memory, None)
        mask_free = model.decode(tgt_in, memory, src_mask).float()
        self_mask = causal_mask(tgt_in.size(1), ctx.device) & (tgt_in != PAD_ID)[:, None, None]
        y = model.tgt_embed(tgt_in)
        for layer in model.decoder:
            y = layer(y, memory, self_mask, src_mask)
        masked = model.output(model.decoder_norm(y)).float()
    real = tgt_in != PAD_ID
    diff = float((mask_free - masked)[real].abs().max())
    if diff > (5e-2 if precision == "bf16" else 1e-4):
        raise CheckFailed(f"the mask-free decoder differs from the masked one by {diff}")
    return {"precision": precision, "max |diff| at real positions": diff}


HOST_READS = (
    "tolist",
    "item",
    "nonzero",
    "cpu",
    "numpy",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
)


@contextlib.contextmanager
def counted(owner: type, names: tuple[str, ...]) -> Iterator[list[str]]:
    """The names of the calls of `owner`'s methods `names` while inside, in order."""
    calls: list[str] = []
    saved = {name: owner.__dict__.get(name) for name in names}

    def counting(name: str, method: Callable) -> Callable:
        def call(self, *args, **kwargs):
            calls.append(name)
            return method(self, *args, **kwargs)

        return call

    for name in names:
        setattr(owner, name, counting(name, getattr(owner, name)))
    try:
        yield calls
    finally:
        for name, method in saved.items():
            if method is None:
                delattr(owner, name)
            else:
                setattr(owner, name, method)


def device_waits(work: Callable[[], object]) -> int:
    """How many times `work()` made the CPU wait for the GPU, as torch's sync debug mode
    counts them (each a warning)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            work()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def decoding(ctx: Context) -> Figures:
    """Greedy and beam-5 search of 128 random sources with the random model: milliseconds per
    step, and how often a step reads tensor values on the host (on a GPU each read waits for
    the device; docs/gpu.md)."""
    model = tiny_model(ctx.device).eval()
    src = random_batch(128, 20, 2).src.to(ctx.device)
    limits = max_output_lengths(src, 1.0, 10)
    precision = "bf16" if ctx.device.type == "cuda" else "fp32"
    searches = {
        "greedy": lambda: generate(model, src, limits, Greedy()),
        "beam 5": lambda: generate(model, src, limits, Beam(5), alpha=1.0),
    }
    figures: Figures = {}
    for name, search in searches.items():
        with torch.no_grad(), autocast_context(ctx.device, DTYPES[precision]):
            search()  # warm-up
            with (
                counted(torch.Tensor, HOST_READS) as reads,
                counted(StepDecoder, ("log_probs",)) as steps,
            ):
                search()
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            start = time.perf_counter()
            search()
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            seconds = time.perf_counter() - start
        figures[f"{name} ms per step"] = 1000 * seconds / len(steps)
        figures[f"{name} host reads per step"] = len(reads) / len(steps)
        if ctx.device.type == "cuda":
            with torch.no_grad(), autocast_context(ctx.device, DTYPES[precision]):
                figures[f"{name} device waits per step"] = device_waits(search) / len(steps)
    figures["precision"] = precision
    return figures


# ---------------------------------------------------------------------------------------------
# Checks that need the GPU


def numerics(ctx: Context) -> Figures:
    """One update's forward and backward on the CPU (fp32) and on CUDA (fp32 with TF32 off;
    bf16): loss and gradients."""
    configure_kernels(deterministic=False, tf32=False)
    torch.manual_seed(0)
    model = Transformer(1000, 1000, LayerSpec(d_model=256, heads=4, d_ff=1024), 3, 3)
    batch = random_batch(16, 24, 22)
    reference = gradients(model, batch, "fp32")
    model.to(ctx.device)
    figures, limits = {}, {"fp32": 1e-4, "bf16": 5e-2}
    for precision, limit in limits.items():
        ours = gradients(model, batch, precision)
        figures[f"{precision} loss rel diff"] = abs(ours["loss"] / reference["loss"] - 1)
        figures[f"{precision} worst grad rel diff"] = worst_relative(
            ours["grads"], reference["grads"]
        )
        if figures[f"{precision} worst grad rel diff"] > limit:
            raise CheckFailed(f"{precision} gradients differ from the CPU's: {figures}")
    configure_kernels(deterministic=False, tf32=True)
    return figures


def read_later(ctx: Context) -> Figures:
    """Multi30k at transformer-base size in this process, 300 updates logged every 100: each
    update read one update later (what the trainer does) against each read at once; target
    tokens/s of the last 200 and the last logged loss each way (bit-for-bit equality is
    tests/unit/train/test_pending.py's, on the CPU: here atomics make any two runs differ).
    No setting reads every update at once without logging it too, so the run's rule
    (`loop.read_at_once`) is replaced for the first, as that test replaces it."""
    figures = {}
    for mode in ("at once", "one later"):
        out = ctx.out / "runs" / f"read-{mode.replace(' ', '-')}"
        sets = (*BASE, "train.max_steps=300", "train.log_every=100", "train.eval_every=1000",
                f"train.out_dir={out}")  # fmt: skip
        trainer = setup(load_config(CONFIGS / "multi30k_de_en_gpu.yaml", sets), device=ctx.device)
        read = (lambda *args: True) if mode == "at once" else loop.read_at_once
        with mock.patch.object(loop, "read_at_once", read):
            trainer.run()
        rows = metrics(out, "train")[1:]  # the first window holds the warm-up
        figures[f"tgt tok/s, read {mode}"] = sum(r["tokens_per_sec"] for r in rows) / len(rows)
        figures[f"loss at 300, read {mode}"] = rows[-1]["loss"]
    later, now = figures["tgt tok/s, read one later"], figures["tgt tok/s, read at once"]
    return figures | {"speed-up": later / now}


def peak_memory(ctx: Context) -> Figures:
    """One update of the Trainer's (`UpdateStep`) of transformer-base and -big at a 32k
    vocabulary, at the config's batch of its longest sentences (max_len), with and without
    activation checkpointing."""
    figures = {}
    for name in ("wmt14_en_de_base", "wmt14_en_de_big"):
        cfg = load_config(CONFIGS / f"{name}.yaml")
        length = cfg.data.max_len
        batch = random_batch(max(1, cfg.train.batch_tokens // length), length, length, VOCAB)
        precision = resolve_precision(cfg.train.precision, ctx.device)
        for checkpointing in (False, True):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(ctx.device)
            model = build_model(cfg, VOCAB, VOCAB).to(ctx.device)
            model.activation_checkpointing = checkpointing
            step = trainer_step(model, cfg.train, precision)
            trainer_updates(step, [batch.to(ctx.device)])
            torch.cuda.synchronize(ctx.device)
            key = f"{name} {precision}{' checkpointed' if checkpointing else ''} GiB"
            figures[key] = torch.cuda.max_memory_allocated(ctx.device) / 2**30
            del model, step
    return figures
