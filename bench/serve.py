"""Throughput and latency of `attn-mt serve` under concurrent clients, batching on and off,
a sentence or a paragraph a request; the memory of a server of one model and of two.

    python scripts/bench_serve.py --model runs/multi30k_de_en [--clients 32] [--seconds 20]
    python scripts/bench_serve.py --url http://127.0.0.1:8000          # a server already up
    python scripts/bench_serve.py --model runs/multi30k_de_en --soak 10   # 10 minutes, checked
    python scripts/bench_serve.py --model runs/multi30k_de_en --memory runs/multi30k_en_de

With --model it starts two servers in turn on 127.0.0.1 (free ports): one batching across
requests (--max-wait-ms, --max-batch-tokens as given), one serving requests one at a time
(--max-wait-ms 0 --max-batch-tokens 1). Each gets --clients threads that send one sentence a
request (Multi30k test sentences, or --src FILE) for --seconds, after --warmup seconds; the
batching server then gets the same clients sending paragraphs of --paragraph sentences (one
request each, split by the server) for as long. Prints a table, then one JSON line of the
figures. Only 127.0.0.1 is ever contacted.

--memory SECOND measures instead the server's resident memory once warm with --model alone and
with --model and SECOND (two models of other pairs, routed by pair), beside the size of each
checkpoint file.

--soak MINUTES runs the batching server alone for that long under the same clients, each
request holding 1-3 sentences: every reply must hold one line per sentence, each equal to what
the server first answered for that sentence (nothing lost, reordered or mixed up between
requests), and the server's resident memory is read every minute (it should stay flat).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]  # bench.common's, without its torch: a light client


def main(argv: list[str] | None = None) -> None:
    """Parse the options, run the passes, print the table and the JSON line."""
    args = _parser().parse_args(argv)
    if args.search_alone_child:
        _search_alone(args)
        return
    sentences = _sentences(args.src)
    passes = {}
    if args.memory:
        _memory(args)
        return
    if args.soak:
        with _server(args.model, ["--max-wait-ms", str(args.max_wait_ms)] + args.serve_arg) as url:
            _soak(url, sentences, args, _server.pid)
        return
    if args.url:  # a server up already (e.g. one being profiled): its own settings
        passes["batched"] = _measure(args.url, sentences, args)
        if args.paragraph > 1:
            passes["paragraphs"] = _measure(args.url, sentences, args, args.paragraph)
    else:
        batching = ["--max-wait-ms", str(args.max_wait_ms)]
        if args.max_batch_tokens:
            batching += ["--max-batch-tokens", str(args.max_batch_tokens)]
        with _server(args.model, batching + args.serve_arg) as url:
            passes["batched"] = _measure(url, sentences, args)
            if args.paragraph > 1:
                passes["paragraphs"] = _measure(url, sentences, args, args.paragraph)
        one_at_a_time = ["--max-wait-ms", "0", "--max-batch-tokens", "1"]
        with _server(args.model, one_at_a_time + args.serve_arg) as url:
            passes["one at a time"] = _measure(url, sentences, args)
    alone = _search_alone_rates(args) if args.search_alone and args.model else None
    _print(passes, args, alone)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="Run folder or .pt to serve (starts the servers).")
    parser.add_argument("--url", help="A running server on 127.0.0.1 instead of --model.")
    parser.add_argument("--clients", type=int, default=32, help="Concurrent clients.")
    parser.add_argument("--seconds", type=float, default=20, help="Measured time per pass.")
    parser.add_argument("--warmup", type=float, default=3, help="Unmeasured time first.")
    parser.add_argument("--src", type=Path, help="Sentences, one a line (default Multi30k).")
    parser.add_argument("--max-wait-ms", type=float, default=10)
    parser.add_argument("--max-batch-tokens", type=int, default=None)
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="More `serve` options (repeatable)."
    )
    parser.add_argument("--soak", type=float, default=0, help="Minutes of checked load.")
    parser.add_argument(
        "--paragraph", type=int, default=5, help="Sentences a paragraph request (1: none)."
    )
    parser.add_argument("--memory", metavar="SECOND", help="Measure memory with a 2nd model.")
    parser.add_argument(
        "--search-alone",
        action="store_true",
        help="Also time the library's search alone on batches of the passes' sizes.",
    )
    parser.add_argument("--search-alone-child", action="store_true", help=argparse.SUPPRESS)
    return parser


def _search_alone_rates(args: argparse.Namespace) -> dict[str, float]:
    """--search-alone: what the passes could reach, timed in a process of its own (this one
    stays a light client without torch): {lines a batch: sentences/s}."""
    command = [sys.executable, str(ROOT / "scripts" / "bench_serve.py"), "--search-alone-child"]
    command += ["--model", args.model, "--clients", str(args.clients)]
    command += ["--paragraph", str(args.paragraph)] + (["--src", str(args.src)] if args.src else [])
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def _search_alone(args: argparse.Namespace) -> None:
    """The child of --search-alone: the model loaded as `attn-mt serve` loads it (the command's
    CPU environment, its decode settings), then the test sentences in a fixed random order, cut
    into batches of --clients lines (what a sentence a request can gather) and of --clients x
    --paragraph lines (paragraphs), each batch searched as one as the server's worker searches
    it, on this process's one computing thread; prints one JSON line of sentences/s."""
    import random
    from dataclasses import replace

    from attn_mt.cpuenv import set_cpu_environment

    set_cpu_environment()  # before torch loads, as the command does
    import attn_mt
    from attn_mt.decode.request import Request

    translator = attn_mt.load(args.model)
    request = translator.resolve(Request())
    request = replace(request, batch_tokens=10**6)  # each batch searched as one
    sentences = _sentences(args.src)
    random.Random(1).shuffle(sentences)
    translator.translate_nbest(sentences[:20], request)  # warm
    rates = {}
    for size in sorted({args.clients, args.clients * args.paragraph}):
        lines = sentences[: max(size, len(sentences) // size * size)]
        start = time.perf_counter()
        for first in range(0, len(lines), size):
            translator.translate_nbest(lines[first : first + size], request)
        rates[str(size)] = round(len(lines) / (time.perf_counter() - start), 1)
    print(json.dumps(rates))


def _sentences(path: Path | None) -> list[str]:
    """Test sentences: --src, or Multi30k's German test set from $ATTN_MT_DATA."""
    if path is None:
        data = Path(os.environ.get("ATTN_MT_DATA", ROOT.parent / "shared" / "data"))
        path = data / "multi30k" / "test_2016_flickr.de.gz"
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.strip() for line in handle if line.strip()]


class _server:
    """`attn-mt serve --model MODEL EXTRA` on a free port of 127.0.0.1, stopped by SIGTERM."""

    pid = 0  # the latest server's process id

    def __init__(self, model: str | list[str], extra: list[str]):
        models = [model] if isinstance(model, str) else model
        self.command = [sys.executable, "-m", "attn_mt", "serve"]
        self.command += [f"--model={path}" for path in models]
        self.command += ["--host", "127.0.0.1", "--port", "0", *extra]

    def __enter__(self) -> str:
        self.log = open(f"/tmp/bench_serve.{os.getpid()}.log", "w+b")  # noqa: SIM115
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(self.command, stderr=self.log, env=env)
        _server.pid = self.proc.pid
        while self.proc.poll() is None:
            self.log.seek(0)
            if found := re.search(rb"serving on (http://\S+) ", self.log.read()):
                return found.group(1).decode()
            time.sleep(0.1)
        self.log.seek(0)
        raise SystemExit(f"serve exited {self.proc.returncode}: {self.log.read().decode()}")

    def __exit__(self, *_exc) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.log.close()


def _measure(
    url: str, sentences: list[str], args: argparse.Namespace, per_request: int = 1
) -> dict[str, float]:
    """Run the clients, each request `per_request` sentences as one paragraph; requests/s,
    sentences/s and latency percentiles of the measured part."""
    host, port = _local(url)
    start = time.monotonic()
    measure_from, stop_at = start + args.warmup, start + args.warmup + args.seconds
    latencies: list[list[float]] = [[] for _ in range(args.clients)]
    errors = [0]

    def client(number: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=120)
        i = number
        while (now := time.monotonic()) < stop_at:
            paragraph = " ".join(sentences[(i + k) % len(sentences)] for k in range(per_request))
            body = json.dumps({"text": [paragraph]})
            conn.request("POST", "/v1/translate", body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            reply.read()
            errors[0] += reply.status != 200
            if now >= measure_from:
                latencies[number].append(time.monotonic() - now)
            i += args.clients * per_request

    threads = [threading.Thread(target=client, args=(n,)) for n in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = sorted(t for per_client in latencies for t in per_client)
    cuts = statistics.quantiles(done, n=100) if len(done) > 1 else done * 99
    return {
        "sentences_per_request": per_request,
        "requests_per_s": len(done) / args.seconds,
        "sentences_per_s": len(done) * per_request / args.seconds,
        "p50_ms": 1000 * cuts[49],
        "p99_ms": 1000 * cuts[98],
        "errors": errors[0],
    }


def _local(url: str) -> tuple[str, int]:
    """The host and port of a server on this machine (anything else is refused)."""
    target = urlparse(url)
    if target.hostname not in ("127.0.0.1", "localhost") or target.port is None:
        raise SystemExit(f"{url}: this benchmark talks to 127.0.0.1 only")
    return target.hostname, target.port


def _soak(url: str, sentences: list[str], args: argparse.Namespace, pid: int) -> None:
    """--soak: checked load for args.soak minutes, the server's RSS read every minute."""
    host, port = _local(url)
    stop_at = time.monotonic() + 60 * args.soak
    first: dict[str, str] = {}  # sentence -> the first translation the server gave it
    counts = {"requests": 0, "lines": 0, "errors": 0, "lost": 0, "changed": 0}
    lock = threading.Lock()

    def client(number: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=120)
        i = number
        while time.monotonic() < stop_at:
            lines = [sentences[(i + k) % len(sentences)] for k in range(1 + i % 3)]
            body = json.dumps({"text": lines})
            conn.request("POST", "/v1/translate", body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            data = reply.read()
            with lock:
                counts["requests"] += 1
                if reply.status != 200:
                    counts["errors"] += 1
                    continue
                got = json.loads(data)["translations"]
                counts["lost"] += len(got) != len(lines)
                for line, text in zip(lines, got, strict=False):
                    counts["lines"] += 1
                    counts["changed"] += first.setdefault(line, text) != text
            i += args.clients

    threads = [threading.Thread(target=client, args=(n,)) for n in range(args.clients)]
    for thread in threads:
        thread.start()
    rss = []
    while any(t.is_alive() for t in threads):
        rss.append(_rss_mib(pid))
        print(f"minute {len(rss) - 1}: server RSS {rss[-1]:.0f} MiB, {counts}", flush=True)
        minute_end = time.monotonic() + 60
        while time.monotonic() < minute_end and any(t.is_alive() for t in threads):
            time.sleep(1)
    rss.append(_rss_mib(pid))
    print(f"soak {args.soak:g} min, {args.clients} clients: {counts}; RSS MiB {rss}")
    figures = {"soak_minutes": args.soak, "clients": args.clients, **counts, "rss_mib": rss}
    print(json.dumps(figures))


def _rss_mib(pid: int) -> float:
    """The resident memory of process `pid` in MiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _print(
    passes: dict[str, dict[str, float]],
    args: argparse.Namespace,
    alone: dict[str, float] | None = None,
) -> None:
    """The table, then one JSON line."""
    print(f"{args.clients} clients, {args.seconds:g} s measured a pass")
    header = f"{'serving':<15}{'sent/req':>9}{'req/s':>9}{'sent/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
    print(f"{header}{'errors':>8}")
    for name, f in passes.items():
        print(
            f"{name:<15}{f['sentences_per_request']:>9.0f}{f['requests_per_s']:>9.1f}"
            f"{f['sentences_per_s']:>9.1f}{f['p50_ms']:>9.0f}{f['p99_ms']:>9.0f}{f['errors']:>8.0f}"
        )
    figures: dict[str, object] = {"clients": args.clients, "passes": passes}
    if "batched" in passes and "one at a time" in passes:
        speedup = passes["batched"]["sentences_per_s"] / passes["one at a time"]["sentences_per_s"]
        print(f"batching: {speedup:.1f}x the sentences/s of one-at-a-time serving")
        figures["speedup"] = round(speedup, 2)
    if "batched" in passes and "paragraphs" in passes:
        gain = passes["paragraphs"]["sentences_per_s"] / passes["batched"]["sentences_per_s"]
        print(f"paragraphs: {gain:.1f}x the sentences/s of a sentence a request")
        figures["paragraph_gain"] = round(gain, 2)
    if alone:
        said = ", ".join(f"{rate:.1f} sent/s in batches of {size}" for size, rate in alone.items())
        print(f"the search alone (no server): {said}")
        figures["search_alone"] = alone
    print(json.dumps(figures))


def _memory(args: argparse.Namespace) -> None:
    """--memory: the warm server's resident memory with --model alone, then with --model and
    --memory, beside the checkpoint files' sizes; one JSON line of the figures."""
    files = [_checkpoint_mib(path) for path in (args.model, args.memory)]
    rss = []
    for models in ([args.model], [args.model, args.memory]):
        with _server(models, args.serve_arg) as url:
            _warm(url)
            rss.append(_rss_mib(_server.pid))
    bound = 1.1 * (rss[0] + files[1])  # one process and its model, plus the second's weights
    print(f"checkpoints: {files[0]:.0f} MiB and {files[1]:.0f} MiB")
    print(f"server RSS, warm: one model {rss[0]:.0f} MiB, two models {rss[1]:.0f} MiB")
    print(f"two models: {rss[1] / (rss[0] + files[1]):.2f}x one model's process plus the second")
    figures = {"checkpoint_mib": files, "rss_mib": rss, "bound_mib": round(bound, 1)}
    print(json.dumps(figures))


def _warm(url: str) -> None:
    """A few requests on every pair the server answers, so every model has decoded."""
    host, port = _local(url)
    conn = http.client.HTTPConnection(host, port, timeout=120)
    conn.request("GET", "/languages")
    languages = json.loads(conn.getresponse().read())
    for lang in languages:
        for target in lang["targets"]:
            body = {"text": ["Ein Mann fährt Fahrrad. A man rides a bike."] * 8}
            body |= {"src_lang": lang["code"], "tgt_lang": target}
            conn.request(
                "POST", "/v1/translate", json.dumps(body), {"Content-Type": "application/json"}
            )
            conn.getresponse().read()


def _checkpoint_mib(path: str) -> float:
    """The size of the checkpoint a run folder or .pt file stands for, in MiB."""
    found = Path(path)
    if found.is_dir():
        found = found / "checkpoints" / "best.pt"
    return found.stat().st_size / 2**20
