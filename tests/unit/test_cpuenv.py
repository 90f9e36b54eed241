"""The environment the `attn-mt` command sets for torch's CPU libraries (`attn_mt/cpuenv.py`):
the defaults (OpenMP threads that sleep at barriers among them), a user's own value kept, and
the kernel caches' memory bounded by them."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from attn_mt import cpuenv
from attn_mt.kernels import packing_available

# In a fresh process (the libraries read the caches' capacity once): oneDNN float32 products of
# `warm` shapes fill the caches, then `more` new shapes; printed: the C heap's live MiB (glibc's
# mallinfo2) that the new shapes added.
GROWTH = """
import ctypes, json, sys
import torch
from attn_mt.kernels import onednn_linear

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
        "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
torch.set_num_threads(1)
weight, bias = torch.randn(256, 64), torch.zeros(256)
warm, more = int(sys.argv[1]), int(sys.argv[2])
for rows in range(100, 100 + warm):
    onednn_linear(torch.randn(rows, 64), weight, bias)
before = libc.mallinfo2().uordblks
for rows in range(100 + warm, 100 + warm + more):
    onednn_linear(torch.randn(rows, 64), weight, bias)
print(json.dumps((libc.mallinfo2().uordblks - before) / 2**20))
"""


def test_defaults_are_set_and_a_users_value_kept():
    environ = {"LRU_CACHE_CAPACITY": "7", "OMP_WAIT_POLICY": "ACTIVE"}
    cpuenv.set_cpu_environment(environ)
    assert environ == {
        "THP_MEM_ALLOC_ENABLE": "1",
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(cpuenv.KERNEL_CACHE),
        "LRU_CACHE_CAPACITY": "7",
        "OMP_WAIT_POLICY": "ACTIVE",
    }
    busy: dict[str, str] = {}
    cpuenv.set_cpu_environment(busy, busy=True)
    assert busy["OMP_WAIT_POLICY"] == "PASSIVE"  # threads sleep at barriers: a busy machine
    idle: dict[str, str] = {}
    cpuenv.set_cpu_environment(idle, busy=False)
    assert "OMP_WAIT_POLICY" not in idle  # libgomp's spinning wait: an idle machine's speed
    spun = {"GOMP_SPINCOUNT": "1000"}
    cpuenv.set_cpu_environment(spun, busy=True)
    assert "OMP_WAIT_POLICY" not in spun  # the user's own wait is kept


def test_a_busy_machine_is_one_with_another_process_runnable_in_every_read() -> None:
    def reads(*texts: str):
        it = iter(texts)
        return lambda: next(it)

    assert not cpuenv.machine_busy(reads(*["1.50 0.30 0.25 1/312 4242\n"] * 3))  # alone
    assert cpuenv.machine_busy(reads(*["0.12 0.30 0.25 2/312 4242\n"] * 3))  # one more
    moment = ["0.1 0 0 3/312 1", "0.1 0 0 1/312 1", "0.1 0 0 3/312 1"]
    assert not cpuenv.machine_busy(reads(*moment))  # a process of a moment
    assert not cpuenv.machine_busy(reads("garbage"))


def test_the_command_sets_them_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if k not in cpuenv.DEFAULTS}
    code = (
        "import importlib, os, sys\n"
        "from attn_mt.cpuenv import DEFAULTS\n"
        "command = importlib.import_module('attn_mt.cli.app')  # the module, not its Typer app\n"
        "sys.argv = ['attn-mt', '--help']\n"
        "try: command.main()\nexcept SystemExit: pass\n"
        "print({k: os.environ.get(k) for k in DEFAULTS}, 'torch' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    shown = done.stderr.strip().splitlines()[-1]
    assert shown == f"{cpuenv.DEFAULTS} False"


def growth_mib(env: dict[str, str], warm: int, more: int) -> float:
    done = subprocess.run(
        [sys.executable, "-c", GROWTH, str(warm), str(more)],
        env=env, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.skipif(
    not hasattr(ctypes.CDLL(None), "mallinfo2") or not packing_available(),
    reason="needs glibc's mallinfo2 and oneDNN's linear product in this torch build",
)
def test_the_kernel_caches_memory_stops_growing_with_new_shapes():
    """Past the bound, new shapes replace cached kernels: the heap grows by a small share of
    what the libraries' own capacity (1,024) lets it grow by over the same shapes."""
    env = {k: v for k, v in os.environ.items() if k not in cpuenv.DEFAULTS}
    warm, more = cpuenv.KERNEL_CACHE + 40, 300
    unbounded = growth_mib(env, warm, more)
    cpuenv.set_cpu_environment(env)
    bounded = growth_mib(env, warm, more)
    assert unbounded > 20  # each kernel kept holds memory: the bound has something to bound
    assert bounded < 0.2 * unbounded, (bounded, unbounded)


