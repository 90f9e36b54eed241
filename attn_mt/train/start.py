"""A run's start: what it starts from (`starting_point`: on resume its last.pt, once it is known
to fit the config, else the checkpoint train.init_from names), the state it builds
(`build_state`: the model, EMA, optimizer, loss scaler and batches), the lines it starts its
log with (`log_start`), and on a GPU its largest batch tried once (`probe_largest_batch`):
batches come in a random order, so without the probe the largest could come hours into a run
and end it with a traceback; running out of memory is one line naming the key to change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attn_mt import distributed
from attn_mt.checkpoint import (
    checkpoint_config,
    config_differences,
    load_checkpoint,
    load_weights,
    translation_weights,
)
from attn_mt.config.schema import Config, TrainConfig
from attn_mt.data.batching import Batch, ShardBatches, collate
from attn_mt.data.corpus import Corpus, stage
from attn_mt.data.shards import Shards
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import UserError
from attn_mt.fileio import resolve_checkpoint
from attn_mt.model.loss import SmoothedObjective
from attn_mt.model.transformer import Transformer, build_model, parameter_count
from attn_mt.runfolder import check_run_start
from attn_mt.train.runlog import RunLog, peak_gib
from attn_mt.train.speed import Forward
from attn_mt.train.state import TrainState, WeightEMA, fork_rng

log = logging.getLogger("attn_mt")

# Config keys a resumed run must share with its checkpoint (the rest may change, and so may
# the subword sampling, which changes no piece).
RESUME_KEYS = ("model", "tokenizer", "data.src_lang", "data.tgt_lang")
SAMPLING_KEY = "tokenizer.sampling_alpha"
# Model and tokenizer keys a run started from a checkpoint (train.init_from) may change: none
# shapes a weight or a piece.
INIT_FREE_KEYS = (
    "model.dropout",
    "model.activation_dropout",
    "model.attention_dropout",
    "model.fused_attention",
    SAMPLING_KEY,
)


def starting_point(
    cfg: Config, resume: bool, world: distributed.World
) -> tuple[Config, dict[str, Any] | None, tuple[str, dict[str, Any]] | None]:
    """What a run starts from: on resume its last.pt, else the checkpoint train.init_from names
    (its path and contents), or neither; and `cfg` with train.init_from recording it."""
    out = Path(cfg.train.out_dir)

    def resumable() -> tuple[str, dict[str, Any]] | None:
        state = check_run_folder(out, cfg, resume)
        return (str(out / "checkpoints" / "last.pt"), state) if state else None

    # Rank 0 alone looks at the run folder (no rank can see a folder rank 0 has begun to write)
    # and checks the checkpoint; the other ranks then read the file it names themselves.
    checked = _checked_on_main(resumable, world)
    last = checked[1] if checked else None
    # A new run may start from a checkpoint's weights; a resumed one keeps its own record.
    init = None if last else _checked_on_main(lambda: init_checkpoint(cfg), world)
    if init:
        cfg = with_init_from(cfg, init[0])
    elif last:
        cfg = with_init_from(cfg, last["config"]["train"].get("init_from"))
    return cfg, last, init


def _checked_on_main(
    check: Callable[[], tuple[str, dict[str, Any]] | None], world: distributed.World
) -> tuple[str, dict[str, Any]] | None:
    """`check()` (a checkpoint's path and contents, or None) run on rank 0; the other ranks
    get the path and read the file themselves. Only when some rank cannot see the file (no
    shared disk) are the contents sent pickled, which takes twice their size in each rank's
    memory (a transformer-big last.pt is ~3.4 GB)."""
    held: dict[str, dict[str, Any]] = {}

    def on_main() -> str | None:
        found = check()
        if found:
            held[found[0]] = found[1]
        return found[0] if found else None

    path = distributed.from_main(on_main, world)
    if path is None:
        return None
    if not all(distributed.gather(Path(path).is_file(), world)):
        return path, distributed.from_main(lambda: held[path], world)
    return path, held[path] if path in held else load_checkpoint(path)


def check_run_folder(out: Path, cfg: Config, resume: bool) -> dict[str, Any] | None:
    """Refuse to overwrite a run; on resume, return last.pt once it is known to fit `cfg`."""
    check_run_start(out, resume)
    if not resume:
        return None
    last = out / "checkpoints" / "last.pt"
    state = load_checkpoint(last)
    if not isinstance(state.get("train_state"), dict):
        raise UserError(f"{last}: holds no training state, so it cannot be resumed")
    old = checkpoint_config(state, last).to_dict()  # validated like a config file
    diff = [k for k in config_differences(old, cfg.to_dict(), RESUME_KEYS) if k != SAMPLING_KEY]
    if diff:
        raise UserError(
            f"{out}: cannot resume with a changed config ({', '.join(diff)} differ "
            "from the checkpoint); restore them or start a new train.out_dir"
        )
    return state


def init_checkpoint(cfg: Config) -> tuple[str, dict[str, Any]] | None:
    """The checkpoint `train.init_from` names (its absolute path and contents), once its model
    and tokenizer keys are known to equal `cfg`'s (but for INIT_FREE_KEYS); None without one."""
    if cfg.train.init_from is None:
        return None
    path = resolve_checkpoint(cfg.train.init_from).resolve()
    state = load_checkpoint(path)
    old, new = state["config"], cfg.to_dict()
    differ = config_differences(old, new, ("model", "tokenizer"))
    if keys := [key for key in differ if key not in INIT_FREE_KEYS]:
        values = ", ".join(f"{k} ({_value(new, k)!r} here, {_value(old, k)!r} there)" for k in keys)
        raise UserError(
            f"{path}: cannot start from this checkpoint, the config differs in {values}; a run "
            "started from it keeps its model and SentencePiece models (only model.dropout, "
            "model.activation_dropout, model.attention_dropout, tokenizer.sampling_alpha and "
            "train.* may change)"
        )
    return str(path), state


def _value(config: dict[str, Any], key: str) -> Any:
    """The value of a dotted `section.key` in a plain config (None when missing)."""
    section, name = key.split(".")
    return config.get(section, {}).get(name)


def with_init_from(cfg: Config, init_from: str | None) -> Config:
    """`cfg` with train.init_from set: config.yaml records the checkpoint a run started from."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_from=init_from))


def build_state(
    cfg: Config,
    tokenizers: tuple[Tokenizer, Tokenizer],
    shards: Shards,
    precision: str,
    device: torch.device,
    world: distributed.World,
    init: tuple[str, dict[str, Any]] | None,
) -> TrainState:
    """A run's training state as it begins: the model on `device` (with train.init_from's
    weights, `init`, when given), its EMA, the optimizer, the loss scaler and the batches;
    `TrainState.restore` then brings a resumed run's back."""
    src_tok, tgt_tok = tokenizers
    with stage("building the model"):
        model = build_model(cfg, src_tok.vocab_size, tgt_tok.vocab_size)
        model.to(device)
    if init:
        load_weights(model, translation_weights(init[1]), init[0])
    ema = WeightEMA(model, cfg.train.ema_decay) if cfg.train.ema_decay else None
    optimizer = make_optimizer(model, cfg.train)
    scaler = make_scaler(precision, device)
    batches = ShardBatches.from_config(cfg, shards, world)
    return TrainState(cfg, tokenizers, model, ema, optimizer, scaler, batches, world, device)


