"""A long run's throughput and memory, minute by minute: attn-mt's own training loop (the
`Trainer`, with its validation, logs and checkpoints) beside a plain `torch.nn.Transformer` loop.

attn-mt trains for --minutes of its own training time (train.max_minutes, as `make train` does).
After every --chunk seconds of it, the reference model (bench/reference.py: the same sizes,
optimizer, loss and precision, through the plain step, bench/steps.py, since the Trainer's
update cannot train it) trains on a share of the very batches attn-mt just used,
so both see the same batch shapes and the machine's drift and neighbours hit both alike; the
run's wall time is about (1 + --reference-share) x --minutes plus validation. Each row gives
both models' target tokens/s (validation excluded), their ratio, the process's resident memory,
its page faults, the kernel's transparent-huge-page faults and Python's live object count.

    python scripts/bench_soak.py                       # 60 minutes of the shipped de->en config
    python scripts/bench_soak.py --minutes 10 --profile-at 1,8
    MALLOC_ARENA_MAX=2 python scripts/bench_soak.py    # allocator settings go in the environment
    python scripts/bench_soak.py --quick --config C    # seconds: rows of 2 s, chunks of 0.5 s

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from attn_mt.config.file import config_from_dict, load_config
from attn_mt.precision import resolve_device
from attn_mt.train.loop import Trainer
from attn_mt.train.setup import make_optimizer, setup
from bench.common import DEFAULT_CONFIG, hardware_name, sync, timed_window
from bench.reference import Reference
from bench.steps import PlainStep

# Environment variables that change how memory and kernels behave; read at process start.
KNOBS = ("THP_MEM_ALLOC_ENABLE", "MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_",
         "ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LD_PRELOAD", "OMP_NUM_THREADS")  # fmt: skip


def memory_counters() -> dict[str, float]:
    """Resident MiB, this process's minor/major page faults, the kernel's THP faults."""
    counters = {"rss_mib": float("nan"), "minflt": 0, "majflt": 0, "thp_fault_alloc": 0}
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        counters["rss_mib"] = pages * os.sysconf("SC_PAGE_SIZE") / 2**20
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        counters["minflt"], counters["majflt"] = int(stat[7]), int(stat[9])  # fields 10 and 12
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("thp_fault_alloc "):
                counters["thp_fault_alloc"] = int(line.split()[1])
    except OSError:
        pass
    return counters


class Soak:
    """Wraps a Trainer's `update` and batch source: times attn-mt's loop between updates (its own
    bookkeeping included; validation, which the run's clock counts in its phases, excluded),
    runs the reference chunk by chunk on the same batches, keeps rows."""

    def __init__(self, trainer: Trainer, args: argparse.Namespace, out: Path) -> None:
        self.trainer, self.args, self.out = trainer, args, out
        t = trainer.cfg.train
        torch.manual_seed(0)
        reference = Reference(trainer.cfg.model, trainer.tgt_tok.vocab_size).to(trainer.device)
        self.reference = PlainStep(reference, make_optimizer(reference, t), trainer.dtype,
                                   t.clip_norm, t.label_smoothing)  # fmt: skip
        self.update, self.next_batch = trainer.update, trainer.source.next
        # The trainer's methods, wrapped on this instance on purpose (mypy flags method assignment)
        trainer.update = self._update  # type: ignore[method-assign]
        trainer.source.next = self._next_batch  # type: ignore[method-assign]
        self.batches: list[Any] = []  # this chunk's, on the CPU
        self.chunk = {"attn_s": 0.0, "attn_tok": 0, "ref_s": 0.0, "ref_tok": 0}
        self.row = dict(self.chunk, steps=0)
        self.rows: list[dict[str, Any]] = []
        self.phases = 0.0  # the run clock's seconds in phases (validation, ...) at the last update
        self.updates = 0
        self.ref_warm = False
        self.profiles = sorted(float(m) for m in args.profile_at.split(",") if m.strip())
        self.profiled: list[str] = []
        self.profiling: tuple[str, profile, int] | None = None  # (name, profiler, updates done)
        self.ref_profile = ""  # the reference's next chunk is profiled under this name
        self.start = self.mark = time.perf_counter()
        self.row_start, self.counters = self.start, memory_counters()

    def _next_batch(self):
        batch = self.next_batch()
        self.batches.append(batch)
        return batch

    def _update(self):
        """attn-mt's update, timed from the end of the last one; the time the run's clock
        counted in its phases meanwhile (validation, its checkpoints, the loss alone) is taken
        out."""
        if self.profiling is None and (name := self._profile_due()):
            self.profiling = (name, profile(activities=[ProfilerActivity.CPU]), 0)
            self.profiling[1].start()
        taken = len(self.batches)
        result = self.update()  # launched; the trainer reads its figures one update later
        tokens = sum(batch.num_tgt_tokens for batch in self.batches[taken:])
        now, phases = time.perf_counter(), sum(self.trainer.clock.spent.values())
        loop_seconds = now - self.mark - (phases - self.phases)
        self.phases, self.updates = phases, self.updates + 1
        self.row["steps"] += 1
        if self.profiling is None:  # the profiler's overhead would count against attn-mt
            self.chunk["attn_s"] += loop_seconds
            self.chunk["attn_tok"] += tokens
        else:
            self._profile_step()
        if self.chunk["attn_tok"] and self.chunk["attn_s"] >= self.args.chunk:
            self._reference_chunk()
            self._end_chunk()
        self.mark = time.perf_counter()
        return result

    def finish(self) -> None:
        """Close the last, partial chunk and row (and a profile) once the run has ended."""
        if self.profiling:
            self.profiling[1].stop()
            self._write_profile(self.profiling[1], self.profiling[0], "attn-mt")
            self.ref_profile = self.profiling[0]
            self.profiling = None
        if self.batches:
            self._reference_chunk()
        self._end_chunk()
        if self.row["steps"]:
            self._end_row(time.perf_counter())

    def _reference_chunk(self) -> None:
        """Train the reference on the leading share of this chunk's batches, timed."""
        share = max(1, round(len(self.batches) * self.args.reference_share))
        device = self.trainer.device
        batches = [b.to(device) for b in self.batches[:share]]
        self.batches = []
        if not self.ref_warm:  # its first call sets kernels up: timed, it would read as slow
            self.reference(batches[:1])
            self.ref_warm = True
        seconds, tokens = timed_window(functools.partial(self.reference, batches), device)
        self.chunk["ref_s"] += seconds
        self.chunk["ref_tok"] += tokens
        if self.ref_profile:  # the same number of steps as attn-mt's profile, untimed
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                self.reference(batches[: self.args.profile_steps])
                sync(device)
            self._write_profile(prof, self.ref_profile, "nn.Transformer")
            self.ref_profile = ""

    def _end_chunk(self) -> None:
        for name in self.chunk:
            self.row[name] += self.chunk[name]
            self.chunk[name] = 0
        now = time.perf_counter()
        if self.row["steps"] and now - self.row_start >= self.args.row_seconds:
            self._end_row(now)

    def _end_row(self, now: float) -> None:
        counters, row = memory_counters(), self.row
        # A side with no timed tokens in the row (a profiled update, say) has no figure.
        attn = round(row["attn_tok"] / row["attn_s"], 1) if row["attn_tok"] else None
        ref = round(row["ref_tok"] / row["ref_s"], 1) if row["ref_tok"] else None
        entry = {
            "minute": round((now - self.start) / 60, 3),
            "step": self.updates,
            "steps": row["steps"],
            "attn_tok_s": attn,
            "ref_tok_s": ref,
            "ratio": round(attn / ref, 4) if attn and ref else None,
            "rss_mib": round(counters["rss_mib"], 1),
            **{k: counters[k] - self.counters[k] for k in ("minflt", "majflt", "thp_fault_alloc")},
            "py_objects": len(gc.get_objects()),
        }
        self.rows.append(entry)
        shown = {k: "n/a" if entry[k] is None else entry[k] for k in entry}
        print(f"{entry['minute']:>7.2f} {entry['step']:>7} {shown['attn_tok_s']:>10} "
              f"{shown['ref_tok_s']:>10} {shown['ratio']:>7} {entry['rss_mib']:>9.0f} "
              f"{entry['minflt']:>9} {entry['thp_fault_alloc']:>8} {entry['py_objects']:>9}",
              flush=True)  # fmt: skip
        self.counters, self.row_start = counters, now
        self.row = {k: 0 for k in self.row}

    def _profile_due(self) -> str:
        """'mN' once the wall time passes the first --profile-at minute N not yet profiled."""
        minutes = (time.perf_counter() - self.start) / 60
        due = [m for m in self.profiles if m <= minutes and f"m{m:g}" not in self.profiled]
        if not due:
            return ""
        self.profiled.append(f"m{due[0]:g}")
        return self.profiled[-1]

    def _profile_step(self) -> None:
        """Count one profiled update; after --profile-steps, write attn-mt's table."""
        assert self.profiling is not None  # called only while a profile is running
        name, prof, done = self.profiling
        if done + 1 < self.args.profile_steps:
            self.profiling = (name, prof, done + 1)
            return
        prof.stop()
        self._write_profile(prof, name, "attn-mt")
        self.profiling, self.ref_profile = None, name

    def _write_profile(self, prof: profile, name: str, model: str) -> None:
        """The operators by self CPU time, to profile_<minute>_<model>.txt."""
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
        path = self.out / f"profile_{name}_{model.replace('.', '_')}.txt"
        path.write_text(table + "\n")
        print(f"profile at {name[1:]} min ({model}): {path}", flush=True)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The first rows after warm-up (the first row) against the last: throughputs, their
    ratio and resident memory, and the change of each (last / first - 1)."""
    rows = rows[1:] if len(rows) > 2 else rows
    width = max(1, min(10, len(rows) // 2))
    result: dict[str, Any] = {"rows_per_window": width}
    for name, part in (("first", rows[:width]), ("last", rows[-width:])):
        result[name] = {}
        for key in ("attn_tok_s", "ref_tok_s", "ratio", "rss_mib", "py_objects"):
            values = [r[key] for r in part if r[key] is not None]
            result[name][key] = sum(values) / len(values) if values else None
    result["change"] = {
        key: result["last"][key] / result["first"][key] - 1
        if result["first"][key] and result["last"][key] is not None
        else None
        for key in result["first"]
    }
    return result


def main(argv: list[str] | None = None) -> None:
    """Parse the options, train with the reference in chunks, print the rows and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--minutes", type=float, default=60.0, help="attn-mt's training time")
    parser.add_argument("--steps", type=int, default=0, help="stop after N updates instead")
    parser.add_argument("--chunk", type=float, default=None, help="seconds of attn-mt per turn")
    parser.add_argument("--reference-share", type=float, default=0.25,
                        help="share of each chunk's batches the reference trains on")  # fmt: skip
    parser.add_argument("--row-seconds", type=float, default=None, help="seconds per row")
    parser.add_argument("--profile-at", default="", help="minutes, e.g. 5,30: profiler tables")
    parser.add_argument("--profile-steps", type=int, default=5, help="updates per profile")
    parser.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, as `attn-mt train --set`")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="rows of 2 s, chunks of 0.5 s")
    args = parser.parse_args(argv)
    if args.chunk is None:
        args.chunk = 0.5 if args.quick else 15.0
    if args.row_seconds is None:
        args.row_seconds = 2.0 if args.quick else 60.0
    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="bench-soak-") as scratch:
        out = Path(args.out or Path(scratch) / "run")
        raw = load_config(args.config, args.set).to_dict()
        raw["train"].update(out_dir=str(out), max_minutes=args.minutes, max_steps=args.steps)
        cfg = config_from_dict(raw)
        trainer = setup(cfg, device=resolve_device("auto"))
        out.mkdir(parents=True, exist_ok=True)
        soak = Soak(trainer, args, out)
        hardware = hardware_name(trainer.device)
        m = cfg.model
        print(f"{hardware}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
              f"{trainer.precision}; d={m.d_model} {m.encoder_layers}+{m.decoder_layers} layers, "
              f"batches of {cfg.train.batch_tokens} tokens")  # fmt: skip
        knobs = {k: os.environ[k] for k in KNOBS if k in os.environ}
        shown = ", ".join(f"{k}={v}" for k, v in knobs.items())
        print(f"environment: {shown or 'none of ' + ', '.join(KNOBS)}")
        print(f"{'minute':>7} {'step':>7} {'attn tok/s':>10} {'ref tok/s':>10} {'ratio':>7} "
              f"{'RSS MiB':>9} {'minflt':>9} {'THP flt':>8} {'objects':>9}")  # fmt: skip
        result = trainer.run()
        soak.finish()
        print(json.dumps({
            "bench": "soak", "hardware": hardware, "threads": torch.get_num_threads(),
            "torch": torch.__version__, "precision": trainer.precision,
            "config": args.config, "minutes": args.minutes, "steps": result.step,
            "environment": knobs,
            "profiles": soak.profiled, "summary": summary(soak.rows), "rows": soak.rows,
        }))  # fmt: skip
