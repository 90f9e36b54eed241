"""Decoding on a busy machine: `translate` (and `serve`) beside 0, 1, 2... competing CPU-bound
processes (`python -c 'while 1: pass'`), against CTranslate2 under the same load, each row's
time over its own time on the idle machine, beside the slowdown the lost CPU share alone
explains.

    python scripts/bench_busy.py --model runs/multi30k_de_en [--loads 0,1,2] [--rounds 2]
    python scripts/bench_busy.py --model runs/multi30k_de_en --serve   # the server's rows too
    python scripts/bench_busy.py --model runs/multi30k_de_en --train   # training's rows too

Rows, each timed in a fresh process of its own (the OpenMP runtime reads its environment once):

attn-mt passive   `attn_mt.translate_file` with a loaded translator (what `attn-mt translate`
                  runs), in the environment the `attn-mt` command sets (`attn_mt/cpuenv.py`:
                  OpenMP threads that sleep at barriers where the machine is busy as the row
                  starts, libgomp's spinning wait where it is idle)
attn-mt spin      the same with OMP_WAIT_POLICY unset: libgomp's own spinning wait, as a
                  run started on the idle machine keeps (its threads sized before each batch)
attn-mt 1 thread  passive on one thread: no barrier at all (only where --threads > 1)
CTranslate2       the `attn-mt export` folder, one `translate_batch` (bench_decode's engine),
                  as its users run it (no OpenMP setting of ours)

With --train, two rows time the Trainer's update of the default config (`bench_train`'s turn:
8 Multi30k batches of its train.batch_tokens, after 8 to warm up, its precision as a run takes
it) instead of a translation: "train passive" with OMP_WAIT_POLICY=PASSIVE, "train spin" with
libgomp's spinning wait, as a run started on the idle machine keeps it.

SentencePiece is inside the timing, the model's load and a warm-up outside. At each load the
competitors start, run a second alone, then every row runs in turn (rounds interleave the
loads, so a drift of the machine touches every row alike). With --serve, two servers, started
on the idle machine, each answer `bench_serve.py --url` clients (a sentence a request) at every
load: "serve" as the command sets itself up (libgomp's spinning wait, since the machine was
idle, and its threads sized to the free cores before each batch), "serve spin" with
GOMP_SPINCOUNT=300000 (libgomp's default count, set explicitly). A table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRY = ROOT / "scripts" / "bench_busy.py"  # a row's own process runs it with --row
SERVE_ENTRY = ROOT / "scripts" / "bench_serve.py"
SPINNER = "while 1: pass"
SETTLE_S = 1.0  # competitors run alone this long before a row starts
SPIN_COUNT = "300000"  # libgomp's spin count where OMP_WAIT_POLICY is unset


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A trained run folder or .pt checkpoint.")
    parser.add_argument("--src", help="Source sentences, one a line (default: the test split).")
    parser.add_argument("--limit", type=int, default=200, help="Sentences translated a row.")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--loads", default="0,1,2", help="Competing processes, comma-separated.")
    parser.add_argument("--rounds", type=int, default=1, help="Passes over every load and row.")
    parser.add_argument("--serve", action="store_true", help="Also time `attn-mt serve`.")
    parser.add_argument("--train", action="store_true", help="Also time training updates.")
    parser.add_argument("--clients", type=int, default=8, help="--serve: concurrent clients.")
    parser.add_argument("--seconds", type=float, default=10, help="--serve: measured time.")
    parser.add_argument("--row", help=argparse.SUPPRESS)  # internal: run one row (JSON)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """The rows at every load (or, with --row, one row in this process), then the report."""
    args = parse_args(argv)
    if args.row:
        return child_main(json.loads(args.row))
    loads = [int(k) for k in args.loads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        lines, ct2 = prepare(args, Path(tmp))
        shared = {"model": args.model, "lines": str(lines), "beam": args.beam, "ct2": str(ct2)}
        shared["out"] = str(Path(tmp) / "out.txt")
        rows = {
            "attn-mt passive": {"engine": "attn-mt", "policy": "passive", "threads": args.threads},
            "attn-mt spin": {"engine": "attn-mt", "policy": "spin", "threads": args.threads},
            "attn-mt 1 thread": {"engine": "attn-mt", "policy": "passive", "threads": 1},
            "CTranslate2": {"engine": "ct2", "policy": "theirs", "threads": args.threads},
        }
        if args.threads == 1:
            del rows["attn-mt 1 thread"]
        if args.train:
            for policy in ("passive", "spin"):
                rows[f"train {policy}"] = {"engine": "train", "policy": policy}
                rows[f"train {policy}"]["threads"] = args.threads
        times: dict[str, dict[int, list[float]]] = {name: {k: [] for k in loads} for name in rows}
        for _ in range(args.rounds):
            for load in loads:
                with competitors(load):
                    for name, row in rows.items():
                        times[name][load].append(in_child({"name": name, **row, **shared}))
                        print(f"load {load}: {name} {times[name][load][-1]:.2f} s", file=sys.stderr)
        served = serve_rows(args, loads) if args.serve else {}
    report(args, loads, times, served)


def prepare(args: argparse.Namespace, folder: Path) -> tuple[Path, Path]:
    """The sentences as a file and the CTranslate2 export (done first, on the machine as it is)."""
    import attn_mt
    from attn_mt.export.ct2 import export_ctranslate2
    from bench.decode import load_sentences

    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        sys.exit("bench_busy: this benchmark needs ctranslate2: pip install 'attn-mt[ct2]'")
    translator = attn_mt.load(args.model, device="cpu")
    chosen = argparse.Namespace(src=args.src, ref=None, limit=args.limit, quick=False)
    sentences, _ = load_sentences(chosen, translator)
    lines = folder / "lines.txt"
    lines.write_text("".join(line + "\n" for line in sentences), encoding="utf-8")
    export = export_ctranslate2(args.model, folder / "ct2", quantization="none")
    return lines, Path(export)


@contextmanager
def competitors(count: int) -> Iterator[None]:
    """`count` CPU-bound processes running for the block's time."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPINNER]) for _ in range(count)]
    try:
        time.sleep(SETTLE_S if count else 0)
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def in_child(spec: dict) -> float:
    """Run one row in a fresh Python process (the entry script with --row): its seconds."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)  # the row's policy is its own
    env.pop("GOMP_SPINCOUNT", None)
    command = [sys.executable, str(ENTRY), "--model", spec["model"], "--row", json.dumps(spec)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"bench_busy: the {spec['name']} row failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])["seconds"]


def child_main(spec: dict) -> None:
    """One row: the environment first (before torch loads), then the engine, a warm-up and the
    timed translation; prints {"seconds": S}."""
    if spec["engine"] in ("attn-mt", "train"):
        from attn_mt.cpuenv import set_cpu_environment

        set_cpu_environment()  # as the `attn-mt` command sets it, reading the machine's load
        if spec["policy"] == "spin":
            os.environ.pop("OMP_WAIT_POLICY", None)
        if spec["policy"] == "passive":
            os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    import torch

    torch.set_num_threads(spec["threads"])
    if spec["engine"] == "train":
        return train_row()
    lines = Path(spec["lines"])
    warm = lines.with_name(f"warm.{os.getpid()}.txt")
    warm.write_text("".join(lines.read_text(encoding="utf-8").splitlines(True)[:8]))
    translate = attn_mt_engine(spec) if spec["engine"] == "attn-mt" else ct2_engine(spec)
    translate(warm)
    start = time.perf_counter()
    translate(lines)
    print(json.dumps({"seconds": time.perf_counter() - start}))


def train_row() -> None:
    """The Trainer's update of the default config over 8 Multi30k batches, after 8 to warm up;
    prints {"seconds": S, "tokens": N}."""
    import functools

    import torch

    from attn_mt.config.file import load_config
    from attn_mt.model.transformer import build_model
    from attn_mt.precision import resolve_precision
    from bench.common import timed_window
    from bench.steps import trainer_step, trainer_updates
    from bench.train import multi30k_batches

    cfg = load_config(ROOT / "configs" / "multi30k_de_en.yaml")
    device = torch.device("cpu")
    warm, timed, _, (src_vocab, vocab) = multi30k_batches(cfg, 8, device)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg, src_vocab, vocab).train()
    precision = resolve_precision(cfg.train.precision, device)
    turn = functools.partial(trainer_updates, trainer_step(model, cfg.train, precision))
    turn(warm)
    seconds, tokens = timed_window(functools.partial(turn, timed), device)
    print(json.dumps({"seconds": seconds, "tokens": tokens}))


def attn_mt_engine(spec: dict):
    """`path` -> its translation into spec["out"], as `attn-mt translate` makes it."""
    import attn_mt

    translator = attn_mt.load(spec["model"], device="cpu")

    def translate(path: Path) -> None:
        Path(spec["out"]).unlink(missing_ok=True)
        attn_mt.translate_file(translator, path, spec["out"], beam=spec["beam"])

    return translate


def ct2_engine(spec: dict):
    """`path` -> its translation by CTranslate2 (bench_decode's engine: one translate_batch)."""
    from bench.decode import Row, ctranslate2_engine

    row = Row("CTranslate2", spec["beam"], "float32")
    engine = ctranslate2_engine(Path(spec["ct2"]), row, spec["threads"])

    def translate(path: Path) -> None:
        engine(path.read_text(encoding="utf-8").splitlines())

    return translate


def serve_rows(args: argparse.Namespace, loads: list[int]) -> dict[str, dict[int, float]]:
    """Sentences/s of the command's own server and a spinning one at each load."""
    served: dict[str, dict[int, float]] = {}
    for name, extra in (("serve", {}), ("serve spin", {"GOMP_SPINCOUNT": SPIN_COUNT})):
        with server(args.model, extra) as url:
            served[name] = {}
            for load in loads:
                with competitors(load):
                    served[name][load] = clients(url, args)
                print(f"load {load}: {name} {served[name][load]:.1f} sentences/s", file=sys.stderr)
    return served


def clients(url: str, args: argparse.Namespace) -> float:
    """Sentences/s of the server at `url` under bench_serve's clients, a sentence a request."""
    command = [sys.executable, str(SERVE_ENTRY), "--url", url, "--clients", str(args.clients)]
    command += ["--seconds", str(args.seconds), "--warmup", "2", "--paragraph", "1"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])["passes"]["batched"]["sentences_per_s"]


