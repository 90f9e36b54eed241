"""`translate` under torchrun: what two processes gain over one, and where the rest goes.

    python scripts/bench_torchrun.py --model runs/multi30k_de_en [--lines 20000] [--rounds 2]

Every row is the real command, timed whole (start-up included), one OpenMP thread a process:

one process   `attn-mt translate -i IN -o OUT`
torchrun x2   `torchrun --standalone --nproc_per_node 2 -m attn_mt translate -i IN -o OUT`
two shards    `attn-mt translate --shard 1/2` and `--shard 2/2`, two plain processes started
              together: the machine's own scaling, with neither torchrun, its process group,
              nor the join (each part's time apart: how unequal the halves' work is)
start-up      the one process and torchrun on a one-line input: their fixed costs

Then the speed-up of torchrun (one process / torchrun x2) beside what the machine allows (one
process / two shards) and the start-up's share. Every output must equal the one process's
(the shards' concatenated). The input: the first --lines of the training sources of the
model's corpus (Multi30k: 29,000), or --src FILE; greedy unless --beam. A table, then one
JSON line. Rounds interleave the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROW_NAMES = ("one process", "torchrun x2", "two shards", "start-up, one", "start-up, torchrun")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A trained run folder or .pt checkpoint.")
    parser.add_argument("--src", help="Source lines (default: the corpus's training sources).")
    parser.add_argument("--lines", type=int, default=20000, help="Lines translated a row.")
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="Passes over every row.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Every row in each round, the outputs checked, then the report."""
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        source = folder / "in.txt"
        source.write_text("".join(line + "\n" for line in sources(args)), encoding="utf-8")
        one_line = folder / "one.txt"
        one_line.write_text(source.read_text(encoding="utf-8").split("\n", 1)[0] + "\n")
        times: dict[str, list[float]] = {name: [] for name in ROW_NAMES}
        parts: list[list[float]] = []
        for _ in range(args.rounds):
            times["one process"].append(run([translate(args, source, folder / "one.out")]))
            times["torchrun x2"].append(
                run([translate(args, source, folder / "two.out", torchrun=True)])
            )
            halves = [translate(args, source, folder / f"part{i}.out", f"{i}/2") for i in (1, 2)]
            parts.append(each(halves))
            times["two shards"].append(max(parts[-1]))
            times["start-up, one"].append(run([translate(args, one_line, folder / "s1.out")]))
            times["start-up, torchrun"].append(
                run([translate(args, one_line, folder / "s2.out", torchrun=True)])
            )
            check_outputs(folder)
            print(f"round {len(parts)}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in
                  times.items()), file=sys.stderr)  # fmt: skip
    report(args, times, parts)


def sources(args: argparse.Namespace) -> list[str]:
    """The input lines: --src, or the model's corpus's training sources; the first --lines."""
    import attn_mt
    from attn_mt.data.corpora import train_corpora
    from attn_mt.data.text import read_lines

    if args.src:
        lines = read_lines(args.src)
    else:
        corpus = train_corpora(attn_mt.load(args.model, device="cpu").config.data)[0]
        if corpus.src is None:
            sys.exit("bench_torchrun: the model's corpus names no training sources; give --src")
        lines = read_lines(corpus.src)
    return lines[: args.lines]


def translate(
    args: argparse.Namespace, source: Path, out: Path, shard: str | None = None,
    torchrun: bool = False,
) -> list[str]:  # fmt: skip
    """The command line of one translation."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command = [sys.executable, *(launcher if torchrun else []), "-m", "attn_mt", "translate"]
    command += ["--model", args.model, "--input", str(source), "--output", str(out)]
    command += ["--beam", str(args.beam), "--device", "cpu"]
    return command + (["--shard", shard] if shard else [])


def environment() -> dict[str, str]:
    """One OpenMP thread a process, the package importable from this checkout."""
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root}


def run(commands: list[list[str]]) -> float:
    """Seconds until every command (started together) has exited; each must exit 0."""
    return max(each(commands))


def each(commands: list[list[str]]) -> list[float]:
    """Each command's own seconds, all started together."""
    start = time.perf_counter()
    procs = [subprocess.Popen(c, stderr=subprocess.PIPE, env=environment()) for c in commands]
    ended = [0.0] * len(procs)
    while not all(ended):
        for i, proc in enumerate(procs):
            if not ended[i] and proc.poll() is not None:
                ended[i] = time.perf_counter() - start
                if proc.returncode:
                    stderr = proc.stderr.read().decode() if proc.stderr else ""
                    sys.exit(f"bench_torchrun: {' '.join(commands[i])} failed:\n{stderr[-2000:]}")
        time.sleep(0.01)
    return ended


def check_outputs(folder: Path) -> None:
    """torchrun's output and the shards' concatenated equal the one process's."""
    one = (folder / "one.out").read_bytes()
    halves = (folder / "part1.out").read_bytes() + (folder / "part2.out").read_bytes()
    if (folder / "two.out").read_bytes() != one or halves != one:
        sys.exit("bench_torchrun: the outputs differ from one process's")


def report(args: argparse.Namespace, times: dict[str, list[float]], parts) -> None:
    """The medians, the speed-ups, the start-up's share; one JSON line."""
    from bench.common import cpu_name

    median = {name: statistics.median(values) for name, values in times.items()}
    one, two, shards = median["one process"], median["torchrun x2"], median["two shards"]
    halves = [statistics.median(p[i] for p in parts) for i in (0, 1)]
    print(f"{cpu_name()}, {len(os.sched_getaffinity(0))} cores; {args.lines} lines, beam "
          f"{args.beam}, one thread a process; medians of {args.rounds} round(s)")  # fmt: skip
    for name, seconds in median.items():
        print(f"{name:<20}{seconds:>9.2f} s")
    print(f"{'shards apart':<20}{halves[0]:>9.2f} s and {halves[1]:.2f} s")
    figures = {
        "torchrun_speedup": round(one / two, 3),
        "machine_speedup": round(one / shards, 3),  # two processes with no torchrun at all
        "torchrun_over_shards": round(two / shards, 3),
        "startup_extra_s": round(median["start-up, torchrun"] - median["start-up, one"], 2),
        "halves_ratio": round(max(halves) / min(halves), 3),
    }
    print(f"torchrun x2: {figures['torchrun_speedup']:.2f}x one process; two plain processes "
          f"{figures['machine_speedup']:.2f}x; torchrun's start-up "
          f"{figures['startup_extra_s']:+.1f} s over one process's")  # fmt: skip
    setting = {"model": args.model, "lines": args.lines, "beam": args.beam, "cpu": cpu_name()}
    rounded = {name: round(value, 2) for name, value in median.items()}
    print(json.dumps({"bench": "torchrun", **setting, "seconds": rounded, **figures}))