def make_optimizer(model: torch.nn.Module, t: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay only on matrices (not biases, norms)."""
    params = list({id(p): p for p in model.parameters()}.values())  # tied weights once
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # The fused kernel updates every tensor in one pass: the per-tensor loop it replaces was a
    # visible share of a CPU step (docs/performance.md).
    return torch.optim.AdamW(
        groups, lr=t.lr, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps, fused=True
    )


def make_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16's loss scaler (None in other precisions)."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


def log_start(
    runlog: RunLog, state: TrainState, corpus: Corpus, precision: str, resumed: bool
) -> None:
    """The start-up lines: the model and device, the data kept, the vocabulary and batching,
    where the weights come from; the hyper-parameters to TensorBoard."""
    cfg, stats, (src_tok, tgt_tok) = state.cfg, corpus.stats, state.tokenizers
    params = parameter_count(state.model)
    threads = torch.get_num_threads() if state.device.type == "cpu" else None
    stream = cfg.train.bf16_stream
    notes = {  # said after the precision where they hold
        ", float32 products through oneDNN": state.progress.matmul_backend == "onednn",
        ", bf16 residual stream": stream and precision == "bf16",
        " (train.bf16_stream: no effect outside bf16)": stream and precision != "bf16",
    }
    log.info(
        "attn-mt: %s, %s parameters, device %s%s, precision %s, %d process(es)",
        cfg.data.in_words(),
        f"{params:,}",
        state.device,
        f" ({threads} threads)" if threads else "",
        precision + "".join(note for note, holds in notes.items() if holds),
        state.world.size,
    )
    log.info(
        "data: %d training pairs kept, %s; %d validation pairs",
        stats.kept,
        stats.describe(),
        len(corpus.valid_src),
    )
    for line in corpus.describe():  # each training corpus: what its rules dropped, its share
        log.info("data: %s", line)
    if cfg.data.augment.any():  # changed in the shards, the same way every epoch
        shares = dataclasses.asdict(cfg.data.augment)
        log.info(
            "data: pairs changed as data.augment says (drawn from train.seed %d): %s",
            cfg.train.seed,
            ", ".join(f"{key} {100 * share:g}%" for key, share in shares.items() if share),
        )
    log.info(
        "vocabulary: %s SentencePiece %s, %d / %d pieces; %s",
        "joint" if src_tok is tgt_tok else "separate",
        cfg.tokenizer.model_type,
        src_tok.vocab_size,
        tgt_tok.vocab_size,
        state.source.describe(),
    )
    if cfg.train.init_from and not resumed:
        log.info("weights and SentencePiece models from %s; a new run", cfg.train.init_from)
    if state.ema:
        log.info("weight EMA, decay %g: validation and best.pt use the average", state.ema.decay)
    if resumed:
        position = state.source.state_dict()
        log.info(
            "resumed at step %d (epoch %d, batch %d)",
            state.progress.step,
            position["epoch"],
            position["index"],
        )
    runlog.hparams(cfg, params)


class OutOfMemory(UserError):
    """The GPU ran out of memory: the batch is too large for it."""


@contextlib.contextmanager
def out_of_memory_hint(t: TrainConfig) -> Iterator[None]:
    """Turn torch's OutOfMemoryError into one line naming train.batch_tokens."""
    try:
        yield
    except torch.OutOfMemoryError as err:
        said = str(err).strip().split(". ")[0][:160]
        raise OutOfMemory(
            f"out of GPU memory ({said}); lower train.batch_tokens (now {t.batch_tokens}) and "
            f"raise train.accumulate (now {t.accumulate}) to keep the tokens per update, or "
            "train in bf16"
        ) from None


def worst_rows(source: ShardBatches) -> np.ndarray:
    """The rows of this process's batch of the current epoch with the most padded target
    positions, ties broken by padded source positions: its activations, kept for the backward
    over every layer, are the largest tensors of an update (the loss makes no (B, T, V)
    logits: `projected_loss` in model/loss.py)."""
    lengths = source.shards.lengths  # (N, 2) source, target tokens without <eos>

    def padded(rows: np.ndarray) -> tuple[int, int]:
        widths = lengths[rows].max(axis=0) + 1  # + <eos> (or <bos>)
        return len(rows) * int(widths[1]), len(rows) * int(widths[0])

    return max(source.batches, key=padded)


def worst_batch(source: ShardBatches) -> Batch:
    """The batch of `worst_rows`, as training would see it (without subword sampling)."""
    return collate(source.shards.src, source.shards.tgt, worst_rows(source))


def probe(
    model: Transformer, batch: Batch, dtype: torch.dtype | None, label_smoothing: float
) -> None:
    """One forward and backward of `batch`, its gradients dropped and the RNG left as it was,
    so training is the same bit for bit with or without it."""
    device = next(model.parameters()).device
    objective = SmoothedObjective(model, label_smoothing)
    with fork_rng(device):
        loss, _ = Forward(objective, objective, dtype)(batch)
        loss.backward()
    model.zero_grad(set_to_none=True)


def probe_largest_batch(
    model: Transformer, source: ShardBatches, dtype: torch.dtype | None, label_smoothing: float
) -> None:
    """On a GPU: `probe` this process's largest batch, so a batch too large for the GPU fails
    at start-up rather than hours in, and log its peak memory; nothing on the CPU."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return
    batch = worst_batch(source)
    probe(model, batch.to(device), dtype, label_smoothing)
    log.info(
        "largest batch (%d x %d target positions): peak GPU memory %.2f GiB "
        "(the optimizer's state, twice the weights, comes on top at the first update)",
        *batch.tgt_out.shape,
        peak_gib(device),
    )
