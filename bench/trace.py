"""The CUDA kernels of a torch.profiler trace, a row each, by device time.

Reads the Chrome trace that torch.profiler wrote (`scripts/profile_step.py`'s
`*_trace.json.gz`, or plain JSON) and prints each kernel (and memcpy and memset) with its
milliseconds and calls per update, its microseconds a call, its launch (grid x block, the most
frequent where they vary, with how many launches there were), its registers per thread, the
profiler's estimate of the occupancy it achieved (weighted by duration) and its kind
(`kernel_kind`):
the columns of docs/gpu.md's kernel tables. `profile_step.py` appends this table to each
profile's `_profile.txt` on CUDA (bench/profiled.py), so a GPU run's result needs no trace
brought back to be read.

    python scripts/read_trace.py runs/profile_step/compiled_bucketed_trace.json.gz --top 20

The updates are counted from the "forward+loss" ranges `profile_step.py` marks (one per
update, bench/steps.py); `--steps` for a trace without them.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path
from typing import Any

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")  # a trace's device work
STEP_RANGE = "forward+loss"  # the first range of each update profile_step.py marks
OCCUPANCY = "est. achieved occupancy %"

KERNEL_KINDS = {  # the first kind whose words a kernel's name holds (docs/gpu.md's breakdown)
    "attention": ("flash", "fmha", "attention"),  # first: their names hold cutlass::gemm
    "matrix products": ("nvjet", "gemm", "cublas", "cutlass_80_tensorop", "sm90_xmma"),
    "layer norm (fused)": ("layer_norm",),
    "loss chunk (fused)": ("log_softmax",),
    "dropout, ReLU (fused)": ("dropout", "relu", "threshold"),
    "clipping, AdamW": ("multi_tensor",),  # foreach kernels (torch's reduce_kernel: "other")
    "memcpy, memset": ("Memcpy", "Memset"),
}


def kernel_kind(name: str) -> str:
    """The KERNEL_KINDS entry of a CUDA kernel's name, or "other"."""
    for kind, words in KERNEL_KINDS.items():
        if any(word.lower() in name.lower() for word in words):
            return kind
    return "other"


def load_events(path: Path) -> list[dict[str, Any]]:
    """The trace's events (a .gz file is decompressed). ValueError if it is not a trace."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            trace = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a JSON trace ({err})") from err
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path} has no traceEvents: not a torch.profiler trace")
    return trace["traceEvents"]


def steps_in(events: list[dict[str, Any]]) -> int:
    """Updates in the trace: its host ranges named STEP_RANGE (not their copies on the GPU's
    timeline, `gpu_user_annotation`)."""
    return sum(e.get("name") == STEP_RANGE and e.get("cat") == "user_annotation" for e in events)


def _dims(values: Any) -> str:
    """[735, 8, 1] -> "735x8": a grid's or block's dimensions, trailing 1s dropped."""
    if not isinstance(values, list) or not values:
        return "?"
    dims = list(values)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return "x".join(str(d) for d in dims)


def kernel_rows(events: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """One row per kernel name of the device's events, by device time, largest first."""
    calls: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for event in events:
        if event.get("ph") == "X" and str(event.get("cat", "")).lower() in DEVICE_CATEGORIES:
            calls[event["name"]].append(event)
    rows = []
    for name, done in calls.items():
        total_us = sum(float(e.get("dur", 0.0)) for e in done)
        args = [e.get("args") or {} for e in done]
        launches = collections.Counter(  # none for a memcpy or memset
            f"{_dims(a['grid'])} x {_dims(a.get('block'))}" for a in args if "grid" in a
        )
        weighted = [
            (float(a[OCCUPANCY]), float(e.get("dur", 0.0)))
            for a, e in zip(args, done, strict=True)
            if OCCUPANCY in a
        ]
        weight = sum(d for _, d in weighted)
        registers = {a["registers per thread"] for a in args if "registers per thread" in a}
        rows.append({
            "name": name,
            "kind": kernel_kind(name),
            "ms_per_step": total_us / 1e3 / steps,
            "calls_per_step": len(done) / steps,
            "us_per_call": total_us / len(done),
            "launch": launches.most_common(1)[0][0] if launches else "",
            "launches": len(launches),
            "registers": max(registers) if registers else None,
            "occupancy_pct": sum(o * d for o, d in weighted) / weight if weight else None,
        })  # fmt: skip
    return sorted(rows, key=lambda row: -row["ms_per_step"])


def table(rows: list[dict[str, Any]], top: int, width: int = 60) -> str:
    """The `top` rows as text, with the total of all rows' milliseconds per update."""
    total = sum(row["ms_per_step"] for row in rows)
    head = (f"{'ms/update':>9} {'share':>6} {'calls':>6} {'us each':>8} {'grid x block':>16} "
            f"{'regs':>5} {'occ %':>6}  {'kind':<22} kernel")  # fmt: skip
    lines = [f"{len(rows)} kernels, {total:.3f} ms of device time per update", head]
    for row in rows[:top]:
        launch = row["launch"] + (f" (+{row['launches'] - 1})" if row["launches"] > 1 else "")
        regs = "" if row["registers"] is None else str(row["registers"])
        occupancy = "" if row["occupancy_pct"] is None else f"{row['occupancy_pct']:.0f}"
        share = 100 * row["ms_per_step"] / total if total else 0.0
        lines.append(
            f"{row['ms_per_step']:>9.3f} {share:>5.1f}% {row['calls_per_step']:>6.1f} "
            f"{row['us_per_call']:>8.1f} {launch:>16} {regs:>5} {occupancy:>6}  "
            f"{row['kind']:<22} {row['name'][:width]}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Read the trace named and print its kernel table (or every row as JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="a torch.profiler Chrome trace (.json[.gz])")
    parser.add_argument("--steps", type=int, default=None, help="updates in the trace "
                        f"(default: its {STEP_RANGE} ranges)")  # fmt: skip
    parser.add_argument("--top", type=int, default=25, help="rows printed")
    parser.add_argument("--json", action="store_true", help="every row as one JSON line")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    try:
        events = load_events(args.trace)
    except ValueError as err:
        parser.error(str(err))
    steps = args.steps or steps_in(events)
    if not steps:
        parser.error(f"no {STEP_RANGE!r} ranges in {args.trace}: give --steps")
    rows = kernel_rows(events, steps)
    if not rows:
        parser.error(f"{args.trace} holds no CUDA kernels (a CPU profile?)")
    print(json.dumps(rows) if args.json else table(rows, args.top))
