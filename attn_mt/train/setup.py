"""A training run's set-up, read top to bottom (torchtune's recipe `setup`): each part is built
where its inputs exist, then the loop (`loop.Trainer`) runs them. `run.start_run` comes first,
without torch: the run folder checked, CUDA's environment set. Then, here:
- `train`: the process group (this process alone, or one rank under torchrun) and the run
  folder's lock, which rank 0 holds for the whole run; the run set up and run;
- `setup`: what the run starts from (`starting_point`: on resume its last.pt, once it is known
  to fit the config, else the checkpoint train.init_from names), whose model, tokenizer and
  decode keys fill those the config leaves out; the precision, the kernels' settings, the
  threads and the seed; the data, with that checkpoint's SentencePiece models, and the
  validation pairs; the training state (`build_state`: the model, train.freeze's parts frozen,
  its EMA, the optimizer, the loss scaler and the batches), which last.pt then restores on
  resume; the casing table of the training sources (`casing.py`); what a CPU's float32
  products run through; checkpoints/, config.yaml and casing.json, made only once all that is
  known to be good; the update (`loop.UpdateStep`), the signals that stop the run, the rule
  for skipped updates and, under torchrun, the ranks' agreement on the stop.
What needs the run's log open, `Trainer.run` does as it begins: the start-up lines, the largest
batch tried on a GPU, compiled or eager, the run's clock and the validator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attn_mt import distributed
from attn_mt.checkpoint import (
    checkpoint_config,
    config_differences,
    load_checkpoint,
    load_weights,
    tokenizers_from,
    translation_weights,
)
from attn_mt.config.file import inherit_keys, save_config
from attn_mt.config.schema import Config, TrainConfig
from attn_mt.data.corpus import stage, training_data, valid_subset
from attn_mt.data.epochs import ShardBatches
from attn_mt.data.prepare import prepare_shards, prepared_corpus_lines
from attn_mt.data.shards import Shards
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import UserError
from attn_mt.model.loss import SmoothedObjective
from attn_mt.model.transformer import build_model
from attn_mt.paths import resolve_checkpoint
from attn_mt.precision import DTYPES, configure_kernels, resolve_device, resolve_precision
from attn_mt.runfolder import check_run_start, lock_run_folder
from attn_mt.train import speed
from attn_mt.train.casing import casing_table, write_casing_file
from attn_mt.train.loop import Trainer, TrainResult, UpdateStep
from attn_mt.train.runlog import Monitor, QuietMonitor
from attn_mt.train.skips import SkipRule
from attn_mt.train.state import TrainState, WeightEMA, freeze
from attn_mt.train.stopping import RankAgreement, StopSignals
from attn_mt.world import World

log = logging.getLogger("attn_mt")

# Config keys a resumed run must share with its checkpoint (the rest may change, and so may
# the subword sampling, which changes no piece); the frozen parts decide the optimizer's state.
RESUME_KEYS = ("model", "tokenizer", "data.src_lang", "data.tgt_lang", "train.freeze")
SAMPLING_KEY = "tokenizer.sampling_alpha"
# Model and tokenizer keys a run started from a checkpoint (train.init_from) may change: none
# shapes a weight or a piece (its SentencePiece models are given, never trained).
INIT_FREE_KEYS = (
    "model.dropout",
    "model.activation_dropout",
    "model.attention_dropout",
    "model.fused_attention",
    SAMPLING_KEY,
    "tokenizer.max_sentences",
)


def train(
    cfg: Config, resume: bool = False, device: str = "auto", monitor: Monitor | None = None
) -> TrainResult:
    """Train a model as `cfg` describes, in this process or as one rank under torchrun;
    rank 0 holds the run folder's lock for the whole run, `monitor` follows it as it goes."""
    with distributed.process_group(resolve_device(device)) as (world, torch_device):
        lock = lock_run_folder(cfg.train.out_dir) if world.is_main else contextlib.nullcontext()
        with lock:
            return setup(cfg, world, torch_device, resume, monitor).run()


def setup(
    cfg: Config,
    world: World = World(),
    device: torch.device = torch.device("cpu"),
    resume: bool = False,
    monitor: Monitor | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Trainer:
    """The run `cfg` describes (with `resume`, the one in its out_dir) set up on `device`, ready
    to `run`; it holds nothing that needs releasing (the run's log opens when it runs).
    `clock` gives the run's seconds (tests pass a fake one)."""
    began = clock()  # the run's time counts its set-up
    cfg, last, init = starting_point(cfg, resume, world)
    log.info("run folder: %s (%s)", cfg.train.out_dir, "resumed" if last else "a new run")
    t = cfg.train
    precision = resolve_precision(t.precision, device)
    dtype = DTYPES[precision]
    configure_kernels(t.deterministic, t.tf32)
    if t.threads:
        torch.set_num_threads(t.threads)
    torch.manual_seed(t.seed)

    checkpoint = last or (init[1] if init else None)  # its SentencePiece models are kept
    tokenizers = tokenizers_from(checkpoint) if checkpoint else None
    src_tok, tgt_tok, corpus = training_data(cfg, tokenizers, world)
    valid_total = len(corpus.valid_src)
    corpus = valid_subset(corpus, t.valid_max_sentences, t.seed)

    state = build_state(cfg, (src_tok, tgt_tok), corpus.shards, precision, device, world, init)
    if last:
        state.restore(last)
    if world.is_main:  # the casing tables every checkpoint holds; a resumed run keeps its own
        with stage("the casing table of the training sources"):
            state.casing = (last or {}).get("casing") or casing_table(cfg)
    speed.choose_kernels(state.model, cfg, state.progress, device, dtype, world)
    if world.is_main:  # created only once the config, data and last.pt are known to be good
        state.ckpt_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, Path(t.out_dir) / "config.yaml")
        write_casing_file(state.casing or {}, t.out_dir)

    objective = SmoothedObjective(state.model, t.label_smoothing)
    step = UpdateStep(
        objective, state.optimizer, state.scaler, state.ema, t.clip_norm, world, dtype
    )
    signals = StopSignals(abandon=state.writer.abandon)
    last_pt = state.ckpt_dir / "last.pt"
    skips = SkipRule(t.max_nonfinite, state.scaler, last_pt, settle=state.writer.wait)
    agreement = RankAgreement(world, device)  # under torchrun: the ranks' stops
    return Trainer(
        state, corpus, valid_total, precision, step, signals, skips, agreement,
        monitor or QuietMonitor(), began, clock, resumed=last is not None,
    )  # fmt: skip


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
    # Either takes the model, tokenizer and decode keys its config leaves out from there.
    init = None if last else _checked_on_main(lambda: init_checkpoint(cfg), world)
    if init:
        cfg = with_init_from(started_config(cfg, init[1], init[0]), init[0])
    elif checked and last:
        cfg = resumed_config(cfg, last, checked[0])
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
    resumed_config(cfg, state, last)
    return state


