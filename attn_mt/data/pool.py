"""Work spread over forked worker processes, results in order: the one pool of `prepare` and
`clean` (encoding, filtering). Ctrl-C and SIGTERM are acted on between results, so a stopped
command leaves no half-written pool pipe.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from attn_mt.errors import UserError
from attn_mt.fileio import Terminated

CHUNK = 20_000  # sentence pairs per task, at most
# Characters per task, at most: its message (at most 3 UTF-8 bytes a character for any common
# script) fits a pipe's 64 KiB. Pool.terminate() drains the task pipe once, then waits for the
# thread that fills it: one left halfway through a larger message, with the workers gone (a
# SIGTERM to the group), waited forever.
CHUNK_CHARS = 16_000


def worker_count(workers: int) -> int:
    """The processes `--workers N` asks for (0 = every core this process may run on); more
    than the cores is a UserError: they could not all start, and none would be faster."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    if workers > cores:
        raise UserError(
            f"--workers {workers}: this process may run on {cores} core(s); give at most "
            f"{cores} (0 = every core)"
        )
    return workers or cores


def chunks(
    pairs: Iterable[tuple[int, str, str]],
) -> Iterator[tuple[list[int], list[str], list[str]]]:
    """Numbered pairs (line, source, target) as tasks of at most `CHUNK` pairs and about
    `CHUNK_CHARS` characters: (lines, sources, targets)."""
    lines: list[int] = []
    src: list[str] = []
    tgt: list[str] = []
    chars = 0
    for line, s, t in pairs:
        lines.append(line)
        src.append(s)
        tgt.append(t)
        chars += len(s) + len(t)
        if len(src) == CHUNK or chars >= CHUNK_CHARS:
            yield lines, src, tgt
            lines, src, tgt, chars = [], [], [], 0
    if src:
        yield lines, src, tgt


def ordered_map(
    func: Callable[[Any], Any],
    tasks: Iterable[Any],
    workers: int,
    initializer: Callable[..., None],
    init_args: tuple[Any, ...],
) -> Iterator[Any]:
    """`func` (a module-level function: it is sent to the workers by name) over `tasks`, on
    `workers` forked processes each set up by `initializer(*init_args)`, the results in the
    order of the tasks; at most 2 tasks per worker are in flight. One worker: in this process.
    """
    if workers == 1:
        initializer(*init_args)
        yield from map(func, tasks)
        return
    with _signals_between_results() as received:  # from before the first fork
        # fork: the workers need no imports of their own (spawn would import torch in each),
        # and the initializer's arguments (a language model's tables) are shared, not copied
        context = multiprocessing.get_context("fork")
        pool = context.Pool(workers, _init_pool_worker, (initializer, *init_args))
        try:
            pending: collections.deque = collections.deque()
            for task in tasks:
                pending.append(pool.apply_async(func, (task,)))
                if len(pending) >= 2 * workers:
                    yield _result(pending.popleft(), received)
            while pending:
                yield _result(pending.popleft(), received)
        finally:
            pool.close()  # not terminate(): the workers ignore SIGTERM; their tasks are small
            pool.join()


def _init_pool_worker(initializer: Callable[..., None], *init_args: Any) -> None:
    # Ctrl-C and SIGTERM are the parent's to act on (a terminal or a scheduler signals the
    # whole group): a worker dying of one could leave a pool pipe half written, and the pool
    # would wait on it forever; the parent lets the tasks in flight end, then closes the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    initializer(*init_args)


@contextlib.contextmanager
def _signals_between_results() -> Iterator[list[int]]:
    """While a pool runs, Ctrl-C and SIGTERM are only noted (in the list yielded) and acted on
    between results, by the handler before (which raises): raised in the middle of the pool's
    own code, they could leave a lock held or a pipe half read that the pool then waits on."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    received: list[int] = []
    kept = [
        sig for sig in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(sig) != signal.SIG_IGN
    ]
    previous = {
        sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in kept
    }
    try:
        yield received
    except _Stopped:
        pass  # acted on below
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        handler = previous[signal.Signals(received[0])]
        if callable(handler):
            handler(received[0], None)  # KeyboardInterrupt; fileio.sigterm_unwinds's Terminated
        raise Terminated(128 + received[0])  # the results are incomplete: never go on


def _result(result: Any, received: list[int]) -> Any:
    """The result of a task, unless a signal comes first."""
    while not result.ready():
        if received:
            raise _Stopped
        result.wait(0.1)
    return result.get()


class _Stopped(Exception):
    """A SIGTERM came while the pool ran: end it, then act on the signal."""
