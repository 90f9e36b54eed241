"""Who this process is among torchrun's processes (`World`), as its environment variables say.
No torch here: the command line asks (`is_main_process`) before it imports torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from attn_mt.errors import UserError


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


def is_main_process() -> bool:
    """Whether this process is rank 0, or the only one; True where torchrun's variables are
    malformed, which `world_from_env` reports as one line once a command starts."""
    try:
        return world_from_env().is_main
    except UserError:
        return True
