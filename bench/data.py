"""Data at scale: `attn-mt prepare` and the start of `attn-mt train`, 29k to 4.5M pairs.

The corpora are Multi30k de-en repeated and shuffled to each size (plain text). Per size:
- prepare: wall seconds of `attn-mt prepare` (SentencePiece + encoding, cold), sentences/s, the
  shards' size on disk, and the seconds of a second `prepare` that finds them up to date;
- train: seconds from the command to its first update (the `step 1` line of train.log) and the
  peak RSS of the process (measured from a small wrapper), for a short `attn-mt train`
  (2 updates, d=256);
- batches: how many batches/s the shard reader produces against how many the Trainer's own
  update of a d=256 model consumes (`UpdateStep`, one batch an update), in this process.
`--baseline-src DIR` also runs the train measurement with PYTHONPATH=DIR, a checkout of the old
code (`git worktree add /tmp/base 54df4a9`), which reads and encodes the text at every start; it
is started twice and the second start is reported (its SentencePiece cache is then warm).

    python scripts/bench_data.py --sizes 29000                  # quick
    python scripts/bench_data.py --baseline-src /tmp/base       # 29k and 1M, new and old
    python scripts/bench_data.py --largest --baseline-src /tmp/base   # also 4.5M (minutes)

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.common import ROOT, cpu_name

DEFAULT_SIZES = [29_000, 1_000_000]
LARGEST = 4_500_000
ATTN_MT = [sys.executable, "-m", "attn_mt"]


def multi30k(split: str, lang: str) -> list[str]:
    root = Path(os.environ.get("ATTN_MT_DATA") or ROOT.parent / "shared" / "data")
    with gzip.open(root / "multi30k" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as handle:
        return handle.read().splitlines()


def write_corpus(folder: Path, pairs: int) -> tuple[Path, Path]:
    """Multi30k de-en repeated, each copy shuffled, to `pairs` lines (written as a stream)."""
    src_path, tgt_path = folder / f"train{pairs}.de", folder / f"train{pairs}.en"
    if src_path.is_file() and tgt_path.is_file():
        return src_path, tgt_path
    base = list(zip(multi30k("train", "de"), multi30k("train", "en"), strict=True))
    rng = random.Random(pairs)
    with open(src_path, "w", encoding="utf-8") as src, open(tgt_path, "w", encoding="utf-8") as tgt:
        left = pairs
        while left:
            rng.shuffle(base)
            for de, en in base[: min(left, len(base))]:
                src.write(de + "\n")
                tgt.write(en + "\n")
            left -= min(left, len(base))
    return src_path, tgt_path


def write_config(folder: Path, pairs: int, name: str) -> Path:
    """A d=256 config (the default model) on the corpus of `pairs` pairs; 2 updates."""
    src, tgt = write_corpus(folder, pairs)
    valid = folder / "valid.de", folder / "valid.en"
    for path, lang in zip(valid, ("de", "en"), strict=True):
        path.write_text("\n".join(multi30k("val", lang)[:50]) + "\n", encoding="utf-8")
    raw = {
        "data": {
            "src_lang": "de",
            "tgt_lang": "en",
            "train": {"src": str(src), "tgt": str(tgt)},
            "valid": {"src": str(valid[0]), "tgt": str(valid[1])},
        },
        "tokenizer": {"vocab_size": 8000, "max_sentences": 200_000},
        "train": {
            "out_dir": str(folder / f"run-{name}-{pairs}"),
            "max_steps": 2,
            "log_every": 1,
            "eval_every": 1000,
            "batch_tokens": 4096,
            "threads": 2,
            "samples": 0,
        },
        "decode": {"max_len_a": 0.0, "max_len_b": 5},  # the final validation stays short
    }
    path = folder / f"{name}-{pairs}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# Run a command (argv[1:]) and print its peak RSS in KiB. A child's peak RSS counts the
# process it was forked from, so it is measured from this small process, not from the
# benchmark (torch loaded, a model trained), whose size would otherwise be reported.
WITH_PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(code)\n"
)


def run(args: list[str], pythonpath: Path, cache: Path) -> tuple[float, float]:
    """Run a command to its end: (wall seconds, peak RSS in MiB of that process)."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "ATTN_MT_CACHE": str(cache)}
    start = time.time()
    # cwd: `python -m attn_mt` imports the package of the working folder before PYTHONPATH.
    proc = subprocess.run(
        [sys.executable, "-c", WITH_PEAK_RSS, *args],
        env=env,
        cwd=pythonpath,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        sys.exit(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return time.time() - start, int(proc.stdout.split()[-1]) / 1024


def first_update(config: Path, pythonpath: Path, cache: Path) -> dict[str, float]:
    """Start `train` on a fresh run folder: seconds to its first update and peak RSS."""
    out = Path(yaml.safe_load(config.read_text())["train"]["out_dir"])
    if out.exists():
        subprocess.run(["rm", "-rf", str(out)], check=True)
    start = time.time()
    _, rss = run([*ATTN_MT, "train", "--config", str(config)], pythonpath, cache)
    lines = (out / "train.log").read_text().splitlines()
    line = next(ln for ln in lines if re.search(r" step 1(/\d+)? ", ln))  # new and old format
    stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return {"first_update_s": round(stamp - start, 2), "peak_rss_mib": round(rss)}


def batch_speed(config: Path, cache: Path) -> dict[str, float]:
    """Batches/s of the shard reader against batches/s of the Trainer's update of a d=256
    model (one batch an update, at the config's precision)."""
    os.environ["ATTN_MT_CACHE"] = str(cache)
    import torch

    from attn_mt.config.file import load_config
    from attn_mt.data.epochs import ShardBatches
    from attn_mt.data.prepare import prepare_shards
    from attn_mt.model.transformer import build_model
    from attn_mt.precision import resolve_precision
    from bench.steps import trainer_step, trainer_updates

    torch.set_num_threads(2)
    cfg = load_config(config)
    shards = prepare_shards(cfg)
    source = ShardBatches(shards, [1.0], cfg.train.batch_tokens, cfg.train.seed)
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < 3:
        source.next()
        count += 1
    produced = count / (time.perf_counter() - start)
    src_tok, tgt_tok = shards.tokenizers()
    model = build_model(cfg, src_tok.vocab_size, tgt_tok.vocab_size)
    precision = resolve_precision(cfg.train.precision, torch.device("cpu"))
    step = trainer_step(model, cfg.train, precision)
    batches = [source.next() for _ in range(6)]
    start = time.perf_counter()
    trainer_updates(step, batches)
    consumed = len(batches) / (time.perf_counter() - start)
    return {
        "batches_per_s": round(produced, 1),
        "model_batches_per_s": round(consumed, 2),
        "reader_over_model": round(produced / consumed, 1),
    }


def folder_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.iterdir()) / 2**20


def measure(folder: Path, pairs: int, workers: int, baseline: Path | None) -> dict[str, float]:
    config = write_config(folder, pairs, "new")
    cache = folder / "cache"
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    prepare = [*ATTN_MT, "prepare", "--config", str(config), "--workers", str(workers)]
    seconds, prepare_rss = run(prepare, ROOT, cache)
    again, _ = run(prepare, ROOT, cache)
    # the cache holds this one prepared folder (beside it, the lock its builds take)
    shards = next(path for path in (cache / "prepared").iterdir() if path.is_dir())
    src = Path(yaml.safe_load(config.read_text())["data"]["train"]["src"])
    row = {
        "pairs": pairs,
        "text_mib": round(2 * src.stat().st_size / 2**20),  # both sides, about
        "prepare_s": round(seconds, 1),
        "prepare_sent_per_s": round(pairs / seconds),
        "prepare_peak_rss_mib": round(prepare_rss),
        "shards_mib": round(folder_mib(shards)),
        "up_to_date_check_s": round(again, 2),
        **first_update(config, ROOT, cache),
        **batch_speed(config, cache),
    }
    if baseline is not None:
        old = write_config(folder, pairs, "old")
        base_cache = folder / "cache-old"
        first_update(old, baseline, base_cache)  # trains SentencePiece once; then measured warm
        measured = first_update(old, baseline, base_cache)
        row |= {f"baseline_{key}": value for key, value in measured.items()}
    return row


def main(argv: list[str] | None = None) -> None:
    """Parse the options, measure each size, print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES)
    parser.add_argument("--largest", action="store_true", help=f"also {LARGEST:,} pairs")
    parser.add_argument("--workers", type=int, default=0, help="prepare --workers (0 = all)")
    parser.add_argument("--baseline-src", type=Path, help="a checkout of the old code")
    parser.add_argument("--dir", type=Path, help="work folder (default: a temp folder)")
    args = parser.parse_args(argv)
    sizes = args.sizes + ([LARGEST] if args.largest else [])
    folder = args.dir or Path(tempfile.mkdtemp(prefix="bench-data-"))
    folder.mkdir(parents=True, exist_ok=True)
    rows = [measure(folder, pairs, args.workers, args.baseline_src) for pairs in sizes]
    keys = list(rows[0])
    print(f"{cpu_name()}, {os.cpu_count()} cores")
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(f"{row[key]:,}" for key in keys))
    print(json.dumps({"machine": platform.machine(), "cores": os.cpu_count(), "rows": rows}))
