"""Batching across requests: one worker thread owns the model and decodes the lines of requests
that arrived close together as one batch.

A request is a `Job` (its lines, the model that translates them, the decode `Request` they
share, per-line constraints and prefixes). The worker takes the oldest job, waits at most
`max_wait` after its arrival for others of the same model with an equal Request, and decodes up
to the source tokens its `line_budget()` allows of them in one call, summed: a batch's work is
its sentences', as finished sentences leave the search. The call searches them as one batch
(its budget widened to the batch's padded size, up to WIDEST budgets), not in the length
buckets a file's lines are cut into: sentences of mixed lengths from many requests would make
several small searches one after another, each paying every step's fixed cost, where one
search pays it once (padding a source costs only cross-attention). A job larger than that
budget is decoded a budget at a time and goes to the back of the queue after each part, so a
long request does not hold short ones; a steered one (terms, a prefix, avoided words: a slower
search) is decoded a line at a time.
Anything else that uses the model (the attention map) runs on the same thread as a `Call`:
attention recording hooks into the model, so two threads must never decode at once. So does
loading and warming the models (`on_worker`): torch's CPU threads are an OpenMP pool of the
thread that first computes, and a second thread that computes gets a pool of its own; once
libgomp manages more threads than there are cores, every pool's threads sleep at each of a
search's thousands of barriers instead of spinning, and a search on two cores ran at half its
speed (docs/performance.md, "Paragraphs in the server"). One thread that computes keeps one pool.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from attn_mt.decode.request import Request
from attn_mt.errors import UserError

WIDEST = 4  # times its budget a batch's padded size may reach to be searched as one


class WorkerDown(RuntimeError):
    """The worker thread is not running (it stopped, or never started)."""


@dataclass(eq=False)
class Job:
    """One request's lines, decoded in parts; `future` gets the n-best lists of every line.
    Jobs of one `model` and equal `request`s (resolved, none per line) are decoded together."""

    lines: list[str]
    request: Request
    constraints: Sequence[Sequence[str]] | None
    prefixes: Sequence[str | None] | None
    sizes: list[int]  # source tokens of each line (at least 1)
    model: Any = None  # what translates the lines, handed to `decode`
    arrived: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)
    scheduled: int = 0  # lines handed to the worker so far
    results: list[Any] = field(default_factory=list)
    cancelled: bool = False  # the client went away or a part failed: drop the rest

    def cancel(self) -> None:
        """Decode no more of this job (lines already in a running batch finish)."""
        self.cancelled = True

    def joins(self, other: Job) -> bool:
        """Whether this job's lines may be decoded in one batch with `other`'s."""
        return (
            self.model is other.model
            and self.request == other.request
            and not (self.steered or other.steered)  # a steered line goes alone
        ) or self is other

    @property
    def steered(self) -> bool:
        """Whether its search is steered (terms, a prefix or avoided words)."""
        return bool(self.request.avoid or any(self.constraints or ()) or any(self.prefixes or ()))


@dataclass(eq=False)
class Call:
    """A function to run on the worker thread, in queue order."""

    function: Callable[[], Any]
    future: Future = field(default_factory=Future)


@dataclass
class Part:
    """Lines `start:end` of a job, in a batch."""

    job: Job
    start: int
    end: int


# decode(model, lines, request) -> n-best lists, one per line; the request carries the lines'
# constraints and prefixes and the number of the first (its job's own numbers)
Decode = Callable[[Any, list[str], Request], list[Any]]


class Batcher:
    """A queue of jobs and calls, served by one worker thread (see the module docstring)."""

    def __init__(self, decode: Decode, max_wait_ms: float):
        self.decode = decode
        self.max_wait = max_wait_ms / 1000
        self.batches = 0  # decode calls made, for /info
        self._queue: list[Job | Call] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="attn-mt-decode", daemon=True)

    def start(self) -> None:
        """Start the worker thread (if it is not started yet)."""
        if self._thread.ident is None:
            self._thread.start()

    def on_worker(self, function: Callable[[], Any]) -> Any:
        """Run `function` on the worker thread (started if need be) and return its result, or
        raise its exception: what loads or warms a model, so that only the worker computes."""
        self.start()
        return self.submit(Call(function)).result()

    def stop(self) -> None:
        """Let the worker finish what is queued, then end it (if it was started)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.ident is not None:
            self._thread.join()

    def alive(self) -> bool:
        """Whether the worker thread runs, or is yet to start."""
        return self._thread.ident is None or self._thread.is_alive()

    def submit(self, job: Job | Call) -> Future:
        """Queue a job or call; its future completes on the worker thread (`WorkerDown` if
        the worker has ended)."""
        if not self.alive():
            raise WorkerDown("the decode worker is not running; restart the server")
        with self._cond:
            self._queue.append(job)
            self._cond.notify_all()
        return job.future

    def _run(self) -> None:
        """The worker: wait for work, gather a batch, decode it; until stopped and empty."""
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                self._wait_for_company()
                work = self._take()
            if isinstance(work, Call):
                _settle(work.future, work.function)
            elif work:
                self._decode(work)

    def _wait_for_company(self) -> None:
        """Hold the oldest job until `max_wait` after its arrival or until its batch is full
        (called with the lock held; `wait` releases it)."""
        first = self._queue[0]
        if isinstance(first, Call):
            return
        deadline = first.arrived + self.max_wait
        while not self._stopping and not self._full(first):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._cond.wait(remaining)

    def _full(self, first: Job) -> bool:
        """Whether the queued lines that may join `first`'s fill a batch."""
        if first.steered:
            return True
        queued = sum(
            sum(job.sizes[job.scheduled :])
            for job in self._queue
            if isinstance(job, Job) and job.joins(first) and not job.cancelled
        )
        return queued >= first.request.line_budget()

    def _take(self) -> Call | list[Part]:
        """The next call, or the parts of the next batch: the oldest job's request, jobs in
        queue order, up to the budget (at least one line). A job cut short moves to the back."""
        self._queue = [w for w in self._queue if not (isinstance(w, Job) and w.cancelled)]
        if not self._queue:
            return []
        first = self._queue[0]
        if isinstance(first, Call):
            self._queue.pop(0)
            return first
        budget = 0 if first.steered else first.request.line_budget()  # steered: a line
        parts: list[Part] = []
        used = 0
        for job in self._queue:
            if not isinstance(job, Job) or not job.joins(first):
                continue
            end = job.scheduled
            # A line fits while the budget holds it; the batch's first line always fits.
            while end < len(job.lines) and (used + job.sizes[end] <= budget or used == 0):
                used += job.sizes[end]
                end += 1
            if end == job.scheduled:
                break
            parts.append(Part(job, job.scheduled, end))
            job.scheduled = end
        unfinished: list[Job | Call] = [p.job for p in parts if p.end < len(p.job.lines)]
        taken = {id(p.job) for p in parts}
        self._queue = [w for w in self._queue if id(w) not in taken] + unfinished
        return parts

    def _decode(self, parts: list[Part]) -> None:
        """Decode the parts as one batch; if the library refuses it (a bad constraint), decode
        each part alone, so that only the request at fault gets the error."""
        try:
            self._decode_together(parts)
        except UserError as err:
            if len(parts) == 1:
                _fail(parts[0].job, err)
                return
            for part in parts:
                try:
                    self._decode_together([part])
                except Exception as part_err:  # the request's error, handed to it
                    _fail(part.job, part_err)
        except Exception as err:  # a bug: this batch's requests get a 500; serving goes on
            for part in parts:
                _fail(part.job, err)

    def _decode_together(self, parts: Sequence[Part]) -> None:
        """One decode call over the parts' lines; each job gets its results back."""
        lines = [line for p in parts for line in p.job.lines[p.start : p.end]]
        request = replace(
            parts[0].job.request,
            batch_tokens=_one_search(parts),
            constraints=_joined(parts, "constraints", []),
            prefixes=_joined(parts, "prefixes", None),
            first_line=parts[0].start + 1 if len(parts) == 1 else 1,  # errors name the job's line
        )
        self.batches += 1
        found = self.decode(parts[0].job.model, lines, request)
        offset = 0
        for part in parts:
            count = part.end - part.start
            part.job.results.extend(found[offset : offset + count])
            offset += count
            if len(part.job.results) == len(part.job.lines) and not part.job.future.done():
                part.job.future.set_result(part.job.results)


