"""A 2-core machine where other processes run, as `cpuenv.ThreadSizer` sees it, and the torch
threads each search of the block ran on (the sizing tests of `translate` and `evaluate`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch

from attn_mt import cpuenv
from attn_mt.decode.translator import Translator


@contextmanager
def beside_competitors(count: int) -> Iterator[list[int]]:
    """Torch on two threads of two cores, sized as if `count` other processes ran (looked at
    every batch); yields the threads each search ran on, and checks that two are given back
    after the block."""

    class Sizer(cpuenv.ThreadSizer):
        def __init__(self, get: Any, set_: Any, every: float = 0.5) -> None:
            super().__init__(get, set_, cores=2, every=0.0, others=lambda: count, fixed=False)

    before = torch.get_num_threads()
    search = Translator._search
    threads: list[int] = []

    def counted(self: Translator, *args: Any) -> Any:
        threads.append(torch.get_num_threads())
        return search(self, *args)

    torch.set_num_threads(2)
    try:
        with (
            mock.patch.object(cpuenv, "ThreadSizer", Sizer),
            mock.patch.object(Translator, "_search", counted),
        ):
            yield threads
        assert torch.get_num_threads() == 2, "the thread count given back"
    finally:
        torch.set_num_threads(before)
