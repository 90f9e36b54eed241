"""The environment torch's CPU libraries read once, which the `attn-mt` command sets where it
starts, before torch loads (`import attn_mt` leaves the environment alone: a library user sets
these before Python starts). A value the user set is kept.

- `THP_MEM_ALLOC_ENABLE=1`: large CPU tensors on transparent huge pages; without it every fresh
  activation or logits buffer is page-faulted in 4 KiB at a time.
- `ONEDNN_PRIMITIVE_CACHE_CAPACITY` and `LRU_CACHE_CAPACITY` (ideep's cache, in front of
  oneDNN's): each keeps a kernel per matrix-product shape, with memory of its own. The token
  counts of length-bucketed batches change at every update, and a validation's search makes
  hundreds of shapes, so at the libraries' own capacity (1,024 each) a training run's memory
  grew with every new shape and its heap fragmented around the long-lived entries (figures:
  docs/performance.md, "Training memory"). KERNEL_CACHE still holds the products of one
  update of the default model, forward and backward, which reuse them.
- `OMP_WAIT_POLICY=PASSIVE` **where the machine is busy when the command starts** (another
  process runnable, `machine_busy`): a thread of torch's OpenMP pool (which
  MKL and oneDNN share) that reaches a barrier first then sleeps instead of spinning. libgomp
  spins some 300,000 times before it sleeps: on an idle machine that saves a wake-up at each
  of a search's thousands of small operations, but beside other busy processes the spinning
  thread burns the CPU time its partner needs to reach the barrier. Passive waits on an idle
  machine, and a short spin, each lost one side (figures: docs/performance.md, "A busy
  machine"). Intel's OpenMP reads the same variable.

A server runs for days, a distillation's translation for hours: the machine that was idle
when it started may be busy an hour later, when the spinning wait it kept costs a search several
times its time. `ThreadSizer` sizes torch's threads to the cores other processes leave free,
between batches (the server's worker, `sized_torch_threads` around a translation job's): one
thread has no barrier. A float sum split differently could in principle turn a search's
near-tie (what was measured: docs/guarantees.md, "The same outputs"): `ATTN_MT_FIXED_THREADS=1`
keeps the count fixed, for outputs that cannot depend on the machine's load (the tests set it,
and the sizing tests turn it off).
Training is not sized: its gradients' sums differ in their last bits between thread counts, and
a resumed run must equal a straight one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager

KERNEL_CACHE = 128  # kernels per cache
FIXED_THREADS = "ATTN_MT_FIXED_THREADS"  # "1": torch's thread count is never sized (ThreadSizer)
DEFAULTS = {
    "THP_MEM_ALLOC_ENABLE": "1",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(KERNEL_CACHE),
    "LRU_CACHE_CAPACITY": str(KERNEL_CACHE),
}


def set_cpu_environment(
    environ: MutableMapping[str, str] = os.environ, busy: bool | None = None
) -> None:
    """Set each of DEFAULTS in `environ` that is not set there already, and OMP_WAIT_POLICY
    PASSIVE where the machine is `busy` (None: `machine_busy()`) and the user set no wait."""
    for name, value in DEFAULTS.items():
        environ.setdefault(name, value)
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return
    if machine_busy() if busy is None else busy:
        environ["OMP_WAIT_POLICY"] = "PASSIVE"


def machine_busy(read=None, samples: int = 3) -> bool:
    """Whether other work runs on this machine now: a process runnable beside this one in each
    of `samples` reads of /proc/loadavg 10 ms apart (its fourth field, runnable/total, counts
    this one; the least of the reads, so that a process of a moment does not count). Not the
    load average: it trails the last minute's work by a minute. False where /proc/loadavg
    cannot be read. `read` returns the file's text (tests)."""

    def from_proc() -> str:
        with open("/proc/loadavg", encoding="ascii") as handle:
            return handle.read()

    read = read or from_proc
    try:
        least = None
        for i in range(samples):
            if i:
                time.sleep(0.01)
            running = int(read().split()[3].split("/")[0])
            least = running if least is None else min(least, running)
        return least is not None and least > 1
    except (OSError, ValueError, IndexError):
        return False


def others_running(read=None, own=None, samples: int = 3) -> int:
    """Threads of other processes runnable now: /proc/loadavg's runnable count less this
    process's own runnable threads, the least of `samples` reads 1 ms apart (a process of a
    moment does not count). 0 where /proc cannot be read. `read` and `own` (tests): the
    loadavg text and this process's runnable threads."""

    def from_proc() -> str:
        with open("/proc/loadavg", encoding="ascii") as handle:
            return handle.read()

    read, own = read or from_proc, own or _own_running
    least = None
    try:
        for i in range(samples):
            if i:
                time.sleep(0.001)
            others = int(read().split()[3].split("/")[0]) - own()
            least = others if least is None else min(least, others)
    except (OSError, ValueError, IndexError):
        return 0
    return max(least or 0, 0)


def _own_running() -> int:
    """This process's threads in state R (running or runnable)."""
    running = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat", encoding="ascii") as handle:
                stat = handle.read()
        except OSError:  # the thread ended
            continue
        running += stat[stat.rindex(")") + 2] == "R"
    return running


class ThreadSizer:
    """Torch's CPU threads sized to the free cores, for a long-running process (the server's
    decode worker): `adjust()` before each batch, on the thread that computes, looks at the
    machine at most every `every` seconds and sets `most` threads where no other process runs,
    fewer (at least one) for each core another process takes. `get_threads`, `set_threads`:
    torch's get_num_threads and set_num_threads (this module loads before torch); `others` and
    `clock`: tests'. `fixed` (default: $ATTN_MT_FIXED_THREADS is 1) keeps the count as it is,
    for outputs that cannot depend on the machine's load."""

    def __init__(
        self,
        get_threads: Callable[[], int],
        set_threads: Callable[[int], None],
        cores: int | None = None,
        every: float = 0.5,
        others: Callable[[], int] = others_running,
        clock: Callable[[], float] = time.monotonic,
        fixed: bool | None = None,
    ):
        self._get, self._set, self._others, self._clock = get_threads, set_threads, others, clock
        self.cores = cores or len(os.sched_getaffinity(0))
        self.every = every
        self.fixed = os.environ.get(FIXED_THREADS) == "1" if fixed is None else fixed
        self.most: int | None = None  # the threads asked for at the first adjust
        self._checked = -float("inf")

    def adjust(self) -> int:
        """Set the threads the free cores allow (if it is time to look); the threads now."""
        if self.most is None:
            self.most = self._get()
        if self.fixed:
            return self.most
        now = self._clock()
        if now - self._checked < self.every:
            return self._get()
        self._checked = now
        want = max(1, min(self.most, self.cores - self._others()))
        if want != self._get():
            self._set(want)
        return want


@contextmanager
def sized_torch_threads(every: float = 0.5) -> Iterator[ThreadSizer]:
    """A ThreadSizer of torch's threads for the block (call `adjust()` before each batch, on
    the thread that computes); torch's thread count at the start is set again after it."""
    import torch

    start = torch.get_num_threads()
    try:
        yield ThreadSizer(torch.get_num_threads, torch.set_num_threads, every=every)
    finally:
        if torch.get_num_threads() != start:
            torch.set_num_threads(start)
