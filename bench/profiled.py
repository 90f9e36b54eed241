"""How a window of updates is watched: the phases of each update as the host queues them
(`Phases`), how far the host ran ahead of the device, and a window under torch.profiler with
the tables and the Chrome trace it leaves (`profiled`). bench/step_profile.py reports them.
"""

from __future__ import annotations

import gzip
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import sync
from bench.steps import Turn
from bench.trace import kernel_kind, kernel_rows, load_events, table

WAITED_MS = 0.1  # a lead under this: the device had nothing queued (an event's launch: ~10 µs)


class Phases:
    """The phases of a window's updates as they are queued (a `bench.steps.Phase`): with
    `label`, each a profiler range, open until the next begins or `close`; with `marks` (a
    list, CUDA), a CUDA event recorded as it begins and the host's clock just after."""

    def __init__(self, label: bool = False, marks: list[tuple[float, Any]] | None = None):
        self.label, self.marks = label, marks
        self.open: Any = None  # the profiler range of the phase under way

    def __call__(self, name: str) -> None:
        self.close()
        if self.marks is not None:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((time.perf_counter(), event))
        if self.label:
            self.open = torch.profiler.record_function(name)
            self.open.__enter__()

    def close(self) -> None:
        """End the profiler range of the last phase."""
        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None

    def leads(self) -> list[float] | None:
        """`host_leads` of the marks (read once the device has finished them); None without."""
        if not self.marks:
            return None
        first = self.marks[0][1]
        return host_leads(
            [h for h, _ in self.marks], [first.elapsed_time(e) for _, e in self.marks]
        )


def host_leads(host_s: list[float], device_ms: list[float]) -> list[float]:
    """How far the host was ahead of the device at each mark, in ms: when the device reached
    the mark after the host queued it. Both clocks count from the first mark, queued onto an
    idle device. Near 0: the device had nothing else queued and waited on the host."""
    pairs = zip(host_s, device_ms, strict=True)
    return [device - 1e3 * (host - host_s[0]) for host, device in pairs]


def lead_figures(windows: list[dict]) -> dict:
    """Over the windows' marks (each window's first apart: its clocks' origin), the median
    lead of the host in ms and the share of marks at which the device waited on the host;
    None without CUDA."""
    leads = [lead for w in windows if w["leads"] for lead in w["leads"][1:]]
    if not leads:
        return {"host_lead_ms": None, "device_waited_share": None}
    waited = sum(lead < WAITED_MS for lead in leads) / len(leads)
    return {"host_lead_ms": float(np.median(leads)), "device_waited_share": waited}


def profiled(turn: Turn, batches: list, device: torch.device, out: Path, name: str) -> dict:
    """`turn` over `batches` under torch.profiler, each phase a range: kernels per step, the
    device's busy time per step and the profile's tables (`out`/NAME_profile.txt, with the
    kernel table of bench/trace.py on CUDA) and Chrome trace (NAME_trace.json.gz)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    phases = Phases(label=True)
    sync(device)
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        turn(batches, phases)
        phases.close()
        sync(device)
        wall = time.perf_counter() - start
    n, cuda = len(batches), device.type == "cuda"
    figures = device_figures(prof, n)
    write_tables(prof, n, wall, out, name, cuda)
    return {
        "steps": n,
        "profiled_wall_ms_per_step": 1e3 * wall / n,
        "aten_ops_per_step": figures["host_ops"] / n,
        "device_busy_ms_per_step": 1e3 * figures["busy"] / n if cuda else None,
        "kernels_per_step": figures["kernels"] / n if cuda else None,
        "copies_per_step": figures["copies"] / n if cuda else None,
        "kernel_ms_per_step": figures["by_kind"] or None,
    }


def device_figures(prof: Any, steps: int) -> dict[str, Any]:
    """From a profile's events: the host's aten operations, the device's kernels and copies,
    its busy seconds (the union of their intervals) and ms per step by kernel kind."""
    intervals, kernels, copies, host_ops = [], 0, 0, 0
    by_kind: dict[str, float] = {}
    for event in prof.profiler.kineto_results.events():
        if event.is_user_annotation():  # the labels' spans, on the GPU's timeline too
            continue
        if event.device_type() != torch.autograd.DeviceType.CUDA:
            host_ops += event.name().startswith("aten::")
            continue
        begin = event.start_ns()
        intervals.append((begin, begin + event.duration_ns()))
        kind = kernel_kind(event.name())
        by_kind[kind] = by_kind.get(kind, 0.0) + event.duration_ns() / 1e6 / steps
        if event.name().startswith(("Memcpy", "Memset")):
            copies += 1
        else:
            kernels += 1
    return {
        "host_ops": host_ops,
        "kernels": kernels,
        "copies": copies,
        "busy": union_ns(intervals) / 1e9,
        "by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
    }


def write_tables(prof: Any, steps: int, wall: float, out: Path, name: str, cuda: bool) -> None:
    """The profile's tables by device and by host time, the kernel table on CUDA, and its
    Chrome trace gzipped."""
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    averages = prof.key_averages()  # seconds to build on a long profile: once for both
    by_device = averages.table(sort_by=sort, row_limit=40, max_name_column_width=70)
    host = averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70)
    head = f"{steps} updates profiled, wall {wall:.3f} s"
    trace = out / f"{name}_trace.json"
    prof.export_chrome_trace(str(trace))
    try:  # a table to read, not a figure: its failing must not stop the profile's run
        by_kernel = kernel_rows(load_events(trace), steps)  # none on the CPU
        launches = f"\n\nkernels (read_trace.py)\n{table(by_kernel, 40)}" if by_kernel else ""
    except (ValueError, KeyError, TypeError) as err:
        launches = f"\n\nkernels: the trace could not be read ({err!r})"
    (out / f"{name}_profile.txt").write_text(
        f"{head}\n\nby device time\n{by_device}\n\nby host time\n{host}{launches}\n"
    )
    with trace.open("rb") as raw, gzip.open(str(trace) + ".gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)
    trace.unlink()


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """The length of the union of (begin, end) intervals."""
    total, end = 0, None
    for begin, stop in sorted(intervals):
        if end is None or begin > end:
            total += stop - begin
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total