def resumed_config(cfg: Config, state: dict[str, Any], path: str | Path) -> Config:
    """`cfg` resuming the run whose last.pt (at `path`) holds `state`: with the model,
    tokenizer and decode keys it leaves out taken from there (`inherit_keys`), once the
    RESUME_KEYS it writes are known to be last.pt's."""
    old = checkpoint_config(state, path)  # validated like a config file
    new = inherit_keys(cfg, old)
    differ = config_differences(old.to_dict(), new.to_dict(), RESUME_KEYS)
    if diff := [k for k in differ if k != SAMPLING_KEY]:
        raise UserError(
            f"{Path(path).parent.parent}: cannot resume with a changed config ({', '.join(diff)} "
            "differ from the checkpoint); restore them or start a new train.out_dir"
        )
    return new


def init_checkpoint(cfg: Config) -> tuple[str, dict[str, Any]] | None:
    """The checkpoint `train.init_from` names (its absolute path and contents), once `cfg`
    is known to fit it (`started_config`); None without one."""
    if cfg.train.init_from is None:
        return None
    path = resolve_checkpoint(cfg.train.init_from).resolve()
    state = load_checkpoint(path)
    started_config(cfg, state, path)
    return str(path), state


def started_config(cfg: Config, state: dict[str, Any], path: str | Path) -> Config:
    """`cfg` for a new run from the checkpoint `state` (at `path`): the model, tokenizer and
    decode keys and the languages it leaves out are the checkpoint's (`inherit_keys`); one it
    writes that shapes a weight or a piece must be the checkpoint's (INIT_FREE_KEYS may
    differ), and its data must be in the model's directions."""
    source = checkpoint_config(state, path)
    new = inherit_keys(cfg, source)
    old, ours = source.to_dict(), new.to_dict()
    differ = config_differences(old, ours, ("model", "tokenizer"))
    if keys := [key for key in differ if key not in INIT_FREE_KEYS]:
        values = ", ".join(
            f"{k} ({_value(ours, k)!r} here, {_value(old, k)!r} there)" for k in keys
        )
        raise UserError(
            f"{path}: cannot start from this checkpoint, the config differs in {values}; a run "
            "started from it keeps its model and SentencePiece models (leave those keys out: "
            f"they come from the checkpoint; only {', '.join(INIT_FREE_KEYS)} and train.* may "
            "change)"
        )
    model, data = source.data, new.data
    if not set(data.directions()) <= set(model.directions()) or (
        data.language_tags() != model.language_tags()
    ):
        raise UserError(
            f"{path}: the model translates {model.in_words()}, the config's data "
            f"{data.in_words()}; fine-tune it on its own directions (data.src_lang and "
            "data.tgt_lang, or each data.train entry's)"
        )
    return new


def prepare_run_data(cfg: Config, workers: int = 0) -> list[str]:
    """`attn-mt prepare`: the shards `train` reads for `cfg`, built ahead of it (a damaged
    folder rebuilt) and encoded as it encodes them: with the SentencePiece models of the
    checkpoint train.init_from names, when it names one. Returns the corpora's lines."""
    init = cfg.train.init_from
    tokenizers = tokenizers_from(load_checkpoint(resolve_checkpoint(init))) if init else None
    prepare_shards(cfg, tokenizers, workers=workers, repair=True)
    return prepared_corpus_lines(cfg, tokenizers)


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
    freeze(model, cfg.train.freeze)  # before the optimizer: a frozen tensor has no state
    ema = WeightEMA(model, cfg.train.ema_decay) if cfg.train.ema_decay else None
    optimizer = make_optimizer(model, cfg.train)
    scaler = make_scaler(precision, device)
    batches = ShardBatches.from_config(cfg, shards, world)
    return TrainState(cfg, tokenizers, model, ema, optimizer, scaler, batches, world, device)


def make_optimizer(model: torch.nn.Module, t: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the parameters that train (not train.freeze's); weight decay only on matrices
    (not biases, norms)."""
    params = [p for p in {id(p): p for p in model.parameters()}.values() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    groups = [group for group in groups if group["params"]]  # a part frozen may empty one
    # The fused kernel updates every tensor in one pass: the per-tensor loop it replaces was a
    # visible share of a CPU step (docs/performance.md).
    return torch.optim.AdamW(
        groups, lr=t.lr, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps, fused=True
    )


def make_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16's loss scaler (None in other precisions)."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None
