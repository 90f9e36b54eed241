"""Which input lines a `translate` process translates, and the one output of several processes.

`--shard I/N` takes the I-th of N contiguous parts of the input's L lines: lines
(I-1)*L//N to I*L//N (0-based, end excluded), so the parts differ by at most one line, an
N larger than L leaves some parts empty, and the N outputs concatenated are the whole output.
Under torchrun the lines (a shard's, or all) are cut the same way among the processes, rank r
taking part r + 1 of the world's size; each writes its own part (`jobs/partial.py`) and rank 0
joins them in rank order (`join_parts`), so the file is the one a single process writes.
Both need L before the first line is translated: a file is counted first, a stream (a pipe,
a FIFO) is read whole into a temporary file and counted there (`io.input_file`).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from datetime import timedelta
from typing import IO, Any

from attn_mt.errors import UserError
from attn_mt.world import World

BLOCK = 4 << 20  # bytes of a part sent to rank 0 at a time
# How long a process that has done its part waits for the others (the process group's time-out):
# the parts are near-equal in lines, not in time.
WAIT = timedelta(days=7)


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """`--shard I/N` as (I, N), checked: 1 <= I <= N."""
    if text is None:
        return None
    found = re.fullmatch(r"\s*(\d{1,9})\s*/\s*(\d{1,9})\s*", text)
    if found is None or not 1 <= int(found.group(1)) <= int(found.group(2)):
        raise UserError(
            f"--shard {text}: write it I/N, the I-th of N parts with 1 <= I <= N (e.g. 2/8)"
        )
    return int(found.group(1)), int(found.group(2))


def nth_part(start: int, stop: int, index: int, count: int) -> tuple[int, int]:
    """Lines [first, end) of the `index`-th (from 1) of `count` contiguous near-equal parts of
    lines [start, stop)."""
    size = stop - start
    return start + (index - 1) * size // count, start + index * size // count


@dataclass(frozen=True)
class Lines:
    """The input lines one process translates: [start, stop) from 0 (stop None: to the end)
    and why (the --shard given, this process's rank among `ranks`)."""

    start: int = 0
    stop: int | None = None
    shard: str | None = None
    rank: int = 0
    ranks: int = 1

    @property
    def count(self) -> int | None:
        return None if self.stop is None else self.stop - self.start

    def record(self) -> dict[str, Any]:
        """What a partial translation's record keeps of it (`--resume` compares it)."""
        return {
            "start": self.start,
            "stop": self.stop,
            "shard": self.shard,
            "rank": self.rank,
            "ranks": self.ranks,
        }

    @property
    def part_name(self) -> str:
        """The part's name in its partial file (`FILE.part2of4.partial`); "" for one process."""
        return f".part{self.rank + 1}of{self.ranks}" if self.ranks > 1 else ""


def lines_of(total: int | None, shard: tuple[int, int] | None, world: World) -> Lines:
    """This process's lines of an input of `total` lines (None: uncounted, which only one
    process translating the whole input may leave)."""
    if total is None:
        assert shard is None and not world.distributed, "count the input first"
        return Lines()
    start, stop = nth_part(0, total, *shard) if shard else (0, total)
    name = f"{shard[0]}/{shard[1]}" if shard else None
    if world.distributed:
        start, stop = nth_part(start, stop, world.rank + 1, world.size)
    return Lines(start, stop, name, world.rank, world.size)


def join_parts(part: IO[bytes], out: IO[bytes] | None, world: World) -> None:
    """Rank 0 writes every rank's part to `out` in rank order (its own read here, the others'
    sent to it in blocks); the other ranks send theirs (`out` None) and wait for it."""
    import torch.distributed as dist

    part.seek(0)
    if world.is_main:
        assert out is not None
        shutil.copyfileobj(part, out, BLOCK)
    for rank in range(1, world.size):
        while world.rank in (0, rank):
            box: list[Any] = [part.read(BLOCK) if world.rank == rank else None]
            if world.rank == rank:
                dist.send_object_list(box, dst=0)
            else:
                dist.recv_object_list(box, src=rank)
                assert out is not None
                out.write(box[0])
            if not box[0]:  # b"": that part is all sent
                break