@contextmanager
def server(model: str, extra: dict[str, str]) -> Iterator[str]:
    """`attn-mt serve` on a free port of 127.0.0.1 with `extra` in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | extra
    command = [sys.executable, "-m", "attn_mt", "serve", "--model", model]
    command += ["--host", "127.0.0.1", "--port", "0", "--device", "cpu"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(command, stderr=log, env=env)
        try:
            while proc.poll() is None:
                log.seek(0)
                if found := re.search(rb"serving on (http://\S+) ", log.read()):
                    break
                time.sleep(0.1)
            else:
                log.seek(0)
                sys.exit(f"bench_busy: serve exited {proc.returncode}: {log.read().decode()}")
            yield found.group(1).decode()
        finally:
            proc.terminate()
            proc.wait(60)


def ideal(load: int, threads: int, cores: int) -> float:
    """The slowdown the CPU share lost alone explains: `threads` busy threads beside `load`
    others on `cores` cores get cores / (threads + load) of a core each, if that is under 1."""
    return max(1.0, (threads + load) / cores)


def report(args, loads, times, served) -> None:
    """Seconds per row and load, each over the row's idle time, the ideal beside them; the
    servers' sentences/s likewise; one JSON line."""
    from bench.common import cpu_name

    cores, base = len(os.sched_getaffinity(0)), loads[0]
    print(f"{cpu_name()}, {cores} cores; {args.threads} thread(s), beam {args.beam}, "
          f"{args.limit} sentences; medians of {args.rounds} round(s)")  # fmt: skip
    print(f"{'row':<18}" + "".join(f"{f'{k} busy':>18}" for k in loads))
    figures: dict[str, dict[str, dict[str, float]]] = {}
    for name, by_load in times.items():
        medians = {k: statistics.median(v) for k, v in by_load.items()}
        figures[name] = {
            str(k): {"seconds": round(s, 3), "ratio": round(s / medians[base], 2)}
            for k, s in medians.items()
        }
        cells = [f"{s:.2f} s ({s / medians[base]:.1f}x)" for s in medians.values()]
        print(f"{name:<18}" + "".join(f"{cell:>18}" for cell in cells))
    for name, rates in served.items():
        figures[name] = {
            str(k): {"sentences_per_s": round(v, 1), "ratio": round(rates[base] / v, 2)}
            for k, v in rates.items()
        }
        cells = [f"{v:.1f}/s ({rates[base] / v:.1f}x)" for v in rates.values()]
        print(f"{name:<18}" + "".join(f"{cell:>18}" for cell in cells))
    share = {k: ideal(k, args.threads, cores) / ideal(base, args.threads, cores) for k in loads}
    print(f"{'CPU share lost':<18}" + "".join(f"{f'{v:.1f}x':>18}" for v in share.values()))
    setting = {"threads": args.threads, "beam": args.beam, "sentences": args.limit}
    setting |= {"rounds": args.rounds, "model": args.model, "cpu": cpu_name(), "cores": cores}
    lost = {str(k): round(v, 2) for k, v in share.items()}
    print(json.dumps({"bench": "busy", **setting, "rows": figures, "cpu_share_lost": lost}))