def _one_search(parts: Sequence[Part]) -> int | None:
    """The batch budget (decode.batch_tokens) under which the library searches the parts'
    lines as one batch: theirs, doubled until it holds their padded size (lines x the
    longest), up to WIDEST times (beyond, the library cuts them as it would: a batch of many
    short lines and one long one stays bounded in memory)."""
    request = parts[0].job.request
    sizes = [size for p in parts for size in p.job.sizes[p.start : p.end]]
    budget = request.batch_tokens
    if budget is None:  # not resolved: the library's own
        return None
    padded, widest = len(sizes) * max(sizes), WIDEST * budget
    while budget < widest and replace(request, batch_tokens=budget).line_budget() < padded:
        budget *= 2
    return min(budget, widest)


def _joined(parts: Sequence[Part], name: str, empty: Any) -> list | None:
    """The per-line `name` lists of the parts joined (None if no part has any)."""
    if all(getattr(p.job, name) is None for p in parts):
        return None
    joined: list = []
    for p in parts:
        given = getattr(p.job, name)
        joined.extend(given[p.start : p.end] if given is not None else [empty] * (p.end - p.start))
    return joined


def _fail(job: Job, error: BaseException) -> None:
    """Hand `error` to the job and drop its remaining lines."""
    job.cancel()
    if not job.future.done():
        job.future.set_exception(error)


def _settle(future: Future, function: Callable[[], Any]) -> None:
    """Run `function`, its result or exception into `future`."""
    try:
        future.set_result(function())
    except Exception as err:  # handed to the caller
        future.set_exception(err)
