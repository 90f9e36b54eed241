"""The training state: what last.pt holds beyond a translation checkpoint, how it is written and
read back, which step_N.pt are kept, and what a new or resumed run may start from.

last.pt is `checkpoint.make_checkpoint`'s dict plus `train_state`:
    progress   `TrainProgress` as a dict (step, best score, early-stop count, elapsed time, ...)
    data       the batch source's position (`ShardBatches.state_dict`)
    optimizer  the optimizer's state_dict
    scaler     the fp16 GradScaler's state_dict, or None
    rng        (cpu, cuda) generator states, one pair per rank
With a weight EMA, last.pt's `model` holds the raw weights and `ema` the average (which best.pt
and step_N.pt hold as `model`), so a resume continues the raw weights and the average alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from attn_mt import distributed
from attn_mt.checkpoint import (
    checkpoint_config,
    config_differences,
    load_checkpoint,
    load_weights,
    make_checkpoint,
    translation_weights,
)
from attn_mt.config import Config, TrainConfig
from attn_mt.data.batching import ShardBatches
from attn_mt.data.shards import Shards
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import UserError
from attn_mt.fileio import resolve_checkpoint
from attn_mt.model.transformer import Transformer, build_model
from attn_mt.train.ema import WeightEMA
from attn_mt.train.runfolder import check_run_start
from attn_mt.train.saver import CheckpointWriter
from attn_mt.train.skips import make_scaler
from attn_mt.train.stage import stage

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
# A damaged train_state fails with one of these while it is read back.
_DAMAGE = (KeyError, TypeError, ValueError, IndexError, RuntimeError)


@dataclass
class TrainProgress:
    """Where training stands; saved whole in last.pt (`asdict`) and read back whole."""

    step: int = 0  # updates done
    best_score: float | None = None  # best validation figure of train.select_metric so far
    bad_evals: int = 0  # validations in a row without a better score
    elapsed: float = 0.0  # seconds the run has taken (max_minutes' clock)
    validation_seconds: float = 0.0  # how long the latest validation took
    last_valid_step: int = -1
    skipped: int = 0  # updates skipped for a NaN/inf loss or gradient (fp16 overflows included)
    kept_checkpoints: list[str] = field(default_factory=list)  # step_N.pt names, oldest first
    # what float32 linear layers multiply through, "mkl" or "onednn": chosen at the start, kept
    # (last.pt files written before the name carry it as "products")
    matmul_backend: str = ""
    compiled: str = ""  # "eager" or "compiled" (train.compile): chosen at the start, kept

    def record(self, score: float, higher_is_better: bool) -> bool:
        """Count one validation score; True when it beats the best so far."""
        improved = self.best_score is None or (
            score > self.best_score if higher_is_better else score < self.best_score
        )
        if improved:
            self.best_score, self.bad_evals = score, 0
        else:
            self.bad_evals += 1
        return improved


@dataclass
class TrainState:
    """Everything an exact resume needs, written into last.pt and read back from it whole."""

    cfg: Config
    tokenizers: tuple[Tokenizer, Tokenizer]  # (source, target), embedded in every checkpoint
    model: Transformer
    ema: WeightEMA | None
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    source: ShardBatches
    world: distributed.World
    device: torch.device
    progress: TrainProgress = field(default_factory=TrainProgress)
    saved_step: int = -1  # the step last.pt was last written at by this process
    writer: CheckpointWriter = field(default_factory=CheckpointWriter)  # writes in the background

    @property
    def ckpt_dir(self) -> Path:
        """The run folder's checkpoints/."""
        return Path(self.cfg.train.out_dir) / "checkpoints"

    @property
    def eval_model(self) -> Transformer:
        """The weights that validate, go into best.pt and translate: the EMA when kept."""
        return cast(Transformer, self.ema.model) if self.ema else self.model

    def apply_gradients(
        self, sums: torch.Tensor, clip_norm: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The optimizer step with the accumulated gradients clipped to `clip_norm` (0: not
        clipped), then the EMA's and the fp16 scale's, and the gradients zeroed. Where the
        update's loss `sums` or its gradient norm are NaN/inf, the step is skipped on the
        device (the fused optimizer's `found_inf`, and the EMA's), so nothing waits for it.
        Returns the gradient norm and whether the step was taken (0-d tensors, not read)."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # and notes overflowed gradients for update()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip_norm or float("inf"))
        finite = torch.isfinite(sums).all() & torch.isfinite(norm)
        self.optimizer.found_inf = (~finite).float()  # type: ignore[attr-defined]
        self.optimizer.step()
        del self.optimizer.found_inf  # type: ignore[attr-defined]
        if self.ema:
            self.ema.update(finite)  # a skipped step leaves it as it was
        if self.scaler is not None:
            self.scaler.update()  # halves the scale after an overflow
        self.optimizer.zero_grad(set_to_none=True)
        return norm, finite

    def save(self, best: bool, metrics: dict[str, float] | None = None) -> None:
        """Write last.pt, best.pt when `best`, and after a validation (`metrics` given) step_N.pt
        with the oldest beyond train.keep_checkpoints deleted.

        Called on every rank (it gathers their RNG states); only rank 0 writes, in the
        background (`saver.CheckpointWriter`: the state is copied now, `writer.wait()` waits).
        """
        # Each rank's generators: dropout draws differ between ranks, whose batch shapes differ.
        cuda = self.device.type == "cuda"
        rng = distributed.gather(
            (torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if cuda else None),
            self.world,
        )
        step = self.saved_step = self.progress.step
        if not self.world.is_main:
            return
        state = make_checkpoint(
            self.eval_model, self.cfg, step, self.source.epoch, self.tokenizers, metrics or {}
        )
        files = [(state, self.ckpt_dir / "best.pt")] if best else []
        keep, dropped = self.cfg.train.keep_checkpoints, []
        if keep and metrics is not None:
            name = f"step_{step}.pt"
            files.append((state, self.ckpt_dir / name))
            self.progress.kept_checkpoints.append(name)
            while len(self.progress.kept_checkpoints) > keep:
                dropped.append(self.ckpt_dir / self.progress.kept_checkpoints.pop(0))
        last = dict(state)
        if self.ema:  # last.pt resumes from the raw weights; the average translates
            last["model"], last["ema"] = self.model.state_dict(), state["model"]
        last["train_state"] = {
            "progress": asdict(self.progress),
            "data": self.source.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "rng": rng,  # (cpu, cuda) per rank
        }
        self.writer.submit([*files, (last, self.ckpt_dir / "last.pt")], dropped)

    def restore(self, state: dict[str, Any]) -> None:
        """Read back what `save` wrote into last.pt; a damaged state is one UserError."""
        try:
            self._load(state)
        except _DAMAGE as err:
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            reason = "; ".join([type(err).__name__, *lines[:2]])[:200]
            raise UserError(
                f"{self.ckpt_dir / 'last.pt'}: its training state is damaged ({reason}); "
                "resume from a copy of the run or start a new train.out_dir"
            ) from None

    def _load(self, state: dict[str, Any]) -> None:
        ts = state["train_state"]
        self.model.load_state_dict(state["model"])
        if self.ema:  # a run that kept no average starts one from its weights
            self.ema.load_state_dict(translation_weights(state))
        self.optimizer.load_state_dict(ts["optimizer"])
        if self.scaler is not None and ts["scaler"]:
            self.scaler.load_state_dict(ts["scaler"])
        # The same processes each take their own streams back; otherwise all take rank 0's.
        rng = ts["rng"]
        rng_cpu, rng_cuda = rng[self.world.rank] if len(rng) == self.world.size else rng[0]
        torch.set_rng_state(rng_cpu)
        if self.device.type == "cuda" and rng_cuda is not None:
            torch.cuda.set_rng_state(rng_cuda, self.device)
        self.source.load_state_dict(ts["data"])
        progress = dict(ts["progress"])
        if "products" in progress:  # its name in last.pt files written before it was renamed
            progress["matmul_backend"] = progress.pop("products")
        self.progress = TrainProgress(**progress)


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
