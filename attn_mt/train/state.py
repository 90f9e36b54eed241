"""The training state and its checkpoints: where training stands (`TrainProgress`), what last.pt
holds beyond a translation checkpoint and how it is read back (`TrainState`), the weight EMA
(`WeightEMA`), and checkpoints written in the background (`CheckpointWriter`). Updates skipped
for a NaN/inf are `skips.py`'s.

last.pt is `checkpoint.make_checkpoint`'s dict plus `train_state`:
    progress   `TrainProgress` as a dict (step, best score, early-stop count, elapsed time, ...)
    data       the batch source's position (`ShardBatches.state_dict`)
    optimizer  the optimizer's state_dict
    scaler     the fp16 GradScaler's state_dict, or None
    rng        (cpu, cuda) generator states, one pair per rank
With a weight EMA, last.pt's `model` holds the raw weights and `ema` the average (which best.pt
and step_N.pt hold as `model`), so a resume continues the raw weights and the average alike.

Checkpoints are written while training goes on: `CheckpointWriter` copies a checkpoint's
tensors to the CPU (the only part that waits), then writes the files on a background thread,
each atomically (`checkpoint.save_checkpoint`), so last.pt is always a complete checkpoint. At
most one write is in flight: the files land in order and the host never holds more than one
extra copy of the weights and optimizer state. A failed write (a full disk) is raised at the
next save or at `wait`, which the end of a run calls. `abandon` (a second Ctrl-C) gives up the
write in flight: its file is finished but removed, not renamed, so each checkpoint stays the
last one completed.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from attn_mt import distributed
from attn_mt.checkpoint import WriteAbandoned, make_checkpoint, save_checkpoint, translation_weights
from attn_mt.config.schema import Config
from attn_mt.data.epochs import ShardBatches
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import UserError
from attn_mt.model.transformer import Transformer

# A damaged train_state fails with one of these while it is read back.
_DAMAGE = (KeyError, TypeError, ValueError, IndexError, RuntimeError)


def fork_rng(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The training RNG (the CPU's generator and `device`'s) forked for a block: what runs in
    it (a validation, a timing, a probe) never moves the streams last.pt saves."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


@dataclass
class TrainProgress:
    """Where training stands; saved whole in last.pt (`asdict`) and read back whole."""

    step: int = 0  # updates done
    best_score: float | None = None  # best validation figure of train.select_metric so far
    bad_evals: int = 0  # validations in a row without a better score
    elapsed: float = 0.0  # seconds the run has taken (max_minutes' clock)
    validation_seconds: float = 0.0  # how long the latest validation took
    pace: float = 0.0  # seconds an update took lately (`clock.RunClock.pace`)
    last_valid_step: int = -1
    skipped: int = 0  # updates skipped for a NaN/inf loss or gradient (fp16 overflows included)
    kept_checkpoints: list[str] = field(default_factory=list)  # step_N.pt names, oldest first
    # what float32 linear layers multiply through, "mkl" or "onednn": chosen at the start, kept
    # (last.pt files written before the name carry it as "products")
    matmul_backend: str = ""
    compiled: str = ""  # "eager" or "compiled" (train.compile): chosen at the start, kept
    # data.valid_general's figures at a fine-tuned run's start (step 0) and where best.pt was:
    # what the model knew before, and how much of it the run kept
    general_start: dict[str, float] = field(default_factory=dict)
    general_at_best: dict[str, float] = field(default_factory=dict)

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


class WeightEMA:
    """The moving average of `model`'s parameters, held as a frozen copy of the model (so it
    validates and saves like one: tied weights stay tied, buffers come along)."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay {decay} must be in (0, 1)")
        self.decay = decay
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        # parameters() yields tied tensors once, in the same order in the model and its copy.
        self._averages: list[torch.Tensor] = list(self.model.parameters())
        self._weights: list[torch.Tensor] = list(model.parameters())

    @torch.no_grad()
    def update(self, taken: torch.Tensor | None = None) -> None:
        """avg <- avg + (1 - decay) * (weights - avg), in place, all tensors in one call; with
        `taken` (a bool on the device: the optimizer took the step) only if it is true, decided
        on the device (a weight of 0 leaves every average exactly as it was)."""
        weight = 1.0 - self.decay
        if taken is None:
            torch._foreach_lerp_(self._averages, self._weights, weight)
        else:
            # One 0-d weight per tensor: a tensor as the scalar weight would be read back to
            # the host (`.item()`), a wait for the GPU.
            gated = taken.to(self._averages[0].dtype) * weight
            torch._foreach_lerp_(self._averages, self._weights, [gated] * len(self._averages))

    def state_dict(self) -> dict[str, Any]:
        """The averaged weights as the model's state_dict."""
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from saved averaged weights."""
        self.model.load_state_dict(state)


def freeze(model: Transformer, parts: Sequence[str]) -> None:
    """Stop training the `parts` of `model` that train.freeze names: their parameters get no
    gradient (requires_grad off), so the optimizer holds no state for them (`make_optimizer`
    leaves them out). `embeddings`: the source and target tables (and learned positions) and
    the output layer, weight and bias: with tied embeddings the output weight is the target
    table, one matrix frozen for both; `encoder`, `decoder`: their layers and final norms."""
    holds: dict[str, list[nn.Module]] = {
        "embeddings": [model.src_embed, model.tgt_embed, model.output],
        "encoder": [model.encoder, model.encoder_norm],
        "decoder": [model.decoder, model.decoder_norm],
    }
    for part in parts:
        for module in holds[part]:
            module.requires_grad_(False)


def cpu_copy(value: Any, copies: dict[int, torch.Tensor] | None = None) -> Any:
    """`value` with every tensor in it copied to the CPU (a new tensor even on the CPU), and
    every dict, list and tuple rebuilt, so that training on may change none of it. A tensor
    met again (in `copies`, by identity: the same weights in best.pt, step_N.pt and last.pt)
    is copied once."""
    copies = {} if copies is None else copies
    if isinstance(value, torch.Tensor):
        if id(value) not in copies:  # the originals outlive the call, so no id is reused
            copies[id(value)] = value.detach().to("cpu", copy=True)
        return copies[id(value)]
    if isinstance(value, dict):
        return {k: cpu_copy(v, copies) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(v, copies) for v in value)
    return value


class CheckpointWriter:
    """Writes checkpoints on one background thread, one save at a time."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._abandon = threading.Event()

    def submit(self, files: Sequence[tuple[dict[str, Any], Path]], drop: Sequence[Path]) -> None:
        """Write each (state, path) of `files` in order, then delete the `drop` paths, in the
        background; the states are copied before this returns."""
        self.wait()
        tensors: dict[int, torch.Tensor] = {}  # each copied once, whichever files hold it
        copies = [(cpu_copy(state, tensors), path) for state, path in files]
        # Not a daemon: a process that ends (or fails) with a write in flight finishes it.
        self._thread = threading.Thread(
            target=self._write, args=(copies, list(drop)), name="attn-mt checkpoint writer"
        )
        self._thread.start()

    def _write(self, files: list[tuple[dict[str, Any], Path]], drop: list[Path]) -> None:
        try:
            for state, path in files:
                save_checkpoint(state, path, self._abandon)
            for path in drop:
                path.unlink(missing_ok=True)
        except WriteAbandoned:
            pass  # what was asked: the earlier files stay as they were
        except BaseException as err:  # noqa: BLE001 - raised on the training thread instead
            self._error = err

    def wait(self) -> None:
        """Wait for the write in flight, if any; raise its error, if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def abandon(self) -> None:
        """Give up the write in flight (its current file is removed once torch.save returns,
        never renamed into place) and write nothing more."""
        self._abandon.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._error = None


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
    casing: dict[str, Any] | None = None  # the casing tables every checkpoint holds (rank 0's)

    @property
    def ckpt_dir(self) -> Path:
        """The run folder's checkpoints/."""
        return Path(self.cfg.train.out_dir) / "checkpoints"

    @property
    def eval_model(self) -> Transformer:
        """The weights that validate, go into best.pt and translate: the EMA when kept."""
        return cast(Transformer, self.ema.model) if self.ema else self.model

    def save(self, best: bool, metrics: dict[str, float] | None = None) -> None:
        """Write last.pt, best.pt when `best`, and after a validation (`metrics` given) step_N.pt
        with the oldest beyond train.keep_checkpoints deleted.

        Called on every rank (it gathers their RNG states); only rank 0 writes, in the
        background (`CheckpointWriter`: the state is copied now, `writer.wait()` waits).
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
            self.eval_model,
            self.cfg,
            step,
            self.source.epoch,
            self.tokenizers,
            metrics or {},
            self.casing,
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
