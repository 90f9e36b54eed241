"""The first-GPU-run checks that run attn-mt or a benchmark in a process of their own (the
others are in bench/checks.py): `attn-mt train` runs in each precision, an exact resume, NCCL
under torchrun, train.compile auto at base size, and the benchmarks through their entry
scripts (`scripts/bench_train.py`, `profile_step.py`, `bench_kernels.py`), each given what is
left of the budget; a benchmark stopped by it keeps the rows it printed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from attn_mt.checkpoint import load_checkpoint
from attn_mt.model.loss import PROJECTION_CHUNK_GPU
from attn_mt.precision import has_inductor_setting
from bench.checks import BASE, CONFIGS, CheckFailed, Context, Figures, metrics
from bench.common import ROOT
from bench.train_wmt import loss_ratios


def attn_mt(*args: str, timeout: float, torchrun: bool = False) -> subprocess.CompletedProcess:
    """`attn-mt ARGS` (or under a one-process torchrun) in a subprocess; output captured."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    command = [sys.executable, *(launcher if torchrun else []), "-m", "attn_mt", *args]
    proc = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=max(timeout, 1)
    )
    if proc.returncode != 0:
        raise CheckFailed(f"`{' '.join(args[:3])}` exited {proc.returncode}: {proc.stderr[-400:]}")
    return proc


def train(ctx: Context, name: str, config: str, *sets: str, resume: bool = False, **kw):
    """`attn-mt train` of a shipped config into OUT/runs/NAME on the GPU."""
    out = ctx.out / "runs" / name
    args = ["train", "--config", str(CONFIGS / config), "--device", "cuda"]
    args += ["--set", f"train.out_dir={out}", *[a for s in sets for a in ("--set", s)]]
    attn_mt(*args, *(["--resume"] if resume else []), timeout=ctx.seconds_left(), **kw)
    return out


def deterministic_resume(ctx: Context) -> Figures:
    """tiny.yaml with train.deterministic: 20 updates straight == 10 + resume to 20, bit for bit;
    and whether a second straight run without it differs."""
    sets = ("train.deterministic=true", "train.max_steps=20", "train.eval_every=10")
    straight = train(ctx, "det-straight", "tiny.yaml", *sets)
    train(ctx, "det-resumed", "tiny.yaml", *sets[:1], "train.max_steps=10", "train.eval_every=10")
    resumed = train(ctx, "det-resumed", "tiny.yaml", *sets, resume=True)
    loose = train(ctx, "nondet", "tiny.yaml", "train.max_steps=20", "train.eval_every=10")
    a, b, c = (
        load_checkpoint(r / "checkpoints" / "last.pt")["model"] for r in (straight, resumed, loose)
    )
    unequal = [name for name in a if not torch.equal(a[name], b[name])]
    if unequal:
        raise CheckFailed(f"resumed != straight with train.deterministic: {unequal[:3]}")
    differ = sum(not torch.equal(a[name], c[name]) for name in a)
    return {"resume bit-exact": True, "tensors that differ without deterministic": differ}


def short_run(precision: str) -> Callable[[Context], Figures]:
    def run(ctx: Context) -> Figures:
        start = time.monotonic()
        sets = (f"train.precision={precision}", "train.max_steps=600", "train.eval_every=600")
        out = train(ctx, f"multi30k-{precision}", "multi30k_de_en_gpu.yaml", *sets)
        last = metrics(out, "valid")[-1]
        trained = metrics(out, "train")
        if not all(map(lambda m: m["loss"] == m["loss"], trained)):
            raise CheckFailed(f"{precision}: a NaN training loss")
        figures: Figures = {k: last[k] for k in ("step", "loss", "bleu") if k in last}
        # train.log's last validation line ends with its seconds by phase.
        log = (out / "train.log").read_text()
        timings = re.findall(r"valid step .*BLEU .*\(best[^)]*\)\s+(.+)$", log, flags=re.M)
        figures["last validation"] = timings[-1] if timings else "no timing in train.log"
        return figures | {"minutes": (time.monotonic() - start) / 60}

    return run


def one_process_all_reduce(backend: str, device: torch.device) -> Figures:
    """A process group of `backend` with this process alone (world size 1), one all_reduce of
    a tensor on `device`, then the group destroyed."""
    import torch.distributed as dist

    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        values = torch.arange(4.0, device=device)
        dist.all_reduce(values)  # one rank: the sum is the tensor itself
        if not torch.equal(values.cpu(), torch.arange(4.0)):
            raise CheckFailed(f"{backend} all_reduce over one rank gave {values.tolist()}")
        return {"backend": dist.get_backend(), "all_reduce": "equal"}
    finally:
        dist.destroy_process_group()


