"""What a run's updates run through (`Forward`: the objective, in DDP across processes, eager
or compiled), and the options that make them faster without changing what they compute beyond
rounding, each chosen once as a run begins and recorded in last.pt (`TrainProgress`), so a
resumed run computes as it began (exact resume). The loop only asks:
- `eager_forward`: the `Forward` with no option taken;
- `choose_kernels`: what a CPU run's float32 linear layers multiply through, MKL or oneDNN
  (`kernels.py`: by timing both on this CPU, or as $ATTN_MT_FP32_PRODUCTS says);
- `choose_compiled`: train.compile, the `Forward` every batch runs through: torch.compile'd
  (`true`), eager (`false`), or as a timing at start-up says (`auto`).

`auto` times a few forward and backward passes of the run's first batches each way and keeps
the faster; the timing runs under `torch.random.fork_rng`, its gradients are dropped and the
optimizer never sees them, so the run trains exactly as it would have with the chosen mode
asked for outright. The compiled mode compiles the loss's chunk too (`SmoothedObjective.fuse`):
it runs outside the model's graph, since its chunk loop depends on the token count. Both
compile with the device's Inductor settings (`precision.INDUCTOR_OPTIONS`). Rows and lengths of
a batch are marked dynamic (`vary_batch_shape`), so one graph serves every bucketed batch
shape. A compilation that fails (an unsupported backend, a missing compiler) is one warning
line and the run goes on eagerly.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from attn_mt import distributed
from attn_mt.config.schema import Config
from attn_mt.data.batching import Batch
from attn_mt.kernels import choose_products, route_through_onednn
from attn_mt.model.loss import SmoothedObjective
from attn_mt.model.transformer import Transformer
from attn_mt.precision import autocast_context, inductor_options
from attn_mt.train.state import TrainProgress, fork_rng

log = logging.getLogger("attn_mt")

TIMED_UPDATES = 3  # per mode, after one untimed update (which compiles)
# No buffer syncs before each forward: the only buffers are the fixed positional tables, equal on
# every rank, and they grow on demand (a rank's longer batch would change the shape). torch 2.13
# names the setting `forward_sync_buffers` (it still syncs once at start-up, where the tables are
# equal) and warns on each rank at the older `broadcast_buffers`.
NO_BUFFER_SYNC: dict[str, Any] = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)


class _NoProfilerRangeNote(logging.Filter):
    """Drops Dynamo's note that it leaves a profiler range out of the graph: DDP's forward
    opens one, so a compiled run under torchrun printed the note once per rank, a warning
    about nothing the user can change (the range only labels profiler traces)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Profiler record function")


logging.getLogger("torch._dynamo.variables.ctx_manager").addFilter(_NoProfilerRangeNote())


def choose_kernels(
    model: Transformer,
    cfg: Config,
    progress: TrainProgress,
    device: torch.device,
    dtype: torch.dtype | None,
    world: distributed.World,
) -> None:
    """What a run's float32 linear layers multiply through (`kernels.choose_products`, on rank
    0 for every rank: decided as a run begins, kept on resume), recorded in
    `progress.matmul_backend`; `model` routed through oneDNN where that is the answer. Only
    float32 on a CPU, not compiled, is eligible."""
    eligible = device.type == "cpu" and dtype is None and cfg.train.compile == "false"
    d_model, d_ff, vocab = cfg.model.d_model, cfg.model.d_ff, model.output.out_features
    shapes = ((d_model, d_ff), (d_ff, d_model), (d_model, vocab))
    recorded = progress.matmul_backend
    backend = distributed.from_main(lambda: choose_products(recorded, eligible, shapes), world)
    if backend == "onednn":
        route_through_onednn(model)
    progress.matmul_backend = backend


