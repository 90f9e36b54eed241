"""The validation search shared among torchrun ranks: each rank translates its own slice of the
validation sentences and every rank gets the whole output back, in order, for rank 0 to score.

Rank r takes sentences r, r + size, r + 2 size, ...: sentences of every length on every rank,
so the ranks finish at about the same time. Greedy and beam search translate a sentence the
same way whatever else is in its batch (tests/unit/decode hold batched == one at a time), so
the output is the one a single process would give.
"""

from __future__ import annotations

from collections.abc import Callable

from attn_mt import distributed
from attn_mt.world import World


class Interrupted(Exception):
    """A signal came during validation."""


def shared_search(
    search: Callable[[list[str]], list[str]], sentences: list[str], world: World
) -> list[str]:
    """`search(sentences)`, each rank searching its slice; the whole output on every rank.

    A search `Interrupted` on one rank is `Interrupted` on every rank, raised after the gather,
    so that the ranks' collectives stay paired (the checkpoint written next gathers too).
    """
    if not world.distributed:
        return search(sentences)
    mine: list[str] | None
    try:
        mine = search(sentences[world.rank :: world.size])
    except Interrupted:
        mine = None
    shares = distributed.gather(mine, world)
    hyps = [""] * len(sentences)
    for rank, share in enumerate(shares):
        if share is None:
            raise Interrupted
        hyps[rank :: world.size] = share
    return hyps