def test_others_running_is_the_machines_runnable_less_this_process_least_of_the_reads():
    reads = iter(["0.5 0.4 0.3 5/300 99", "0.5 0.4 0.3 3/300 99", "0.5 0.4 0.3 4/300 99"])
    assert cpuenv.others_running(read=lambda: next(reads), own=lambda: 2) == 1  # 3 - 2, the least
    assert cpuenv.others_running(read=lambda: "0 0 0 1/50 7", own=lambda: 2) == 0  # never below 0
    assert cpuenv.others_running(read=lambda: "garbled", own=lambda: 1) == 0  # unreadable: idle
    # This process alone on the real machine: its own runnable threads are not "others".
    assert cpuenv._own_running() >= 1  # the thread reading


def test_thread_sizer_gives_up_a_thread_for_each_core_taken_and_takes_it_back():
    """The server's worker: two threads on an idle 2-core machine, one beside a competitor (no
    barrier to spin at), two again once it ends; the machine looked at every `every` seconds."""
    threads = [2]
    others = [0]
    now = [0.0]
    sizer = cpuenv.ThreadSizer(
        lambda: threads[0],
        lambda n: threads.__setitem__(0, n),
        cores=2,
        every=0.5,
        others=lambda: others[0],
        clock=lambda: now[0],
        fixed=False,
    )
    assert sizer.adjust() == 2 and sizer.most == 2
    others[0] = 1
    now[0] = 0.2
    assert sizer.adjust() == 2  # not yet time to look
    now[0] = 0.6
    assert sizer.adjust() == 1 and threads == [1]
    others[0] = 3
    now[0] = 1.2
    assert sizer.adjust() == 1  # at least one
    others[0] = 0
    now[0] = 1.8
    assert sizer.adjust() == 2 and threads == [2]  # never more than it started with
    one = cpuenv.ThreadSizer(
        lambda: 1, lambda n: pytest.fail("set"), cores=8, others=lambda: 0, fixed=False
    )
    assert one.adjust() == 1  # OMP_NUM_THREADS=1 stays one


def test_thread_sizer_keeps_the_count_where_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """ATTN_MT_FIXED_THREADS=1 (the tests set it): the thread count never changes, whatever the
    machine runs; unset, the sizer sizes."""
    busy = {"get_threads": lambda: 2, "cores": 2, "every": 0.0, "others": lambda: 1}
    monkeypatch.setenv(cpuenv.FIXED_THREADS, "1")
    fixed = cpuenv.ThreadSizer(set_threads=lambda n: pytest.fail(f"set {n}"), **busy)
    assert fixed.fixed and fixed.adjust() == 2 and fixed.adjust() == 2
    monkeypatch.delenv(cpuenv.FIXED_THREADS)
    asked: list[int] = []
    sized = cpuenv.ThreadSizer(set_threads=asked.append, **busy)
    assert not sized.fixed and sized.adjust() == 1 and asked == [1]
