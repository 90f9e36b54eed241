"""Fine-tuning speed and memory on a CPU: training target tokens/s and peak RSS of the opus-mt
shape (74M parameters, a 58,101-entry vocabulary) beside the default config's model (7.6M), in
bf16 and in fp32, each row an `attn-mt train` process of its own on Multi30k de-en.

opus-mt   a MarianMT folder of opus-mt-de-en's shapes and flags with random weights, built with
          transformers' own classes (`bench/marian.py`, ~15 s, kept in the work folder),
          imported with `attn-mt import` (its seconds and peak RSS are reported too), then
          trained with `--init-from` and configs/finetune_marian.yaml's training keys, as a
          fine-tuning run is;
default   configs/multi30k_de_en.yaml, trained from scratch.
Every row: --steps updates of train.batch_tokens (the config's, 4096), max_minutes off, one
validation at the end on 8 sentences (outputs cut at 8 tokens: the random model would run to
its 511), no step_N.pt. tokens/s is the median of metrics.jsonl's training windows after the
first (start-up, the first batches and validation are outside them); peak RSS is the train
process's, measured from a small wrapper (`bench.data.run`).

    python scripts/bench_finetune.py                     # 4 rows, 40 updates each
    python scripts/bench_finetune.py --steps 80 --threads 2
    python scripts/bench_finetune.py --quick             # the tiny opus-mt variant, 6 updates

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import tempfile
from pathlib import Path

import yaml

from bench.common import ROOT, cpu_name
from bench.data import ATTN_MT, run
from bench.marian import build_folder

PRECISIONS = ("bf16", "fp32")
PRESET = ROOT / "configs" / "finetune_marian.yaml"
DEFAULT = ROOT / "configs" / "multi30k_de_en.yaml"
# Every row: Multi30k de-en, one short validation at the end, no kept checkpoints.
COMMON = [
    "train.max_minutes=0",
    "train.valid_max_sentences=8",
    "train.samples=0",
    "train.keep_checkpoints=0",
    "decode.max_len_a=0",
    "decode.max_len_b=8",
]


def finetune_config(folder: Path) -> Path:
    """configs/finetune_marian.yaml with Multi30k de-en for its data (the training keys kept)."""
    raw = yaml.safe_load(PRESET.read_text(encoding="utf-8"))
    raw["data"] = {"dataset": "multi30k", "max_len": raw["data"].get("max_len", 128)}
    path = folder / "finetune_multi30k.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def imported_model(folder: Path, small: bool, cache: Path) -> tuple[Path, dict[str, float]]:
    """The opus-mt folder (built once) imported into a run folder: the run and the import's
    seconds and peak RSS."""
    name = "opus-mt-de-en" + ("-small" if small else "")
    marian = folder / name
    if not (marian / "config.json").is_file():
        build_folder(marian, "opus-mt", small=small)
    out = folder / f"{name}-run"
    shutil.rmtree(out, ignore_errors=True)
    seconds, rss = run([*ATTN_MT, "import", str(marian), "--out", str(out)], ROOT, cache)
    weights = sum(f.stat().st_size for f in marian.glob("*.safetensors")) / 2**20
    return out, {
        "import_s": round(seconds, 1),
        "import_peak_rss_mib": round(rss),
        "weights_mib": round(weights, 1),
    }


def train_row(
    name: str, args: list[str], precision: str, steps: int, folder: Path, cache: Path
) -> dict[str, object]:
    """One `attn-mt train` of `steps` updates in `precision`: its tokens/s and peak RSS."""
    out = folder / f"{name}-{precision}"
    shutil.rmtree(out, ignore_errors=True)
    sets = [
        *COMMON,
        f"train.out_dir={out}",
        f"train.precision={precision}",
        f"train.max_steps={steps}",
        f"train.eval_every={steps}",
        f"train.log_every={max(steps // 5, 1)}",
    ]
    command = [*ATTN_MT, "train", *args, "--device", "cpu"]
    seconds, rss = run([*command, *(f"--set={item}" for item in sets)], ROOT, cache)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [row["tokens_per_sec"] for row in rows if row["split"] == "train"]
    first = (out / "train.log").read_text().splitlines()[0]
    found = re.search(r"([\d,]+) parameters", first)
    return {
        "model": name,
        "precision": precision,
        "parameters": int(found.group(1).replace(",", "")) if found else None,
        "tokens_per_s": round(statistics.median(rates[1:] or rates)),
        "peak_rss_mib": round(rss),
        "wall_s": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> None:
    """Parse the options, build and import the opus-mt folder, train each row, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="updates per row")
    parser.add_argument("--threads", type=int, default=0, help="train.threads (0: torch's)")
    parser.add_argument("--dir", type=Path, help="work folder (default: a temp folder)")
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--quick", action="store_true", help="the tiny opus-mt, 6 updates")
    args = parser.parse_args(argv)
    steps = 6 if args.quick else args.steps
    folder = args.dir or Path(tempfile.mkdtemp(prefix="bench-finetune-"))
    folder.mkdir(parents=True, exist_ok=True)
    cache = folder / "cache"
    run_folder, imported = imported_model(folder, args.quick, cache)
    threads = [f"--set=train.threads={args.threads}"] if args.threads else []
    models = {
        "opus-mt": ["--config", str(finetune_config(folder)), "--init-from", str(run_folder)],
        "default": ["--config", str(DEFAULT)],
    }
    rows = [
        train_row(name, [*config, *threads], precision, steps, folder, cache)
        for name, config in models.items()
        for precision in args.precisions
    ]
    print(f"{cpu_name()}, {os.cpu_count()} cores; {steps} updates a row; work folder {folder}")
    print(f"import: {imported}")
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(
            " | ".join(
                f"{row[key]:,}" if isinstance(row[key], int) else str(row[key]) for key in keys
            )
        )
    record = {"cpu": cpu_name(), "machine": platform.machine(), "cores": os.cpu_count()}
    print(json.dumps({**record, "steps": steps, "import": imported, "rows": rows}))
