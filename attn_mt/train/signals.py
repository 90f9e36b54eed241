"""Ctrl-C and SIGTERM while training (`StopSignals`, installed for the length of a run).

The first signal stops the run after the update in flight, which then saves last.pt, and says
so at once; a second stops at once: the checkpoint write in flight is abandoned (its temp file
is removed as the stack unwinds), so last.pt stays the last one completed. A second copy of the
same stop within REPEAT_SECONDS is the first delivered twice, not a second request.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from attn_mt.fileio import Terminated

log = logging.getLogger("attn_mt")
# A second signal sooner than this is the first one delivered again (a terminal signals torchrun
# and its workers, and torchrun passes its copy on to them), not a user asking to stop at once.
REPEAT_SECONDS = 1.0


class StopSignals:
    """The run's SIGINT/SIGTERM handlers; `name` is the first signal's name once one came."""

    def __init__(self, abandon: Callable[[], None]):
        self.name: str | None = None
        self.at = 0.0  # time.monotonic() of the first signal
        self._abandon = abandon  # gives up the checkpoint write in flight

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers in place for the block, the previous ones back however it ends."""
        previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle(self, signum: int, frame: Any) -> None:
        """The first SIGINT/SIGTERM notes the stop and says it saves; a second stops at once."""
        name = signal.Signals(signum).name
        again = "Ctrl-C" if signum == signal.SIGINT else name
        if self.name is None:
            self.name, self.at = name, time.monotonic()
            _say("%s: stopping: saving last.pt ... (%s again to stop at once)", name, again)
            return
        if time.monotonic() - self.at < REPEAT_SECONDS:
            return  # the same stop delivered twice: a terminal's Ctrl-C, then torchrun's copy
        _say("%s again: stopping at once; last.pt stays the last one completed", again)
        self._abandon()
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(128 + signum)


def _say(message: str, *args: Any) -> None:
    """Log from a signal handler, on a thread of its own: the handler may have interrupted the
    main thread inside a write to the same log stream, which a second write from that thread
    would re-enter (`RuntimeError: reentrant call`); the thread waits for the stream's lock."""
    speaker = threading.Thread(target=log.info, args=(message, *args), name="attn-mt signal")
    speaker.start()
    speaker.join(timeout=1.0)  # at once, unless the main thread holds the stream