@dataclass
class Forward:
    """What an update runs each batch through: `module`, the objective (in DDP across
    processes), compiled or not, under autocast in `dtype` (None: float32)."""

    objective: SmoothedObjective
    module: nn.Module
    dtype: torch.dtype | None = None
    compiled: bool = False

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The summed label-smoothed loss and NLL of `batch` (on the objective's device)."""
        if self.compiled:
            vary_batch_shape(batch)
        with autocast_context(batch.src.device, self.dtype):
            self.objective.tokens = batch.num_tgt_tokens
            return self.module(batch.src, batch.tgt_in, batch.tgt_out)


def eager_forward(
    objective: SmoothedObjective, world: distributed.World, dtype: torch.dtype | None
) -> Forward:
    """The `Forward` of a run that takes no speed option: the objective run eagerly, in DDP
    across processes."""
    module: nn.Module = objective
    if world.distributed:
        device = next(objective.parameters()).device
        ids = [device.index] if device.type == "cuda" else None
        # The gradients are views into DDP's buckets: no copy in and out of them per update.
        module = DistributedDataParallel(
            objective, device_ids=ids, gradient_as_bucket_view=True, **NO_BUFFER_SYNC
        )
    return Forward(objective, module, dtype)


@dataclass
class CompileChoice:
    """How a run's updates run, and the timing behind an `auto` choice (ms per update)."""

    mode: str  # eager | compiled
    why: str  # asked | resumed | measured | failed
    eager_ms: float | None = None
    compiled_ms: float | None = None
    compile_seconds: float | None = None
    tokens: int = 0  # target tokens of the timed update (this rank's)

    def describe(self, setting: str) -> str:
        """The train.log line."""
        line = f"train.compile {setting}: {self.mode} ({self.why}"
        if self.eager_ms is not None and self.compiled_ms is not None:
            speeds = [
                1000 * self.tokens / ms if ms else 0.0 for ms in (self.eager_ms, self.compiled_ms)
            ]
            line += (
                f"; forward+backward {self.eager_ms:.1f} ms/update eager ({speeds[0]:.0f} tgt "
                f"tok/s), {self.compiled_ms:.1f} ms/update compiled ({speeds[1]:.0f} tgt tok/s), "
                f"compiling took {self.compile_seconds:.1f} s"
            )
        return line + ")"


def vary_batch_shape(batch: Batch) -> None:
    """Tell torch.compile that rows and lengths (dims 0 and 1 of src, tgt_in and tgt_out) vary, so
    that one graph serves every batch shape. Left to itself it compiles the first shape as
    fixed, then again with those dims dynamic, and ties lengths that happened to be equal
    (duck sizing), a recompile when they differ. A dim of size 1 still gets its own graph."""
    for tokens in (batch.src, batch.tgt_in, batch.tgt_out):  # (B, S), (B, T), (B, T)
        torch._dynamo.maybe_mark_dynamic(tokens, 0)
        torch._dynamo.maybe_mark_dynamic(tokens, 1)


def choose_compiled(
    eager: Forward,
    setting: str,
    progress: TrainProgress,
    batches: Sequence[Batch],
    world: distributed.World,
) -> Forward:
    """The `Forward` the updates run as train.compile `setting` says (`compile_choice`), the
    mode recorded in `progress.compiled` and said in train.log."""
    forward, choice = compile_choice(setting, progress.compiled, eager, batches, world)
    progress.compiled = choice.mode
    log.info("%s", choice.describe(setting))
    return forward


def compile_choice(
    setting: str,
    recorded: str,
    eager: Forward,
    batches: Sequence[Batch],
    world: distributed.World,
) -> tuple[Forward, CompileChoice]:
    """`eager` or it compiled, and why: train.compile `setting` (auto|true|false); with `auto`,
    the mode the run `recorded` when it began ('' for none: then timed on `batches`, one
    update's, on the device). `true` and `false` are obeyed on resume too. A benchmark compiles
    a `loop.UpdateStep` as the trainer does with
    `step.forward = compile_choice("true", "", step.forward, batches, World())[0]`."""
    resumed = recorded if setting == "auto" else ""
    if setting == "false" or resumed == "eager":
        return eager, CompileChoice("eager", "resumed" if resumed else "asked")
    measure = setting == "auto" and not resumed
    objective, compiled = eager.objective, eager
    device = next(objective.parameters()).device

    def timed(forward: Forward, updates: int) -> float:
        objective.fuse(forward.compiled)  # the compiled model with its loss compiled too
        return timed_passes(forward, batches, updates)

    try:  # the first call compiles: a failure shows here
        options = inductor_options(device.type) or None  # None: what any backend takes
        module = cast(nn.Module, torch.compile(eager.module, options=options))
        compiled = dataclasses.replace(eager, module=module, compiled=True)
        seconds = timed(compiled, 1)
        modes = (eager, compiled) if measure else ()
        times = [timed(m, TIMED_UPDATES) for m in modes] or [0.0, 0.0]
        failed = 0.0
    except Exception as err:  # noqa: BLE001 - any compiler failure means: run eagerly
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        log.warning("torch.compile failed (%s: %s); training eagerly", type(err).__name__, reason)
        seconds, times, failed = 0.0, [0.0, 0.0], 1.0
    # Every rank takes the same decision: the ranks' mean times, any rank's failure.
    shared = distributed.sum_to_device([*times, seconds, failed], world, device)  # NCCL: on GPU
    eager_ms, compiled_ms, seconds, failed = (shared / world.size).tolist()
    if failed:
        choice = CompileChoice("eager", "failed")
    elif not measure:
        choice = CompileChoice("compiled", "resumed" if resumed else "asked")
    else:
        faster = compiled_ms < eager_ms
        choice = CompileChoice("compiled" if faster else "eager", "measured", eager_ms, compiled_ms)
        choice.compile_seconds = seconds
        choice.tokens = sum(batch.num_tgt_tokens for batch in batches)
    objective.fuse(choice.mode == "compiled")  # the loss is compiled with the model, only
    return (compiled if choice.mode == "compiled" else eager), choice


def timed_passes(forward: Forward, batches: Sequence[Batch], updates: int) -> float:
    """Milliseconds per update of `updates` forward and backward passes over `batches` through
    `forward` (for one update, the first: seconds). The RNG is left as it was and the gradients
    are dropped, so training goes on as if this had not run."""
    params = list(forward.objective.parameters())
    device = params[0].device
    with fork_rng(device):
        _synchronize(device)
        start = time.perf_counter()
        for _ in range(updates):
            for batch in batches:
                loss, _ = forward(batch)
                (loss / batch.num_tgt_tokens).backward()
        _synchronize(device)
        took = time.perf_counter() - start
    for param in params:
        param.grad = None
    return took if updates == 1 else 1000 * took / updates


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