def nccl_one_process(ctx: Context) -> Figures:
    """NCCL started for real (a one-rank group and an all_reduce on the GPU), then `attn-mt
    train` under a one-process torchrun (which needs no process group, so starts no NCCL)."""
    figures = one_process_all_reduce("nccl", ctx.device)
    figures["nccl version"] = str(torch.cuda.nccl.version())
    out = train(ctx, "nccl", "tiny.yaml", "train.max_steps=10", torchrun=True)
    log = (out / "train.log").read_text()
    if "1 process(es)" not in log:
        raise CheckFailed("the torchrun run did not log one process")
    return figures | {"torchrun steps": metrics(out, "train")[-1]["step"]}


def bench(size: str) -> Callable[[Context], Figures]:
    def run(ctx: Context) -> Figures:
        script = ROOT / "scripts" / "bench_train.py"
        args = [sys.executable, str(script), "--device", "cuda", "--quick", "--size", size]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=ctx.seconds_left())
        if proc.returncode != 0:
            raise CheckFailed(f"bench_train.py exited {proc.returncode}: {proc.stderr[-400:]}")
        (ctx.out / f"bench_train_{size}.txt").write_text(proc.stdout)
        figures = json.loads(proc.stdout.strip().splitlines()[-1])
        return {
            f"{row['precision']} {model}": {
                k: row[model][k] for k in ("tokens_per_s", "mfu", "mfu_spec")
            }
            for row in figures["results"]
            for model in ("attn-mt", "nn.Transformer")
        }

    return run


WMT_BENCH = ("--device", "cuda", "--size", "base", "--vocab", "32000", "--batch-tokens",
             "25000", "--precisions", "bf16", "--pairs", "500000", "--rounds", "2",
             "--batches", "20")  # fmt: skip
WMT_TURNS = {  # one process each: a budget that stops one keeps the rows of those before
    "eager": ("--compile", "off", "--loss", "both"),
    "compiled logits": ("--compile", "on", "--loss", "logits"),
    "compiled projected": ("--compile", "on", "--loss", "projected"),
}


def bench_turns(
    ctx: Context, turns: dict[str, list[str]], prefix: str = "bench_train"
) -> tuple[list[dict], dict[str, str]]:
    """Each turn's command (a scripts/*.py run) in turn with what is left of the budget: the
    `result` rows they printed, a turn the budget stopped keeping the rows it printed before,
    and each turn's outcome ("done", or why not). A turn that fails is a failed check. Each
    turn's output is kept as `prefix`_TURN.txt."""
    rows: list[dict] = []
    outcome: dict[str, str] = {}
    for name, command in turns.items():
        if ctx.seconds_left() <= 0:
            outcome[name] = "not run: out of time (--minutes)"
            continue
        try:
            proc = subprocess.run(command, capture_output=True, text=True,
                                  timeout=ctx.seconds_left())  # fmt: skip
            text, outcome[name] = proc.stdout, "done"
            if proc.returncode != 0:
                raise CheckFailed(f"{name}: exited {proc.returncode}: {proc.stderr[-400:]}")
        except subprocess.TimeoutExpired as error:  # what it printed so far still counts
            printed = error.stdout or ""
            text = printed.decode(errors="replace") if isinstance(printed, bytes) else printed
            outcome[name] = f"stopped after {error.timeout:.0f} s, what was left of --minutes"
        (ctx.out / f"{prefix}_{name.replace(' ', '_')}.txt").write_text(text)
        rows += [json.loads(line[len("result ") :]) for line in text.splitlines()
                 if line.startswith("result {")]  # fmt: skip
    return rows, outcome


def wmt_base_bench(ctx: Context) -> Figures:
    """bench_train at transformer-base over a 32k vocabulary on WMT-shaped batches of 25,000
    tokens, bf16: the full logits and projected_loss, eager, then each torch.compile'd (tokens/s,
    ms/step, peak MiB, MFU of the data sheet, the compile's warm-up seconds and graphs), and
    the speed ratios of compiled to eager and projected to logits."""
    script = str(ROOT / "scripts" / "bench_train.py")
    turns = {name: [sys.executable, script, *WMT_BENCH, *more] for name, more in WMT_TURNS.items()}
    results, outcome = bench_turns(ctx, turns)
    keys = ("tokens_per_s", "step_ms", "peak_mib", "warmup_s", "graphs", "mfu_spec")
    mode = {True: "compiled", False: "eager"}
    figures: Figures = {
        f"{r['batch_tokens']} {r['loss']} {mode[r['compiled']]} {r['shapes']}": {
            k: r.get(k) for k in keys
        }
        for r in results
    }
    figures["projected/logits"] = loss_ratios(results, "loss", "logits", "projected")
    figures["compiled/eager"] = loss_ratios(results, "compiled", False, True)
    return figures | {"turns": outcome}


