"""What one crafted long line costs `attn-mt clean`: its time and peak memory against the line's
length, for the line shapes that once cost quadratic time or memory growing with the line.

Each row cleans a small corpus (as many ordinary pairs as a chunk of the filters' pool holds,
then the crafted pair, which ends that chunk, then 100 more) with the rule the shape aims at, in
a process of its own (one worker: the peak is that process's resident memory):

- `address`: N word characters and an "@" before an ordinary sentence (`markup`: the e-mail
  pattern read the run from each of its starts);
- `bars`: a menu bar's " | " before N word characters (`markup`: the same pattern, at every
  start of the run);
- `langid`: both sides N characters of ordinary text (`langid`: its byte grid grew with the
  longest line times a chunk's lines).

Linear time shows as seconds that double with N (less the start-up); bounded memory as a peak
that stays flat.

    python scripts/bench_clean_lines.py [--lengths 10000,20000,40000,80000] [--shapes ...]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from attn_mt.data.pool import CHUNK_CHARS
from bench.common import cpu_name

GERMAN = "Ein Hund läuft im Schnee und ein Kind wirft einen roten Ball."
ENGLISH = "A dog runs in the snow and a child throws a red ball."
SHAPES = {  # shape -> (the rule it aims at, its source of N characters, its target)
    "address": ("markup", lambda n: "a" * n + "@ " + GERMAN, lambda n: ENGLISH),
    "bars": ("markup", lambda n: " | " + "a" * n + " " + GERMAN, lambda n: ENGLISH),
    "langid": (
        "langid",
        lambda n: (GERMAN + " ") * (n // (len(GERMAN) + 1)),
        lambda n: (ENGLISH + " ") * (n // (len(ENGLISH) + 1)),
    ),
}
# Runs `attn-mt clean` ARGS in this process and prints its peak resident memory in KiB (Linux's
# ru_maxrss) and seconds: a process of its own per row, so the peak is that row's.
MEASURE = """
import resource, sys, time
from attn_mt.cli import main
sys.argv = ["attn-mt", *sys.argv[1:]]
start = time.monotonic()
try:
    main()
except SystemExit as stop:
    if stop.code:
        raise
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic() - start)
"""


def corpus(folder: Path, shape: str, length: int) -> Path:
    """The corpus of one row and its config (the shape's rule on), written in `folder`."""
    rule, source, target = SHAPES[shape]
    before = CHUNK_CHARS // (len(GERMAN) + len(ENGLISH)) - 1  # pairs in the crafted one's chunk
    src = [GERMAN] * before + [source(length)] + [GERMAN] * 100
    tgt = [ENGLISH] * before + [target(length)] + [ENGLISH] * 100
    files = {}
    for side, lines in (("de", src), ("en", tgt)):
        files[side] = folder / f"train.{side}"
        files[side].write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    pair = {"src": str(files["de"]), "tgt": str(files["en"])}
    config = {
        "data": {
            "src_lang": "de",
            "tgt_lang": "en",
            "train": pair,
            "valid": pair,
            "filters": {rule: True},
        },
    }
    path = folder / "clean.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def measured(shape: str, length: int) -> dict[str, Any]:
    """One row: `attn-mt clean` of the shape's corpus at `length`, in a process of its own."""
    with tempfile.TemporaryDirectory() as folder:
        config = corpus(Path(folder), shape, length)
        args = ["clean", "--config", str(config), "--out", f"{folder}/out", "--workers", "1"]
        found = subprocess.run(
            [sys.executable, "-c", MEASURE, *args], capture_output=True, text=True, check=False
        )
    if found.returncode:
        raise SystemExit(f"clean failed ({shape}, {length}):\n{found.stderr}")
    kib, seconds = found.stdout.split()[-2:]
    return {
        "shape": shape,
        "length": length,
        "seconds": float(seconds),
        "peak_mib": int(kib) / 1024,
    }


def main(argv: list[str] | None = None) -> None:
    """Parse the options, clean each shape at each length, print the table and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="10000,20000,40000,80000", help="N, comma-separated")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="of: " + ", ".join(SHAPES))
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    shapes = args.shapes.split(",")
    if unknown := [s for s in shapes if s not in SHAPES]:
        parser.error(f"--shapes: unknown {', '.join(unknown)}")
    print(f"attn-mt clean, one crafted pair in a chunk of ordinary ones ({cpu_name()})")
    print(f"{'shape':<8} {'rule':<7} {'N':>9} {'seconds':>8} {'peak MiB':>9}")
    rows = []
    for shape in shapes:
        for length in lengths:
            row = measured(shape, length)
            rows.append(row)
            print(
                f"{shape:<8} {SHAPES[shape][0]:<7} {length:>9,} {row['seconds']:>8.2f} "
                f"{row['peak_mib']:>9.0f}",
                flush=True,
            )
    print(json.dumps({"cpu": cpu_name(), "rows": rows}))
