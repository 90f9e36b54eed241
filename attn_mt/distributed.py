"""torchrun / DistributedDataParallel plumbing: joining the process group, which device, and
the few collectives the training loop needs. A single process is world size 1 and every call
here is a no-op. Who this process is (`World`, `world_from_env`) lives in `attn_mt.world`,
without torch, so the command line can ask before torch is imported.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from attn_mt.errors import UserError
from attn_mt.world import World, world_from_env

T = TypeVar("T")

# How long a rank waits in a collective. Rank 0 alone trains SentencePiece and validates while
# the others wait at a barrier; NCCL's default (10 minutes) would end a run whose beam search
# over a large validation set takes longer.
TIMEOUT = timedelta(minutes=60)


def setup(device: torch.device, timeout: timedelta = TIMEOUT) -> tuple[World, torch.device]:
    """Join the process group torchrun describes (env RANK/WORLD_SIZE/LOCAL_RANK), if any, its
    collectives waiting up to `timeout`.

    NCCL with one GPU per local rank on CUDA, gloo on CPU.
    """
    world = world_from_env()
    if not world.distributed:
        return world, device
    if device.type == "cuda":
        if world.local_rank >= torch.cuda.device_count():
            raise UserError(
                f"local rank {world.local_rank} has no GPU ({torch.cuda.device_count()} visible); "
                "use --nproc_per_node no larger than the GPU count"
            )
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            device_id=(device if device.type == "cuda" else None),
            timeout=timeout,
        )
    return world, device


def teardown(world: World) -> None:
    """Leave the process group, and free it now.

    `destroy_process_group` only drops torch's own references; a DistributedDataParallel
    wrapper left in a reference cycle keeps the group alive until the garbage collector runs,
    which may be during the interpreter's shutdown. Gloo's worker threads, freeing a tensor
    there, ask for the GIL, which a finalizing interpreter answers by ending the thread: the
    rank aborts (`terminate called without an active exception`, SIGABRT) after a run that
    finished, and torchrun reports the run failed. Collected here, the group goes first.
    """
    if world.distributed and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
        gc.collect()


def to_device(values: list[float], device: torch.device) -> torch.Tensor:
    """`values` as a float64 tensor on `device`, copied without waiting for the GPU (from
    pinned memory; a plain copy to a GPU waits for all the work queued before it)."""
    tensor = torch.tensor(values, dtype=torch.float64)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor


def sum_to_device(values: list[float], world: World, device: torch.device) -> torch.Tensor:
    """Element-wise sums of `values` over all ranks, as a float64 tensor left on `device`."""
    tensor = to_device(values, device)
    if world.distributed:
        dist.all_reduce(tensor)
    return tensor


class _Done:
    """A collective that was never started (one process): nothing to wait for."""

    def wait(self) -> bool:
        return True


def all_reduce_async(tensor: torch.Tensor, world: World) -> Any:
    """Start summing `tensor` over all ranks in place; returns what to `wait()` on before
    reading it (NCCL: the waiting is the GPU's, the host goes on)."""
    if not world.distributed:
        return _Done()
    return dist.all_reduce(tensor, async_op=True)


def from_main(compute: Callable[[], T], world: World) -> T:
    """`compute()` run on rank 0 only, its result sent to every rank.

    A `UserError` it raises is raised on every rank, so all processes stop with the same one-line
    message instead of the others waiting for rank 0 until the time-out.
    """
    if not world.distributed:
        return compute()
    box: list[Any] = [None]
    if world.is_main:
        try:
            box[0] = (compute(), None)
        except UserError as err:
            box[0] = (None, err)
    dist.broadcast_object_list(box, src=0)
    value, error = box[0]
    if error is not None:
        raise error
    return value


def gather(value: T, world: World) -> list[T]:
    """`value` of every rank, in rank order, on every rank."""
    if not world.distributed:
        return [value]
    values: list[Any] = [None] * world.size
    dist.all_gather_object(values, value)
    return values


def barrier(world: World) -> None:
    """Wait for every rank."""
    if world.distributed:
        dist.barrier()


@contextlib.contextmanager
def process_group(
    device: torch.device, timeout: timedelta = TIMEOUT
) -> Iterator[tuple[World, torch.device]]:
    """`setup` on entry, `teardown` on exit, however the block ends."""
    world, device = setup(device, timeout)
    try:
        yield world, device
    finally:
        teardown(world)
