"""The start-up stages a run announces in its log (`stage`): used by the data reading and the
loop alike, so it imports nothing from train/."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

log = logging.getLogger("attn_mt")


@contextlib.contextmanager
def stage(name: str, announce: bool = True) -> Iterator[None]:
    """Log a start-up stage as it begins, and its time when it took more than a second."""
    if announce:
        log.info("%s ...", name)
    begin = time.monotonic()
    yield
    seconds = time.monotonic() - begin
    if seconds > 1:
        log.info("%s: %.1f s", name, seconds)