def step_profile(ctx: Context) -> Figures:
    """profile_step.py --mode compiled: transformer-base over a 32k vocabulary on 25,000-token
    WMT-shaped batches, bf16, the trainer's loss: ms/step, tokens/s, MFU of the data sheet,
    how far the host ran ahead of the device, and the profiled kernels' milliseconds per
    update by kind; in the same process the loss in 4x smaller chunks (more calls from the
    host), which keeps the default's choice checked; then a turn for each of INDUCTOR_TURNS'
    settings this torch has. Its tables and traces go to `--out`/profile_step/."""
    turns = {"compiled": ["--projection-chunk", str(PROJECTION_CHUNK_GPU // 4)]}
    for name, pair in INDUCTOR_TURNS.items():
        if has_inductor_setting(pair.partition("=")[0]):
            turns[name] = ["--inductor", pair]
    return profile_turns(ctx, turns, "profile_step")


def compiled_reference(ctx: Context) -> Figures:
    """profile_step.py --compiled-reference --reference-only: `nn.Transformer` through
    torch.compile on the step profile's batches, its full-logits loss in the same graph; attn-mt
    is not compiled and timed again (its rows are the step profile's). Its files go to
    `--out`/profile_reference/."""
    turn = {"compiled reference": ["--compiled-reference", "--reference-only"]}
    return profile_turns(ctx, turn, "profile_reference", profile_steps=1)


# Inductor settings, a step profile turn each over the trainer's (what each measured:
# docs/gpu.md): mix-order reductions, Inductor's own default, keep the trainer's choice
# checked; the C++ wrapper launches a graph's kernels from C++ instead of Python.
INDUCTOR_TURNS = {"mix-order reductions": "triton.mix_order_reduction=1",
                  "C++ wrapper": "cpp_wrapper=1"}  # fmt: skip


def profile_turns(
    ctx: Context, turns: dict[str, list[str]], folder: str, profile_steps: int = 5
) -> Figures:
    """profile_step.py --mode compiled at the WMT shape, once a turn with the turn's options:
    its rows by name, and each turn's outcome (`bench_turns`)."""
    script = str(ROOT / "scripts" / "profile_step.py")
    command = [sys.executable, script, "--device", "cuda", "--mode", "compiled",
               "--profile-steps", str(profile_steps), "--out", str(ctx.out / folder)]  # fmt: skip
    runs = {name: [*command, *options] for name, options in turns.items()}
    rows, outcome = bench_turns(ctx, runs, prefix=folder)
    return {row.pop("row"): row for row in rows} | {"turns": outcome}


def kernel_bench(ctx: Context) -> Figures:
    """bench_kernels.py: flash against memory-efficient attention at WMT lengths, then the
    layer-norm backward kernels of pre-norm blocks eager and compiled four ways; each part in
    its own process, so the budget stopping the second keeps the first."""
    script = str(ROOT / "scripts" / "bench_kernels.py")
    turns = {part: [sys.executable, script, "--only", part] for part in ("attention", "layernorm")}
    rows, outcome = bench_turns(ctx, turns, prefix="bench_kernels")
    return {row.pop("name"): row for row in rows} | {"turns": outcome}


def train_log_figures(log: str) -> Figures:
    """From a train.log: the train.compile line (the choice and, for auto, ms/update each way),
    each validation's seconds by phase, and where the run's time went (its closing timesheet:
    start-up, updates, validation, checkpoints, each with its share)."""
    chosen = re.findall(r"train\.compile \S+: .*$", log, flags=re.M)
    phases = re.findall(r"^\S+ \S+ (valid step \d+).*?\s{2}([\d.]+ s: .+)$", log, flags=re.M)
    sheet = re.findall(r"time in this process (.+)$", log, flags=re.M)
    return {
        "compile": chosen[-1] if chosen else "no train.compile line",
        **dict(phases),
        "time": sheet[-1] if sheet else "no timesheet line",
    }


def auto_compile_run(ctx: Context) -> Figures:
    """`attn-mt train` on Multi30k at transformer-base size with train.compile auto: what it
    chose and the ms/update it measured each way, validation's seconds by phase, the run's
    timesheet, and the share of the command's wall time that validation took."""
    start = time.monotonic()
    sets = (*BASE, "train.compile=auto", "train.max_steps=400", "train.eval_every=200",
            "train.valid_max_sentences=500")  # fmt: skip
    out = train(ctx, "base-compile-auto", "multi30k_de_en_gpu.yaml", *sets)
    wall = time.monotonic() - start
    figures = train_log_figures((out / "train.log").read_text())
    validated = sum(float(v.split(" s:")[0]) for k, v in figures.items() if k.startswith("valid"))
    return figures | {"wall s": wall, "validation share of wall": validated / wall}
