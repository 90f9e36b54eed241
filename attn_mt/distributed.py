"""torchrun / DistributedDataParallel plumbing: who am I, which device, and the few collectives
the training loop needs. A single process is world size 1 and every call here is a no-op.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from attn_mt.errors import UserError

T = TypeVar("T")

# How long a rank waits in a collective. Rank 0 alone trains SentencePiece and validates while
# the others wait at a barrier; NCCL's default (10 minutes) would end a run whose beam search
# over a large validation set takes longer.
TIMEOUT = timedelta(minutes=60)


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    local_rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0 validates, logs and writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def setup(device: torch.device) -> tuple[World, torch.device]:
    """Join the process group torchrun describes (env RANK/WORLD_SIZE/LOCAL_RANK), if any.

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
            timeout=TIMEOUT,
        )
    return world, device


def world_from_env() -> World:
    """This process's place as torchrun's variables give it; malformed or incomplete ones (set
    by hand, not by torchrun) are one line."""

    def number(name: str, default: int | None = None) -> int:
        value = os.environ.get(name)
        if value is None and default is not None:
            return default
        if value is None:
            raise UserError(f"WORLD_SIZE is set but {name} is not; start the run with torchrun")
        try:
            return int(value)
        except ValueError:
            raise UserError(f"{name}={value!r}: not a number; torchrun sets it") from None

    size = number("WORLD_SIZE", 1)
    if size == 1:
        return World()
    world = World(number("RANK"), number("LOCAL_RANK", 0), size)
    if not 0 <= world.rank < size or size < 1 or world.local_rank < 0:
        raise UserError(f"RANK={world.rank} WORLD_SIZE={size}: need 0 <= RANK < WORLD_SIZE")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise UserError(f"WORLD_SIZE={size} but {name} is not set; start the run with torchrun")
    return world


def teardown(world: World) -> None:
    """Leave the process group."""
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


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
def process_group(device: torch.device) -> Iterator[tuple[World, torch.device]]:
    """`setup` on entry, `teardown` on exit, however the block ends."""
    world, device = setup(device)
    try:
        yield world, device
    finally:
        teardown(world)
